"""When the front door refuses work (429): overload that means overload.

Rule, for a request of model m and the healthy hosts H of m::

    refuse  <=>  H is not empty and every b in H is full or late
    full(b) <=>  fresh(b) and q_m(b) >= bound_m(b)
    late(b) <=>  fresh(b) and wait_m(b) > slo_m(b)

where q_m is the router's queue estimate for m, bound_m the queue bound the backend reports
for m, slo_m the SLO it reports for m and wait_m the predicted work ahead of the request
(``work.predicted_wait_s``: aged busy time plus the queued batches, from the latency
profiles). A host without fresh signals, without a reported SLO or bound, or without a
profile for a queued model is neither full nor late: no evidence, no refusal. So a queue of
5 on a device that empties 8 in one batch is not overload; a soft-overload judgement of a
routing policy (queue-aware's) only steers, it never refuses.

A full queue is judged without the request's class: the worker can make room for a higher
class by shedding a lower one, which the gateway cannot see, so the rule may refuse a
high-class request that every host would have taken by shedding (only when every host is
full or late). Pure: no I/O, no clock; ``now_s`` is the driver's.

A host's "can take it" (no verdict) holds at every later time while nothing it is judged by
changes: fullness does not depend on the time, and the predicted wait only falls as its
sampled busy time ages (floating-point subtraction and addition are monotone). So the
Router keeps, per model, the first host that could take a request and when, and answers
None from it until that host's evidence or the hosts change or the clock goes back
(``Router.refusal``); the verdicts are the same as this rule's at every call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from evenserve.core.types import BackendView
from evenserve.policy.routing.work import predicted_wait_s


def host_verdict(
    model: str, b: BackendView, now_s: float, queued: Mapping[str, float] | None = None
) -> str | None:
    """Why ``b`` cannot take a request of ``model`` in time ("queue full 64/64", "predicted
    wait 312 ms > SLO 200 ms"), or None when it can or there is no evidence either way.
    ``queued``: the queues to judge by (default: the view's estimate)."""
    if not b.signals_fresh:
        return None
    if queued is None:
        queued = b.queued_by_model
    bound = b.max_queue.get(model)
    q = queued.get(model, 0.0)
    if bound is not None and q >= bound:
        return f"queue full {q:.0f}/{bound}"
    slo = b.slo_s.get(model)
    if slo is None:
        return None
    wait = predicted_wait_s(model, b, now_s, queued)
    if wait is None or wait <= slo:
        return None
    return f"predicted wait {wait * 1000.0:.0f} ms > SLO {slo * 1000.0:g} ms"


def refusal(
    model: str,
    hosts: Sequence[BackendView],
    now_s: float,
    queued: Sequence[Mapping[str, float]] | None = None,
) -> str | None:
    """The reason to refuse a request of ``model`` now (every host full or late: each named
    with its verdict), or None to route it. ``queued``: per host, the queues to judge by
    (the Router passes what each host reported, without its own sends)."""
    return first_taker(model, hosts, now_s, queued)[1]


def first_taker(
    model: str,
    hosts: Sequence[BackendView],
    now_s: float,
    queued: Sequence[Mapping[str, float]] | None = None,
) -> tuple[int, str | None]:
    """``refusal`` and why: (the position of the first host without a verdict, None), or
    (-1, the reason to refuse); (-1, None) without hosts."""
    if not hosts:
        return -1, None
    verdicts = []
    for i, b in enumerate(hosts):
        why = host_verdict(model, b, now_s, None if queued is None else queued[i])
        if why is None:
            return i, None
        verdicts.append(f"{b.name}: {why}")
    return -1, f"every host of {model!r} is full or late ({'; '.join(verdicts)})"
