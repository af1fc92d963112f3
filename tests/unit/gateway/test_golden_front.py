"""Golden test of the front door: one arrival trace, the same decisions live and simulated.

The gateway's dispatcher (FakeClock, a fake forwarder in front of toy devices) and the
simulator's front (``sim.front.SimFront``, in front of the same toy devices) both run the
front door's rules (``policy.routing.dispatch``) over a Router. For one trace with bounded
queues, a device that drains for a while, and load reports that make every host look full
at times, they must make the same decisions: each request's backends tried in order
(retries included) and its outcome (answered where, refused at the door as overloaded,
or a backend's refusal standing).

The toy devices stand where the worker's scheduler stands: each serves one request at a
time in order, holds at most ``BOUND`` waiting, refuses at the door with ``queue-full``
(the worker's 429) when full and ``draining`` (503) while it drains, and reports its load
every ``SAMPLE_S``. Both harnesses replay one event timeline in the same order
(completions, then load reports, then arrivals at equal times); a device's answer reaches
the router at its completion time, as the simulator's batch end and the worker's answer do.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.types import LoadSample
from evenserve.core.wire import OVERLOADED, PRIORITY_HEADER, REASON_HEADER, REFUSAL_STATUS
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.gateway.forwarder import Reply
from evenserve.metrics.gateway import GatewayMetrics
from evenserve.policy.routing import ROUTING, Router
from evenserve.sched import DRAINING, QUEUED
from evenserve.sim.device import SimRequest
from evenserve.sim.front import SimFront

MODELS = {"m": ("a", "b", "c"), "n": ("a", "b")}
SERVICE_S = {"m": 0.004, "n": 0.006}
BOUND = 2
SLO_S = 0.5
SAMPLE_S = 0.005
#: Device a drains (refuses everything, 503) in this window.
DRAINS = {"a": (0.050, 0.080)}
SEED = 0

#: Event kinds in their order at equal times.
COMPLETION, SAMPLE, ARRIVAL = 0, 1, 2


@dataclass
class ToyDevice:
    name: str
    busy_until: float = 0.0
    #: (start, finish, model) of each request taken and not finished.
    work: list[tuple[float, float, str]] = field(default_factory=list)

    def _retire(self, now: float) -> None:
        self.work = [w for w in self.work if w[1] > now]

    def waiting(self, now: float) -> dict[str, float]:
        self._retire(now)
        out: dict[str, float] = {}
        for start, _, m in self.work:
            if start > now:
                out[m] = out.get(m, 0.0) + 1.0
        return out

    def offer(self, model: str, now: float) -> tuple[str | None, float]:
        """(None, its finish) or (the refusal's reason, 0)."""
        lo, hi = DRAINS.get(self.name, (1.0, 0.0))
        if lo <= now < hi:
            return DRAINING, 0.0
        if sum(self.waiting(now).values()) >= BOUND:
            return "queue-full", 0.0
        start = max(now, self.busy_until)
        finish = start + SERVICE_S[model]
        self.busy_until = finish
        self.work.append((start, finish, model))
        return None, finish

    def sample(self, now: float, models: tuple[str, ...]) -> LoadSample:
        queued = self.waiting(now)
        return LoadSample(
            timestamp_s=now,
            queue_depth=sum(queued.values()),
            queued_by_model=queued,
            busy_remaining_s=max(0.0, self.busy_until - now),
            slo_s={m: SLO_S for m in models},
            max_queue={m: BOUND for m in models},
        )


def trace(n: int = 400) -> list[tuple[float, str, str | None]]:
    """Bursts of arrivals (mostly dense, sometimes a pause), two models, two classes."""
    rng = random.Random(7)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(1500.0) if rng.random() < 0.92 else rng.uniform(0.01, 0.03)
        model = "m" if rng.random() < 0.7 else "n"
        out.append((round(t, 9), model, "offline" if rng.random() < 0.3 else None))
    return out


def hosted_by(name: str) -> tuple[str, ...]:
    return tuple(m for m, hosts in MODELS.items() if name in hosts)


class Timeline:
    """The events both harnesses replay: arrivals, load reports, completions (pushed as
    devices take work), popped in time order, then by kind, then as pushed."""

    def __init__(self, arrivals: list[tuple[float, str, str | None]]) -> None:
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = itertools.count()
        for i, a in enumerate(arrivals):
            self.push(a[0], ARRIVAL, (i, *a))
        end = arrivals[-1][0] + 0.1
        t = 0.0
        while t < end:
            self.push(t, SAMPLE, None)
            t = round(t + SAMPLE_S, 9)

    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), payload))

    def pop(self) -> tuple[float, int, Any] | None:
        if not self.heap:
            return None
        t, kind, _, payload = heapq.heappop(self.heap)
        return t, kind, payload


Decisions = dict[int, tuple[list[str], tuple[str, ...]]]


