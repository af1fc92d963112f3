"""Per-decision cost of the routing policies on the simulator's own router traffic.

For each policy: simulate ``bench/sim_speed.py``'s scenario (64 A10-class devices, open-loop
ResNet-50 and BERT-base at about 70 % of capacity; ``--requests`` arrivals) once, recording
every call the simulator makes on its Router (load reports, sends, answers, decisions) with
its arguments; then replay that sequence on a copy of the router as it was before the run,
``--repeats`` times. The replay checks that every decision names the backend the simulation
got (the decisions depend only on the calls), and times:

- ``all``: every router call (decisions, sends, answers, load reports: all the router's
  bookkeeping, the finish index's upkeep included), process CPU seconds / decisions;
- ``choose``: the decisions alone (``Router.choose``, each between two perf_counter reads),
  seconds / decisions.

Each figure is the least over the repeats (CPU time of a busy host inflates the others),
less the least of the same loop over a router that does nothing (the replay's own cost), in
microseconds per decision; the last line compares each policy with power-of-two. As in the
simulation, what exists before a replay's loop (the recorded calls, the router's copy) is out
of the cyclic collector's sight while it runs (``sim.cluster.setup_out_of_collectors_sight``):
its full collections would otherwise walk the whole recording, at times that depend on how
many objects each policy makes.

    python bench/routing_decisions.py [--requests N] [--devices D] [--repeats R]
                                      [--routing NAME ...]
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

from evenserve.policy.routing import Router
from evenserve.sim.cluster import Simulation, setup_out_of_collectors_sight
from evenserve.sim.loader import parse_scenario
from sim_speed import ROOT, scenario

CALLS = ("observe", "sent", "done", "choose", "expire", "refusal", "set_models", "set_healthy")


def record(requests: int, devices: int, routing: str) -> tuple[Router, list[tuple[Any, ...]]]:
    """The router before the run (a copy) and the calls the run made on it, in order."""
    _, raw = scenario(requests, devices, routing, "fixed-window", 1)
    sim = Simulation(parse_scenario(raw, ROOT, "bench"), "bench")
    assert sim.router is not None and len(sim.routers) == 1
    start = copy.deepcopy(sim.router)
    calls: list[tuple[Any, ...]] = []
    originals = {name: getattr(Router, name) for name in CALLS}

    def recorder(name: str) -> Any:
        fn = originals[name]

        def rec(self: Router, *a: Any, **k: Any) -> Any:
            out = fn(self, *a, **k)
            calls.append((name, a, k, out.name if name == "choose" and out else None))
            return out

        return rec

    for name in CALLS:
        setattr(Router, name, recorder(name))
    try:
        sim.run()
    finally:
        for name, fn in originals.items():
            setattr(Router, name, fn)
    return start, calls


class _Stub:
    """A router that does nothing: what the replay loop itself costs."""

    def __getattr__(self, name: str) -> Any:
        return _nothing


def _nothing(*a: Any, **k: Any) -> None:
    return None


def replay(start: Router | None, calls: list[tuple[Any, ...]], timed: bool) -> tuple[float, int]:
    """Seconds (process CPU for every call; ``timed``: perf_counter around decisions only)
    and decisions that differ from the recorded ones; ``start`` None: the same loop on a
    router that does nothing (its own cost, to subtract)."""
    router: Any = _Stub() if start is None else copy.deepcopy(start)
    fns = [getattr(router, name) for name in CALLS]
    ops = [(CALLS.index(name), a, k) for name, a, k, _ in calls]
    wants = [want for name, _, _, want in calls if name == "choose"]
    choose_i = CALLS.index("choose")
    clock = time.perf_counter
    picks = []
    with setup_out_of_collectors_sight():  # as the simulation runs its event loop
        if timed:
            choose = fns[choose_i]
            spent = 0.0
            for i, a, k in ops:
                if i == choose_i:
                    t0 = clock()
                    got = choose(*a, **k)
                    spent += clock() - t0
                    picks.append(got)
                else:
                    fns[i](*a, **k)
        else:
            t0 = time.process_time()
            for i, a, k in ops:
                out = fns[i](*a, **k)
                if i == choose_i:
                    picks.append(out)
            spent = time.process_time() - t0
    if start is None:
        return spent, 0
    wrong = sum((got.name if got else None) != want for got, want in zip(picks, wants, strict=True))
    return spent, wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--routing",
        nargs="+",
        default=["power-of-two", "least-expected-work", "queue-aware"],
    )
    args = ap.parse_args()
    print(f"devices: {args.devices}, requests: {args.requests}, repeats: {args.repeats}")
    runs = {r: record(args.requests, args.devices, r) for r in args.routing}
    inf = float("inf")
    best = {r: [inf, inf, inf, inf] for r in runs}  # all, choose, loop, timed loop
    for _ in range(args.repeats):  # the policies in turn, so that a noisy spell hits all
        for routing, (start, calls) in runs.items():
            s_all, wrong_all = replay(start, calls, timed=False)
            s_choose, wrong_choose = replay(start, calls, timed=True)
            assert wrong_all == wrong_choose == 0, f"{routing}: replayed decisions differ"
            b = best[routing]
            b[0] = min(b[0], s_all)
            b[1] = min(b[1], s_choose)
            b[2] = min(b[2], replay(None, calls, timed=False)[0])
            b[3] = min(b[3], replay(None, calls, timed=True)[0])
    per: dict[str, tuple[float, float]] = {}
    for routing, (_, calls) in runs.items():
        decisions = sum(1 for c in calls if c[0] == "choose")
        b = best[routing]
        per[routing] = (1e6 * (b[0] - b[2]) / decisions, 1e6 * (b[1] - b[3]) / decisions)
        print(
            f"{routing}: {decisions:,} decisions, {len(calls):,} router calls; per decision: "
            f"all {per[routing][0]:.2f} us, choose {per[routing][1]:.2f} us"
        )
    base = per.get("power-of-two")
    if base is not None:
        print(
            "vs power-of-two: "
            + ", ".join(
                f"{r} all {a / base[0]:.2f}x, choose {c / base[1]:.2f}x"
                for r, (a, c) in per.items()
                if r != "power-of-two"
            )
        )


if __name__ == "__main__":
    main()
