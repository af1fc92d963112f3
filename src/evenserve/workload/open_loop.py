"""Open-loop streams: Poisson per stream, lazily for the simulator, merged for live runs.

A scenario's open-loop workload is a list of streams: one per ``rates_rps`` entry (sorted by
model, the workload's phases, the model's class and deadline), then one per ``streams`` item
(its own rate, class, deadline and phases, or the workload's phases). A stream with rate 0
sends nothing but keeps its index, so the names (and seeds) of the others do not move.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from evenserve.core.scenario import OpenLoop, Phase
from evenserve.workload.arrival import Arrival
from evenserve.workload.mix import mix_rates
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng


@dataclass(frozen=True, slots=True)
class OpenStream:
    """One Poisson stream: its seed name, model, rate, class, deadline and rate phases."""

    name: str
    model: str
    rate_rps: float
    priority: int | None = None
    deadline_ms: float | None = None
    phases: tuple[Phase, ...] = ()

    def process(self, seed: int) -> PoissonProcess:
        """This stream's arrival process for a run seeded ``seed`` (``{seed}:arrivals:{name}``)."""
        return PoissonProcess(self.rate_rps, self.phases, arrivals_rng(seed, self.name))


def open_loop_streams(wl: OpenLoop) -> list[OpenStream]:
    """The workload's streams that send anything (rate > 0), named as the simulator seeds them."""
    out: list[OpenStream] = []
    phases = tuple(wl.phases)
    for m in sorted(wl.rates_rps):
        out.append(OpenStream(m, m, wl.rates_rps[m], phases=phases))
    for i, st in enumerate(wl.streams, start=len(wl.rates_rps)):
        out.append(
            OpenStream(
                f"{st.model}:{i}",
                st.model,
                st.rate_rps,
                st.priority_value(),
                st.deadline_ms,
                phases if st.phases is None else tuple(st.phases),
            )
        )
    return [s for s in out if s.rate_rps > 0]


def mix_streams(rate_rps: float, mix: Mapping[str, float]) -> list[OpenStream]:
    """``rate_rps`` split over the mix: the streams of ``rates_rps = {m: rate * w / sum(w)}``."""
    return open_loop_streams(OpenLoop(type="open-loop", rates_rps=mix_rates(rate_rps, mix)))


def stream_arrivals(stream: OpenStream, seed: int, end_s: float) -> Iterator[Arrival]:
    """One stream's arrivals in ``[0, end_s)``, one at a time."""
    proc = stream.process(seed)
    model, priority, deadline_ms = stream.model, stream.priority, stream.deadline_ms
    t = proc.next_after(0.0)
    while t < end_s:
        yield Arrival(t, model, priority, deadline_ms)
        t = proc.next_after(t)


def iter_arrivals(streams: Sequence[OpenStream], seed: int, end_s: float) -> Iterator[Arrival]:
    """All streams' arrivals in ``[0, end_s)`` in time order (ties: the earlier stream first)."""
    return heapq.merge(*(stream_arrivals(s, seed, end_s) for s in streams), key=attrgetter("t_s"))


def open_loop_arrivals(
    streams: OpenLoop | Sequence[OpenStream],
    seed: int,
    duration_s: float,
    max_requests: int | None = None,
) -> list[Arrival]:
    """The merged arrivals of a workload's streams over ``[0, duration_s)``, at most
    ``max_requests`` of them (the earliest): the very arrivals the simulator makes."""
    if isinstance(streams, OpenLoop):
        streams = open_loop_streams(streams)
    merged = iter_arrivals(streams, seed, duration_s)
    return list(merged if max_requests is None else itertools.islice(merged, max_requests))


def with_default_deadlines(
    arrivals: Iterable[Arrival], deadline_ms: Mapping[str, float | None]
) -> list[Arrival]:
    """Arrivals whose missing deadline is their model's (``deadline_ms[model]``, may be None)."""
    return [
        a
        if a.deadline_ms is not None or deadline_ms.get(a.model) is None
        else Arrival(a.t_s, a.model, a.priority, deadline_ms[a.model])
        for a in arrivals
    ]
