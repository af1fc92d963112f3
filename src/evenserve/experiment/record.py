"""``evenserve record``: pull a running gateway's request log into one replayable trace.

Every ``interval_s`` it asks ``GET /admin/log?since_seq=S`` for the records after the last
sequence number it has (so a pull never repeats or skips one that was still in the window),
puts each back on the recorder's clock (the line's ``t_s`` plus the answer's
``x-evenserve-log-origin-s``), and at the end writes them sorted by arrival, ``t_s`` from the
first record, each line otherwise as the gateway served it (``seq``, outcomes, ``unix_s``).
The admin token goes in the Authorization header only; no message here names it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from evenserve.core import wire
from evenserve.core.errors import EvenserveError

#: Records asked for per pull (the rest comes with the next one, at once).
PULL_LIMIT = 50_000


class PullError(EvenserveError):
    pass


@dataclass
class PullResult:
    records: int
    pulls: int
    failed_pulls: int
    out: Path


class LogPuller:
    """The records pulled so far, deduplicated by ``seq``, on the recorder's clock."""

    def __init__(self, client: httpx.Client, url: str, token: str) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self._auth = {"authorization": f"Bearer {token}"}
        self.last_seq = 0
        self.records: dict[int, dict[str, Any]] = {}
        self.pulls = 0
        self.failed = 0

    def pull(self) -> int:
        """Fetch everything after ``last_seq`` (several requests when it is long); how many
        new records. A refused token or a missing log raises PullError; a network error
        counts as a failed pull (the next one catches up)."""
        got = 0
        while True:
            self.pulls += 1
            try:
                r = self.client.get(
                    f"{self.url}/admin/log",
                    params={"since_seq": self.last_seq, "limit": PULL_LIMIT},
                    headers=self._auth,
                )
            except httpx.HTTPError as exc:
                self.failed += 1
                if got == 0 and self.pulls == 1:
                    raise PullError(f"{self.url}: {type(exc).__name__}: {exc}") from None
                return got
            if r.status_code == 401:
                raise PullError(f"{self.url}/admin/log: 401, the admin token was refused")
            if r.status_code != 200:
                raise PullError(f"{self.url}/admin/log: {r.status_code} {r.text[:200]}")
            origin = float(r.headers.get(wire.LOG_ORIGIN_HEADER, "0"))
            n = 0
            for text in r.text.splitlines():
                if not text.strip():
                    continue
                obj = json.loads(text)
                seq = int(obj["seq"])
                if seq not in self.records:
                    obj["t_s"] = float(obj["t_s"]) + origin
                    self.records[seq] = obj
                    got += 1
                self.last_seq = max(self.last_seq, seq)
                n += 1
            if n < PULL_LIMIT:
                return got

    def write(self, out: Path) -> int:
        """The trace: records sorted by arrival, ``t_s`` from the first."""
        rows = sorted(self.records.values(), key=lambda o: (o["t_s"], o["seq"]))
        base = rows[0]["t_s"] if rows else 0.0
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as f:
            for o in rows:
                f.write(json.dumps({**o, "t_s": round(o["t_s"] - base, 6)}) + "\n")
        return len(rows)


def pull_log(
    url: str,
    token: str,
    out: Path,
    duration_s: float,
    *,
    interval_s: float = 1.0,
    client: httpx.Client | None = None,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> PullResult:
    """Pull ``url``'s request log every ``interval_s`` for ``duration_s``, then write ``out``."""
    own = client is None
    c = client or httpx.Client(timeout=30.0, trust_env=False)
    try:
        puller = LogPuller(c, url, token)
        end = now() + duration_s
        while True:
            puller.pull()
            left = end - now()
            if left <= 0:
                break
            sleep(min(interval_s, left))
        n = puller.write(out)
    finally:
        if own:
            c.close()
    return PullResult(n, puller.pulls, puller.failed, out)
