"""Poller probes against an httpx MockTransport (as the poller's fetch), on a FakeClock."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from pathlib import Path
from typing import Any

import httpx

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.poller import Poller
from evenserve.gateway.repository_index import index_due
from evenserve.httpio.client import ConnectFailed, Reply, ResponseTimeout
from evenserve.httpio.server import HttpServer, Request, Response, json_response
from evenserve.policy.routing import ROUTING

TRITON_TEXT = (
    Path(__file__).resolve().parents[2] / "fixtures" / "triton" / "metrics_kura_gpu.txt"
).read_text()


class Backend:
    """State a MockTransport handler answers from."""

    def __init__(self) -> None:
        self.up = True
        self.ready = True
        self.hung = False
        self.queue = 2
        self.device = "emulated:x"
        self.kind: str | None = "emulated"
        self.slice: str | None = None
        self.loads = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == LOAD_PATH:
            self.loads += 1
            rep = LoadReport(
                timestamp_s=time.time(), device=self.device, device_kind=self.kind,
                device_slice=self.slice, queue_depth=self.queue, in_flight=1,
                queued_by_model={"m": self.queue}, utilization=0.5,
                utilization_window_s=1.0, memory_used_bytes=4e9, memory_total_bytes=24e9,
                ready=self.ready,
            )  # fmt: skip
            return httpx.Response(200, content=rep.model_dump_json())
        if request.url.path == "/v2/health/ready":
            return httpx.Response(200 if self.ready else 503)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=TRITON_TEXT)
        return httpx.Response(404)


def setup(signals: dict[str, Any]) -> tuple[Poller, BackendRegistry, FakeClock, Backend]:
    raw = {"backends": [{"name": "a", "url": "http://a.test", "models": ["m"],
                         "signals": signals}]}  # fmt: skip
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(10.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("queue-aware", random.Random(0)), clock,
        window=3, stale_after_s=0.5,
    )  # fmt: skip
    be = Backend()
    client = httpx.AsyncClient(transport=httpx.MockTransport(be.handler))

    async def fetch(url: str, timeout_s: float) -> Reply:
        if be.hung:
            raise ResponseTimeout("no answer within the time limit")
        try:
            r = await client.get(url)
        except httpx.ConnectError:
            raise ConnectFailed("connect-refused") from None
        return Reply(r.status_code, dict(r.headers), r.content, 0)

    return Poller(reg, cluster.config.gateway, clock, fetch=fetch), reg, clock, be


async def test_load_probe_observes_admits_and_stale_signals_become_unknown() -> None:
    p, reg, clock, _be = setup({"source": "evenserve"})
    assert not reg.is_healthy("a") and reg.states["a"].reason == "starting"
    await p.probe_load(reg.states["a"])
    assert reg.is_healthy("a")
    v = reg.router.view("a")
    assert v.signals_fresh and v.queue_depth == 2 and v.utilization == 0.5
    assert v.memory_free_bytes == 20e9
    # No new sample for longer than the bound: unknown, not idle.
    clock.advance(0.6)
    assert reg.router.expire(clock.now()) == ["a"]
    v = reg.router.view("a")
    assert not v.signals_fresh and v.utilization is None and v.memory_free_bytes is None


async def test_the_load_report_names_the_backends_device_and_slice() -> None:
    p, reg, _clock, be = setup({"source": "evenserve"})
    st = reg.states["a"]
    assert st.device is None and st.device_name == "a"
    await p.probe_load(st)
    assert (st.device, st.device_kind, st.device_slice) == ("emulated:x", "emulated", None)
    assert st.device_name == "a"
    be.device, be.slice = "emulated:x#mig=3g.20gb", "mig-3g.20gb"
    await p.probe_load(st)
    assert st.device_name == "a/mig-3g.20gb"


async def test_load_probe_ejects_on_refusal_and_not_ready_and_readmits() -> None:
    p, reg, clock, be = setup({"source": "evenserve"})
    st = reg.states["a"]
    await p.probe_load(st)
    be.up = False
    clock.advance(0.1)
    await p.probe_load(st)
    assert not reg.is_healthy("a") and st.reason == "connect-refused"
    be.up, be.ready = True, False
    clock.advance(0.1)
    await p.probe_load(st)
    assert not reg.is_healthy("a") and st.reason == "not-ready"
    be.ready = True
    clock.advance(0.1)
    await p.probe_load(st)
    assert reg.is_healthy("a")
    assert [(e.event, e.reason, round(e.t_s, 3)) for e in reg.events] == [
        ("ready", "ready", 10.0),
        ("ejected", "connect-refused", 10.1),
        ("admitted", "ready", 10.3),
    ]


async def test_prometheus_backend_reads_triton_text_and_readiness_separately() -> None:
    p, reg, _, be = setup({"source": "prometheus", "mapping": "triton"})
    st = reg.states["a"]
    await p.probe_metrics(st)
    await p.probe_ready(st)
    assert reg.is_healthy("a")
    v = reg.router.view("a")
    assert v.signals_fresh and v.utilization == 0.0
    assert v.memory_total_bytes == 16101933056.0
    be.ready = False
    await p.probe_ready(st)
    assert not reg.is_healthy("a") and st.reason == "not-ready (503)"


async def test_none_backend_only_polls_readiness() -> None:
    p, reg, _, be = setup({"source": "none"})
    await p.probe_all()
    assert reg.is_healthy("a")
    assert not reg.router.view("a").signals_fresh  # routed on in-flight counts only
    be.up = False
    await p.probe_all()
    assert not reg.is_healthy("a")


async def test_a_miss_is_not_an_ejection_until_misses_in_a_row() -> None:
    p, reg, _, be = setup({"source": "evenserve"})
    st = reg.states["a"]
    await p.probe_load(st)
    be.hung = True
    await p.probe_load(st)
    assert reg.is_healthy("a") and st.misses == 1 and st.last_error == "timeout"
    be.hung = False
    await p.probe_load(st)  # an answer resets the count
    assert st.misses == 0
    be.hung = True
    await p.probe_load(st)
    await p.probe_load(st)
    assert not reg.is_healthy("a") and st.reason == "timeout (2 probes in a row)"


async def test_every_backend_missing_at_once_ejects_none() -> None:
    raw = {
        "backends": [
            {"name": n, "url": f"http://{n}.test", "models": ["m"]} for n in ("a", "b", "c")
        ]
    }
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(10.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("round-robin", random.Random(0)), clock,
        window=3, stale_after_s=0.5,
    )  # fmt: skip
    hung: set[str] = set()

    async def fetch(url: str, timeout_s: float) -> Reply:
        host = url.split("//")[1].split(".")[0]
        if host in hung:
            raise ResponseTimeout("no answer within the time limit")
        rep = LoadReport(
            timestamp_s=0.0, device="emulated:x", queue_depth=0, in_flight=0,
            utilization=0.0, utilization_window_s=1.0,
        )  # fmt: skip
        return Reply(200, {}, rep.model_dump_json().encode(), 0)

    p = Poller(reg, cluster.config.gateway, clock, fetch=fetch)
    await p.probe_all()
    assert all(reg.is_healthy(n) for n in "abc")
    # A starved gateway: every probe misses. Nobody is ejected.
    hung.update("abc")
    for _ in range(3):
        await p.probe_all()
    assert all(reg.is_healthy(n) for n in "abc") and p.judge.held > 0
    # Only one backend misses while the others answer: that is evidence; it is ejected.
    hung.clear()
    await p.probe_all()
    hung.add("b")
    for _ in range(2):
        await p.probe_all()
    assert [n for n in "abc" if not reg.is_healthy(n)] == ["b"]


async def test_a_backend_answering_requests_is_not_ejected_for_slow_probes() -> None:
    """A worker busy decoding large bodies misses its probes while it answers requests: the
    misses do not eject it. Once it answers nothing after a missed probe went, it is."""
    p, reg, clock, be = setup({"source": "evenserve"})
    await p.probe_load(reg.states["a"])
    assert reg.is_healthy("a")
    be.hung = True
    for _ in range(4):  # a request answered during each probe's wait (the dispatcher's mark)
        clock.advance(0.1)
        sent = clock.now()
        reg.states["a"].answered_s = sent + 0.05
        await p.probe_load(reg.states["a"])
    assert reg.is_healthy("a") and p.judge.answering > 0
    # Hung for good: no answer after the next probes were sent -> ejected at the next misses.
    for _ in range(2):
        clock.advance(0.1)
        await p.probe_load(reg.states["a"])
    assert not reg.is_healthy("a")


async def until(cond: Any, cap_s: float = 30.0) -> None:
    """Wait for ``cond()`` (a bound on a broken run, not a timing assertion)."""
    deadline = time.monotonic() + cap_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_load_probes_over_http_go_by_callback_and_a_silent_backend_is_missed() -> None:
    """Over real HTTP the load probe is sent on the kept connection by callback, without a
    task per probe (what an idle gateway spends its time on), and judged as the task path
    judges it: a report observed; a backend that stops answering is a miss, then ejected."""
    state = {"silent": False}
    held: list[asyncio.Future[None]] = []

    async def handler(req: Request) -> Response:
        if state["silent"]:
            f = asyncio.get_running_loop().create_future()
            held.append(f)
            await f  # never answered while the test runs
        rep = LoadReport(
            timestamp_s=time.time(), device="emulated:x", queue_depth=3, in_flight=1,
            queued_by_model={"m": 3}, utilization=0.5, utilization_window_s=1.0, ready=True,
        )  # fmt: skip
        return json_response(rep.model_dump_json().encode())

    srv = HttpServer(handler)
    await srv.start("127.0.0.1", 0)
    raw = {
        "gateway": {
            "signals": {"interval_ms": 20, "timeout_ms": 100},
            "health": {"interval_ms": 100000, "misses": 2},
        },
        "backends": [{"name": "a", "url": f"http://127.0.0.1:{srv.port}", "models": ["m"]}],
    }
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(10.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("queue-aware", random.Random(0)), clock,
        window=3, stale_after_s=60.0,
    )  # fmt: skip
    p = Poller(reg, cluster.config.gateway, clock)
    sent: list[object] = []
    send_load = p.send_load

    def counting(st: Any) -> Any:
        out = send_load(st)
        sent.append(out)
        return out

    p.send_load = counting  # type: ignore[method-assign]
    p.start()
    try:
        await until(lambda: sum(x is not None for x in sent) >= 3)
        assert reg.states["a"].healthy
        assert reg.router.view("a").queued_by_model.get("m") == 3.0
        tasks_before = len(p._probing)
        assert tasks_before == 0  # the callback path holds no task
        state["silent"] = True
        await until(lambda: not reg.states["a"].healthy)
        assert "timeout" in reg.states["a"].last_error
    finally:
        await p.stop()
        for f in held:
            f.cancel()
        await srv.stop(1.0)


async def test_the_first_round_after_startup_is_one_period_after_it() -> None:
    """The gateway reads every backend once at startup (``probe_all``) and then starts the
    period loops: their first round is one period later, not at once. A second read at once
    lands while the first requests are routed and drops the router's count of what it sent
    since the first (a CI run routed a burst as if a backend's queue were empty)."""
    p, _reg, _clock, be = setup({"source": "evenserve", "interval_ms": 60_000})
    await p.probe_all()
    assert be.loads == 1
    p.start()
    try:
        for _ in range(10):  # let the loops run their first iteration, whatever it does
            await asyncio.sleep(0.01)
        assert be.loads == 1
    finally:
        await p.stop()


async def test_an_idle_backend_is_probed_every_idle_interval_and_a_busy_one_every_tick() -> None:
    p, reg, clock, be = setup({"source": "evenserve"})
    st = reg.states["a"]
    be.queue = 0
    await p.probe_load(st)  # healthy, nothing queued there
    assert p.load_due(st, clock.now())
    for _ in range(2):  # within the idle period (250 ms): not probed
        clock.advance(0.1)
        assert not p.load_due(st, clock.now())
    clock.advance(0.05)
    assert p.load_due(st, clock.now())
    # Work of this gateway's in flight there: every tick.
    reg.router.sent("a", "m", clock.now())
    clock.advance(0.1)
    assert p.load_due(st, clock.now())
    clock.advance(0.1)
    assert p.load_due(st, clock.now())
    reg.router.done("a", "m")
    clock.advance(0.1)
    assert not p.load_due(st, clock.now())
    # A report with queued work there (another client's): every tick.
    be.queue = 2
    await p.probe_load(st)
    clock.advance(0.1)
    assert p.load_due(st, clock.now())
    # An ejected backend: every tick.
    be.queue = 0
    await p.probe_load(st)
    reg.eject("a", "test")
    clock.advance(0.1)
    assert p.load_due(st, clock.now())


async def test_the_idle_period_stays_under_half_the_staleness_bound() -> None:
    p, reg, clock, be = setup({"source": "evenserve"})
    p.cfg = p.cfg.model_copy(
        update={"signals": p.cfg.signals.model_copy(update={"stale_after_ms": 300.0})}
    )
    st = reg.states["a"]
    be.queue = 0
    await p.probe_load(st)
    assert p.load_due(st, clock.now())
    clock.advance(0.1)
    assert not p.load_due(st, clock.now())
    clock.advance(0.06)  # 160 ms > 300 / 2
    assert p.load_due(st, clock.now())


async def test_a_tick_starts_no_task_for_an_index_that_is_not_due() -> None:
    p, reg, clock, _be = setup({"source": "evenserve"})
    st = reg.states["a"]
    await p.probe_load(st)  # its report carries no models version: the index is read
    assert index_due(st, clock.now())
    st.models_version = st.index_version = 7
    st.index_read_s = clock.now()
    assert not index_due(st, clock.now())
    start = p._starter(st, functools.partial(p.probe_index, st))
    assert start().done() and not p._probing
    clock.advance(11.0)  # INDEX_REFRESH_S later: read again
    t = start()
    assert p._probing == {t}
    await t


async def test_with_several_gateways_every_backend_is_probed_every_tick() -> None:
    p, reg, clock, be = setup({"source": "evenserve"})
    reg.router.replicas = 2  # the others' sends show only in reports
    st = reg.states["a"]
    be.queue = 0
    await p.probe_load(st)
    assert p.load_due(st, clock.now())
    clock.advance(0.1)
    assert p.load_due(st, clock.now())
