"""The live gateway behind ``WatchClient``: its ``/admin/params`` (read, push, roll back),
``/admin/log`` and ``/admin/backends`` (the learned profile scales), the token in the
header only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from evenserve.core.errors import EvenserveError
from evenserve.experiment.watch.rules import Params, Record
from evenserve.httpio.params_client import get_params, push_params, rollback_params


class HttpWatchClient:
    """A gateway's ``/admin/params`` and ``/admin/log`` (the token in the header only)."""

    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def get_params(self) -> dict[str, Any]:
        return get_params(self.url, self._token, timeout_s=self.timeout_s)

    def put_params(self, params: Params, expected_version: int, note: str) -> dict[str, Any]:
        return push_params(
            self.url, self._token, params, expected_version, note, timeout_s=self.timeout_s
        )

    def rollback(self, to_version: int, expected_version: int, note: str) -> dict[str, Any]:
        return rollback_params(
            self.url, self._token, to_version, expected_version, note, timeout_s=self.timeout_s
        )

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        try:
            r = httpx.get(
                f"{self.url}{path}",
                params=params,
                headers={"authorization": f"Bearer {self._token}"},
                timeout=self.timeout_s,
                trust_env=False,
            )
        except httpx.HTTPError as exc:
            raise EvenserveError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise EvenserveError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        return r

    def pull_log(self, since_unix_s: float) -> list[Record]:
        r = self._get("/admin/log", {"since_unix_s": repr(since_unix_s)})
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def learned_scales(self) -> dict[str, dict[str, float]]:
        return {
            b["name"]: {m: float(x) for m, x in b.get("profile_scale", {}).items() if x}
            for b in self._get("/admin/backends").json()["backends"]
        }
