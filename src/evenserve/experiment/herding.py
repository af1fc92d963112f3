"""Several gateways in front of the same devices (design 0013): the arms to compare and the
herding figure.

Herding: within one report interval, N routers that each count only their own sends pick
the same backend (the one that looked idlest at the last report), so it takes N times what
any of them meant to send it. The figure: sends are cut into windows (100 ms by default);
in a window, a backend's share is its sends over its fair part, the window's sends of the
model divided by the model's hosts (1.0: exactly its part; hosts: it took everything). A
window counts when it holds at least ``min_sends`` sends of the model per host (a burst,
not a trickle where one request is a whole share). ``peak`` is the largest share over
backends and counted windows; ``p99``/``mean`` summarise each window's largest share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evenserve.core.results import RunRecords
from evenserve.sim.loader import LoadedScenario


@dataclass(frozen=True)
class Herding:
    windows: int
    peak: float
    p99: float
    mean: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "windows": self.windows,
            "peak": round(self.peak, 3),
            "p99": round(self.p99, 3),
            "mean": round(self.mean, 3),
        }


def window_shares(
    sent_s: Sequence[float],
    backend: Sequence[str],
    model: Sequence[str],
    hosts: Mapping[str, Sequence[str]],
    *,
    window_s: float = 0.1,
    since_s: float = 0.0,
    min_sends: float = 2.0,
) -> list[float]:
    """Each counted window's largest share (module docstring), over the sends given as
    parallel columns (when, to which backend, of which model); a send to a backend that is
    not a host of its model (or to none: "") is left out."""
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for t, b, m in zip(sent_s, backend, model, strict=True):
        if t < since_s or not b or b not in hosts.get(m, ()):
            continue
        per = counts.setdefault((m, int((t - since_s) // window_s)), {})
        per[b] = per.get(b, 0) + 1
    shares = []
    for (m, _w), per in sorted(counts.items()):
        n_hosts = len(hosts[m])
        total = sum(per.values())
        if n_hosts < 2 or total < min_sends * n_hosts:
            continue
        shares.append(max(per.values()) / (total / n_hosts))
    return shares


def herding(shares: Sequence[float]) -> Herding:
    if not shares:
        return Herding(0, math.nan, math.nan, math.nan)
    a = np.asarray(shares, dtype=float)
    return Herding(len(a), float(a.max()), float(np.percentile(a, 99)), float(a.mean()))


def run_herding(rec: RunRecords, hosts: Mapping[str, Sequence[str]], **kw: float) -> Herding:
    """The herding figure of a simulated run: each answered request was sent at its arrival
    (the simulator routes at once) to the device that answered it."""
    log = rec.requests
    return herding(
        window_shares(log.arrival_s, log.device, log.model, hosts, since_s=rec.warmup_s, **kw)
    )


def model_hosts(loaded: LoadedScenario, arm: str) -> dict[str, list[str]]:
    """Per model, the devices of ``arm`` that host it (active ones)."""
    sc = loaded.scenario
    out: dict[str, list[str]] = {m: [] for m in sc.models}
    for d in sc.arm_devices(arm):
        if d.active:
            for m in d.models:
                out[m].append(d.name)
    return out


def with_gateways(
    loaded: LoadedScenario,
    arm: str,
    gateways: int,
    replicas: int | None = None,
    offsets_ms: Sequence[float] | None = None,
) -> LoadedScenario:
    """``loaded`` with ``arm`` run behind ``gateways`` gateways whose routers assume
    ``replicas`` (None: the real count; 1 with several: the naive routers)."""
    sc = loaded.scenario
    spec = sc.arms[arm].model_copy(
        update={
            "gateways": gateways,
            "gateway_replicas": replicas,
            "gateway_offsets_ms": None if offsets_ms is None else list(offsets_ms),
        }
    )
    arms = dict(sc.arms)
    arms[arm] = spec
    return LoadedScenario(
        scenario=sc.model_copy(update={"arms": arms}),
        base_dir=loaded.base_dir,
        profile_sets=loaded.profile_sets,
    )
