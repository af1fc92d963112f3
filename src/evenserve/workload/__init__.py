"""Arrivals for the simulator, the load generator and the benches: one module, one record.

- :class:`Arrival` (``arrival``): one request to send, when (seconds from the start), to which
  model, in which priority class and with which deadline (``None``: the model's own).
- Open loop (``open_loop``, ``poisson``): per-stream Poisson processes with piecewise-constant
  rate phases. The simulator pulls one stream's arrivals lazily (``OpenStream.process`` and
  ``PoissonProcess.next_after``); live runs take the merged, pre-generated list
  (``open_loop_arrivals``), bounded by a request cap.
- Closed loop (``closed_loop``): :class:`ClosedLoopUsers` draws think times and, at each
  arrival, the model from the mix.
- Traces (``trace``): JSON Lines files, read and written here, replayed by the load generator.
- Mixes (``mix``): ``--mix`` text, and an open-loop rate split over a mix.

Seeding convention (``seeding``): every random stream is a ``random.Random`` seeded by a
string built from the run's seed and the stream's name, so adding a stream never moves the
draws of another: ``{seed}:arrivals:{stream}`` for each open-loop stream (``stream`` is the
model for ``rates_rps`` entries, ``{model}:{i}`` for ``streams[j]`` at index ``i`` of the
combined list), ``{seed}:workload`` for the simulator's closed-loop users (one generator for
all of them: think time when a user starts thinking, the mix draw when its request arrives)
and ``{seed}:user:{u}`` for user ``u`` of the live load generator's closed loop (one each, so
a user's draws do not depend on when the others' answers come back).
"""

from __future__ import annotations

from evenserve.workload.arrival import Arrival
from evenserve.workload.closed_loop import ClosedLoopUsers
from evenserve.workload.mix import mix_rates, parse_mix
from evenserve.workload.open_loop import (
    OpenStream,
    iter_arrivals,
    mix_streams,
    open_loop_arrivals,
    open_loop_streams,
    stream_arrivals,
    with_default_deadlines,
)
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng, user_rng, workload_rng
from evenserve.workload.trace import read_trace, replay, write_trace

__all__ = [
    "Arrival",
    "ClosedLoopUsers",
    "OpenStream",
    "PoissonProcess",
    "arrivals_rng",
    "iter_arrivals",
    "mix_rates",
    "mix_streams",
    "open_loop_arrivals",
    "open_loop_streams",
    "parse_mix",
    "read_trace",
    "replay",
    "stream_arrivals",
    "user_rng",
    "with_default_deadlines",
    "workload_rng",
    "write_trace",
]
