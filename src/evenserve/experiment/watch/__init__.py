"""The watch loop (``evenserve tune --watch URL --every 5m``): tune on the recent traffic, apply
a change only when the simulator predicts it better by a margin, roll it back when live P99
says otherwise.

Theory of operation. Every window (``--every``) the loop pulls the gateway's request log of
the window just ended (``GET /admin/log``) and the parameters in force (``GET /admin/params``),
and takes one of these steps; at most one change (an apply or a rollback) per window:

1. **Evaluate a pending change**: one the loop applied at the start of the window just
   ended, or one anybody else applied (a version the loop did not know: judged on the
   requests that arrived after its ``applied_unix_s`` when they span half a window or more,
   else over the next window). The simulator replays those same arrivals under the new
   parameters and under the previous ones; the live P99 is compared with both, each
   multiplied by the calibration (below). The change is rolled back
   (``POST /admin/params/rollback`` to the previous version) when

   - live P99 > (1 + ``rollback_over``) x calibrated prediction of the new parameters (the
     loop's own change: the issue's guardrail, 15 % by default), or
   - live P99 > (1 + ``rollback_over``) x calibrated prediction of the previous parameters
     on the same traffic (any change: it made things worse than not changing would have).

   Otherwise it is kept. Either way nothing else changes in that window.
2. **Otherwise tune.** The calibration is updated: live P99 / simulated P99 of the parameters
   in force, on the same window (the live path costs what the simulator leaves out: HTTP
   hops, a busy host), clamped to [0.5, 4]. The tuner searches from the parameters in force
   on the window's arrivals; the best candidate is pushed (``PUT /admin/params`` with the
   expected version) only if its predicted P99 is at least ``margin`` (10 %) below the
   current parameters' predicted P99 on the same arrivals, with predicted goodput no lower
   than the current's x (1 - ``goodput_tolerance``). Each window's search first tries the
   best sets of the last three windows (``SimPredictor.elite``): a small
   budget a window adds up to a longer search across windows.

No oscillation: a change needs a margin to be applied and is judged over a whole window
after it; a rolled-back parameter set is not applied again for ``cooldown_windows`` windows;
a window with fewer than ``min_requests`` answered requests decides nothing.

The rules (``WatchPolicy``) are pure: the gateway and the simulator come in through the
``WatchClient`` and ``Predictor`` protocols, so tests drive them with fakes.

The package: ``rules`` (the pure rules, ``WatchPolicy``, the protocols they see the gateway
and the simulator through, and ``run_watch``, the loop on an injected clock), ``gateway``
(``HttpWatchClient``: the live gateway's admin API behind ``WatchClient``) and
``simulator`` (``SimPredictor``: the simulator on a scenario's placement behind
``Predictor``).
"""

from evenserve.experiment.watch.gateway import HttpWatchClient
from evenserve.experiment.watch.rules import (
    Figures,
    Params,
    Pending,
    Predictor,
    Record,
    WatchClient,
    WatchEvent,
    WatchPolicy,
    live_figures,
    run_watch,
)
from evenserve.experiment.watch.simulator import SimPredictor, records_trace

__all__ = [
    "Figures",
    "HttpWatchClient",
    "Params",
    "Pending",
    "Predictor",
    "Record",
    "SimPredictor",
    "WatchClient",
    "WatchEvent",
    "WatchPolicy",
    "live_figures",
    "records_trace",
    "run_watch",
]
