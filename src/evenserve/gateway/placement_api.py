"""The gateway's placement endpoints (``/admin/placement``, ``/admin/scale``): what placement
holds, what the launcher is asked to do, and the launcher's reports. 404 without placement."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from evenserve.gateway.device_scaling import parse_scale_report
from evenserve.gateway.placement import PlacementDriver
from evenserve.httpio.server import Request, Response, json_bytes, json_response

Endpoint = Callable[[Request], Awaitable[Response]]


class HasPlacement(Protocol):
    placement: PlacementDriver | None


def _error(status: int, message: str) -> Response:
    return json_response(json.dumps({"error": message}).encode(), status)


def _json(obj: object) -> Response:
    return json_response(json_bytes(obj))


class PlacementAPI:
    """The endpoints over ``host``'s placement driver (read at each request)."""

    def __init__(self, host: HasPlacement) -> None:
        self.host = host

    def routes(self, guard: Callable[[Endpoint], Endpoint]) -> Mapping[tuple[str, str], Endpoint]:
        return {
            ("GET", "/admin/placement"): guard(self.placement_view),
            ("GET", "/admin/scale"): guard(self.scale_view),
            ("POST", "/admin/scale"): guard(self.scale_report),
        }

    async def placement_view(self, request: Request) -> Response:
        if self.host.placement is None:
            return _error(404, "placement is off (no gateway.placement in the cluster file)")
        return _json(self.host.placement.view())

    async def scale_view(self, request: Request) -> Response:
        """What the launcher is asked to do: ``[{device, action: start | stop}]``."""
        if self.host.placement is None:
            return _error(404, "placement is off (no gateway.placement in the cluster file)")
        return _json({"requests": self.host.placement.scale_requests()})

    async def scale_report(self, request: Request) -> Response:
        """The launcher reports ``{"device": D, "event": "started" | "stopped"}``."""
        if self.host.placement is None:
            return _error(404, "placement is off (no gateway.placement in the cluster file)")
        try:
            dev, event = parse_scale_report(request.body)
            if dev not in self.host.placement.controller.devices:
                raise ValueError(f"device: no device {dev!r}")
            if event == "stopped":
                self.host.placement.stopped(dev)
        except ValueError as exc:
            return _error(400, str(exc))
        return _json({"device": dev, "event": event})
