"""The arrival code as it stood before the workload module, kept verbatim as the reference the
module must reproduce draw for draw: the live bench's merged open-loop streams (a copy of the
simulator's ``_start_open_loop`` seeding) and the simulator's closed-loop users."""

from __future__ import annotations

import random

from evenserve.core.scenario import ClosedLoop, OpenLoop, Phase
from evenserve.workload import PoissonProcess


def open_loop_reference(
    wl: OpenLoop, seed: int, duration_s: float
) -> list[tuple[float, str, int | None, float | None]]:
    streams: list[tuple[str, float, int | None, float | None, list[Phase]]] = [
        (m, wl.rates_rps[m], None, None, wl.phases) for m in sorted(wl.rates_rps)
    ]
    for st in wl.streams:
        phases = wl.phases if st.phases is None else st.phases
        streams.append((st.model, st.rate_rps, st.priority_value(), st.deadline_ms, phases))
    out: list[tuple[float, str, int | None, float | None]] = []
    for i, (m, rate, prio, dl, phases) in enumerate(streams):
        if rate <= 0:
            continue
        name = m if i < len(wl.rates_rps) else f"{m}:{i}"
        proc = PoissonProcess(rate, phases, random.Random(f"{seed}:arrivals:{name}"))
        t = proc.next_after(0.0)
        while t < duration_s:
            out.append((t, m, prio, dl))
            t = proc.next_after(t)
    out.sort(key=lambda a: a[0])
    return out


class ClosedLoopReference:
    """``Simulation._start_closed_loop``, ``_schedule_user`` and ``_user_arrival``'s draws."""

    def __init__(self, wl: ClosedLoop, seed: int) -> None:
        self.workload_rng = random.Random(f"{seed}:workload")
        self._mix_models: list[str] = []
        self._mix_cum: list[float] = []
        total = sum(wl.mix.values())
        acc = 0.0
        for m in sorted(wl.mix):
            if wl.mix[m] > 0:
                acc += wl.mix[m] / total
                self._mix_models.append(m)
                self._mix_cum.append(acc)
        self._mix_cum[-1] = 1.0
        self._think_s = wl.think_ms / 1000.0

    def think(self) -> float:
        rng = self.workload_rng
        return rng.expovariate(1.0 / self._think_s) if self._think_s > 0 else 0.0

    def model(self) -> str:
        x = self.workload_rng.random()
        models, cum = self._mix_models, self._mix_cum
        i = 0
        while cum[i] < x:
            i += 1
        return models[i]