def simulated(policy: str, arrivals: list[tuple[float, str, str | None]]) -> Decisions:
    """The simulator's front in front of the toy devices."""
    devices = {n: ToyDevice(n) for n in ("a", "b", "c")}
    router = Router(ROUTING.build(policy, random.Random(SEED)), window=1)
    for n in devices:
        router.add_backend(n, hosted_by(n))
    tl = Timeline(arrivals)
    tries: dict[int, list[str]] = {}
    outcome: dict[int, tuple[str, ...]] = {}

    def offer(name: str, r: SimRequest, now: float) -> str | None:
        tries.setdefault(r.idx, []).append(name)
        reason, finish = devices[name].offer(r.model, now)
        if reason is None:
            outcome[r.idx] = ("answered", name)
            tl.push(finish, COMPLETION, (name, r.model))
        return reason

    def drop(r: SimRequest, reason: str, device: str | None) -> None:
        outcome[r.idx] = ("overloaded",) if reason == OVERLOADED else ("refused", reason)
        if device is not None:
            router.done(device, r.model)

    front = SimFront([router], retries=1, refusals=True, models=MODELS, offer=offer, drop=drop)
    while (ev := tl.pop()) is not None:
        t, kind, payload = ev
        if kind == COMPLETION:
            name, model = payload
            router.done(name, model, 1, t)
        elif kind == SAMPLE:
            for n, d in devices.items():
                router.observe(n, d.sample(t, hosted_by(n)))
        else:
            i, _, model, prio = payload
            prio_value = 0 if prio == "offline" else 10
            front.route(SimRequest(i + 1, model, t, prio_value, None, 1, QUEUED, i, -1), 0, t)
    return {i: (tries.get(i, []), outcome[i]) for i in range(len(arrivals))}


class ToyForwarder:
    """The gateway's Forwarder contract in front of the toy devices: a refusal answers at
    once (429 ``queue-full``, 503 ``draining``, with the reason); a request taken is
    answered 200 when the timeline reaches its completion."""

    def __init__(self, clock: FakeClock, tl: Timeline, tries: dict[int, list[str]]) -> None:
        self.clock = clock
        self.tl = tl
        self.tries = tries
        self.devices = {n: ToyDevice(n) for n in ("a", "b", "c")}

    async def request(
        self, method: str, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        name = base_url.removeprefix("http://").split(".")[0]
        i = json.loads(body)["i"]
        self.tries.setdefault(i, []).append(name)
        model = path.split("/")[3]
        reason, finish = self.devices[name].offer(model, self.clock.now())
        if reason is not None:
            status = 503 if reason == DRAINING else REFUSAL_STATUS[reason]
            return Reply(status, {REASON_HEADER: reason}, b"{}")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tl.push(finish, COMPLETION, fut)
        await fut
        return Reply(200, {}, b"{}")

    async def aclose(self) -> None:
        pass


async def settle() -> None:
    """Let every task run up to its next wait (no real time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def live(policy: str, arrivals: list[tuple[float, str, str | None]]) -> Decisions:
    """The gateway's dispatcher (FakeClock) in front of the toy devices."""
    raw = {
        "gateway": {"routing": policy, "overload": {"enabled": True}, "signals": {"window": 1}},
        "backends": [
            {"name": n, "url": f"http://{n}.test:80", "models": list(hosted_by(n))}
            for n in ("a", "b", "c")
        ],
    }
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(0.0)
    reg = BackendRegistry.build(
        cluster.backends(),
        ROUTING.build(policy, random.Random(SEED)),
        clock,
        window=1,
        stale_after_s=1e9,
    )
    for n in ("a", "b", "c"):
        reg.admit(n)
    tl = Timeline(arrivals)
    tries: dict[int, list[str]] = {}
    fwd = ToyForwarder(clock, tl, tries)
    d = Dispatcher(reg, cluster.config.gateway, clock, GatewayMetrics(lambda: []), fwd)
    answers: dict[int, asyncio.Task[Any]] = {}
    while (ev := tl.pop()) is not None:
        t, kind, payload = ev
        clock.set(t)
        if kind == COMPLETION:
            payload.set_result(None)
        elif kind == SAMPLE:
            for n, dev in fwd.devices.items():
                reg.router.observe(n, dev.sample(t, hosted_by(n)))
        else:
            i, _, model, prio = payload
            headers = {} if prio is None else {PRIORITY_HEADER: prio}
            body = json.dumps({"i": i}).encode()
            answers[i] = asyncio.get_running_loop().create_task(
                d.infer(model, f"/v2/models/{model}/infer", body, headers)
            )
        await settle()
    out: Decisions = {}
    for i, task in answers.items():
        a = task.result()
        reason = a.header(REASON_HEADER)
        if a.status == 200:
            got: tuple[str, ...] = ("answered", a.backend)
        elif a.backend is None and reason == OVERLOADED:
            got = ("overloaded",)
        else:
            assert a.backend is not None and reason is not None, (a.status, a.body)
            got = ("refused", reason)
        out[i] = (tries.get(i, []), got)
    return out


def _count(decisions: Decisions, what: Callable[[list[str], tuple[str, ...]], bool]) -> int:
    return sum(1 for tried, got in decisions.values() if what(tried, got))


@pytest.mark.parametrize(
    "policy", ["round-robin", "least-connections", "power-of-two", "queue-aware"]
)
async def test_the_live_front_door_and_the_simulators_decide_alike(policy: str) -> None:
    arrivals = trace()
    sim = simulated(policy, arrivals)
    got = await live(policy, arrivals)
    for i in range(len(arrivals)):
        assert got[i] == sim[i], f"request {i} at {arrivals[i][0]:.6f} s"
    # The trace exercises every rule: answers, retries that landed and that did not,
    # refusals at the door and a backend's refusal standing.
    assert _count(sim, lambda tried, got: got[0] == "overloaded") > 0
    assert _count(sim, lambda tried, got: len(tried) == 2 and got[0] == "answered") > 0
    assert _count(sim, lambda tried, got: len(tried) == 2 and got[0] == "refused") > 0
    lo, hi = DRAINS["a"]
    drained = [i for i, (t, _, _) in enumerate(arrivals) if lo <= t < hi and sim[i][0][:1] == ["a"]]
    assert drained and all(len(sim[i][0]) == 2 for i in drained)  # a 503: tried elsewhere
    assert _count(sim, lambda tried, got: got[0] == "answered") > len(arrivals) // 2
