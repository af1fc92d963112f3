from __future__ import annotations

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BackendView, RequestInfo

GB = 1024.0**3


def view(
    name: str,
    *,
    q: float = 0.0,
    inflight: int = 0,
    util: float | None = 0.0,
    free_gb: float | None = 20.0,
    total_gb: float | None = 24.0,
    fresh: bool = True,
    queued: dict[str, float] | None = None,
    busy_remaining_s: float = 0.0,
    profiles: dict[str, LatencyProfile] | None = None,
    max_batch: dict[str, int] | None = None,
) -> BackendView:
    return BackendView(
        name=name,
        queue_depth=q,
        in_flight=inflight,
        utilization=util,
        memory_free_bytes=None if free_gb is None else free_gb * GB,
        memory_total_bytes=None if total_gb is None else total_gb * GB,
        signals_fresh=fresh,
        queued_by_model=queued or {},
        busy_remaining_s=busy_remaining_s,
        profiles=profiles or {},
        max_batch_size=max_batch or {},
    )


def req(model: str = "m", t: float = 0.0, rid: int = 1, priority: int = 10) -> RequestInfo:
    return RequestInfo(request_id=rid, model=model, arrival_s=t, priority=priority)
