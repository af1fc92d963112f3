"""The gateway learns each backend's models from its repository index: Poller.probe_index
driven directly on a FakeClock, against a fake index that a test changes."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from evenserve.cluster.backend_spec import BackendSpec
from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample
from evenserve.gateway.backends import BackendRegistry, BackendState
from evenserve.gateway.poller import Poller
from evenserve.gateway.repository_index import BadIndex, parse_index
from evenserve.httpio.client import ConnectFailed, Reply, ResponseTimeout
from evenserve.policy.routing import ROUTING

PROF = LatencyProfile.from_points("x", {1: 0.01})


class Index:
    """What the fake backend's ``POST /v2/repository/index`` answers."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries = dict(entries or {})
        self.status = 200
        self.body: bytes | None = None  # answer this instead of the entries
        self.error: Exception | None = None
        self.calls: list[tuple[str, float]] = []

    async def post(self, url: str, timeout_s: float) -> Reply:
        self.calls.append((url, timeout_s))
        if self.error is not None:
            raise self.error
        body = self.body
        if body is None:
            body = json.dumps(
                [{"name": m, "version": "1", "state": s} for m, s in self.entries.items()]
            ).encode()
        return Reply(self.status, {}, body, 0)


async def _no_fetch(url: str, timeout_s: float) -> Reply:
    raise AssertionError(f"only the index is probed here, not {url}")


def setup(
    models: list[str] | None, index: Index, profiles: dict[str, LatencyProfile] | None = None
) -> tuple[Poller, BackendRegistry, FakeClock, BackendState]:
    spec: dict[str, Any] = {"name": "gpu0", "url": "http://gpu0.test"}
    if models is not None:
        spec["models"] = models
    other = {"name": "gpu1", "url": "http://gpu1.test", "models": ["a"]}
    cluster = parse_cluster({"backends": [spec, other]}, Path("."))
    clock = FakeClock(10.0)

    def profs(s: BackendSpec) -> dict[str, LatencyProfile]:
        return dict(profiles or {}) if s.name == "gpu0" else {}

    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("round-robin", random.Random(0)), clock,
        window=3, stale_after_s=0.5, profiles=profs,
    )  # fmt: skip
    for n in ("gpu0", "gpu1"):
        reg.admit(n)
    p = Poller(reg, cluster.config.gateway, clock, fetch=_no_fetch, index=index.post)
    return p, reg, clock, reg.states["gpu0"]


def routed(reg: BackendRegistry, model: str) -> list[str]:
    return [v.name for v in reg.router.candidates(model)]


async def test_models_are_learned_from_the_index_and_follow_its_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index = Index({"a": "READY", "b": "READY"})
    p, reg, clock, st = setup(None, index)
    assert not reg.hosts_model("b") and routed(reg, "a") == ["gpu1"]  # nothing known yet
    caplog.set_level(logging.INFO, "evenserve.gateway")
    await p.probe_index(st)
    assert index.calls == [("http://gpu0.test/v2/repository/index", 0.5)]
    assert st.learned and reg.hosts_model("b") and reg.models() == ["a", "b"]
    assert routed(reg, "a") == ["gpu0", "gpu1"] and routed(reg, "b") == ["gpu0"]
    assert "backend gpu0: models now [a, b] (+a, +b)" in caplog.messages
    # The same answer again changes nothing and says nothing.
    caplog.clear()
    await p.probe_index(st)
    assert caplog.messages == []
    # b is unloading: no longer routed there, but known (503, not 404).
    clock.advance(0.1)
    index.entries["b"] = "UNLOADING"
    await p.probe_index(st)
    assert routed(reg, "b") == [] and reg.hosts_model("b")
    assert reg.states_of("b") == {"gpu0": "UNLOADING"}
    assert caplog.messages == ["backend gpu0: models now [a] (-b)"]
    # Gone from the index: unknown (404).
    del index.entries["b"]
    await p.probe_index(st)
    assert not reg.hosts_model("b") and reg.hosts_of("b") == ()
    # c is loading, then ready.
    index.entries["c"] = "LOADING"
    await p.probe_index(st)
    assert reg.hosts_model("c") and routed(reg, "c") == [] and reg.ready_models() == ["a"]
    clock.advance(0.1)
    index.entries["c"] = "READY"
    await p.probe_index(st)
    assert routed(reg, "c") == ["gpu0"] and reg.hosts_of("c") == ("gpu0",)
    assert [(e.t_s, e.backend, e.event, e.reason) for e in reg.events if e.event == "models"] == [
        (10.0, "gpu0", "models", "now [a, b] (+a, +b)"),
        (10.1, "gpu0", "models", "now [a] (-b)"),
        (10.2, "gpu0", "models", "now [a, c] (+c)"),
    ]


async def test_the_configured_set_stands_until_the_index_answers_and_without_one() -> None:
    index = Index()
    index.status = 404
    p, reg, _, st = setup(["a", "b"], index)
    assert routed(reg, "b") == ["gpu0"] and not st.learned
    await p.probe_index(st)  # no repository extension: the configured set stays
    assert routed(reg, "b") == ["gpu0"] and reg.states_of("b") == {"gpu0": "READY"}
    index.status = 405
    await p.probe_index(st)
    assert routed(reg, "a") == ["gpu0", "gpu1"]
    # When it answers, its index wins over the configured set.
    index.status = 200
    index.entries = {"a": "READY"}
    await p.probe_index(st)
    assert not reg.hosts_model("b") and routed(reg, "a") == ["gpu0", "gpu1"]


async def test_a_failed_index_keeps_the_last_set_and_ejects_nothing() -> None:
    index = Index({"a": "READY", "b": "READY"})
    p, reg, _, st = setup(None, index)
    await p.probe_index(st)
    failures: list[tuple[Exception | None, int, bytes | None]] = [
        (ConnectFailed("connect-refused"), 200, None),
        (ResponseTimeout("no answer"), 200, None),
        (None, 500, None),
        (None, 200, b"not json"),
        (None, 200, b'{"models": []}'),
        (None, 200, b'[{"state": "READY"}]'),
    ]
    for error, status, body in failures:
        index.error, index.status, index.body = error, status, body
        await p.probe_index(st)
        assert routed(reg, "b") == ["gpu0"], (error, status, body)
        assert reg.is_healthy("gpu0") and st.misses == 0
        assert st.last_error is not None and st.last_error.startswith("index: ")


async def test_a_learned_models_profile_comes_from_the_backends_profile_set() -> None:
    index = Index({"a": "READY"})
    p, reg, _, st = setup(["a"], index, profiles={"a": PROF, "b": PROF})
    view = reg.router.view("gpu0")
    assert set(view.profiles) == {"a"}
    index.entries["b"] = "READY"
    await p.probe_index(st)
    assert set(view.profiles) == {"a", "b"}
    del index.entries["a"]
    await p.probe_index(st)
    assert set(view.profiles) == {"b"}


async def test_signals_and_in_flight_survive_a_change() -> None:
    index = Index({"a": "READY", "b": "READY"})
    p, reg, _, st = setup(None, index)
    await p.probe_index(st)
    reg.router.observe("gpu0", LoadSample(timestamp_s=10.0, queue_depth=3.0))
    reg.router.sent("gpu0", "b", 10.0)
    index.entries = {"a": "READY"}
    await p.probe_index(st)
    v = reg.router.view("gpu0")
    assert v.signals_fresh and v.in_flight == 1 and v.queue_depth == pytest.approx(4.0)
    reg.router.done("gpu0", "b")
    assert v.in_flight == 0


def test_the_index_is_read_on_the_health_period_for_every_source() -> None:
    raw = {
        "gateway": {"signals": {"interval_ms": 20}, "health": {"interval_ms": 250}},
        "backends": [
            {"name": "w", "url": "http://w.test"},
            {"name": "t", "url": "http://t.test", "signals": {"source": "prometheus"}},
            {"name": "n", "url": "http://n.test", "signals": {"source": "none"}},
        ],
    }
    cluster = parse_cluster(raw, Path("."))
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("round-robin"), FakeClock(), window=1, stale_after_s=1
    )
    p = Poller(reg, cluster.config.gateway, FakeClock())
    for st in reg.states.values():
        probes = p._probes(st)
        index = [s for s, probe in probes if probe.func == p.probe_index]  # type: ignore[attr-defined]
        assert index == [0.25], st.spec.name  # once per health period, one per backend


def test_parse_index_takes_each_models_best_state() -> None:
    body = json.dumps(
        [
            {"name": "a", "version": "1", "state": "UNAVAILABLE"},
            {"name": "a", "version": "2", "state": "READY"},
            {"name": "b", "state": "loading"},
            {"name": "c", "state": "SOMETHING"},
            {"name": "d", "state": "UNAVAILABLE", "reason": "load failed: bad file"},
            {"name": "../x", "state": "READY"},
            # Not loaded there: not hosted (404 through the gateway, as on the backend).
            {"name": "never"},
            {"name": "gone", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "idle", "state": "UNAVAILABLE", "reason": "not loaded"},
        ]
    ).encode()
    assert parse_index(body) == {
        "a": "READY",
        "b": "LOADING",
        "c": "UNAVAILABLE",
        "d": "UNAVAILABLE",
    }
    assert parse_index(b"[]") == {}
    for bad in (b"{}", b"[1]", b"nope", b'[{"name": 3}]'):
        with pytest.raises(BadIndex):
            parse_index(bad)


def test_models_is_optional_but_not_empty() -> None:
    cluster = parse_cluster({"backends": [{"name": "x", "url": "http://x.test"}]}, Path("."))
    assert cluster.backends()[0].models is None
    with pytest.raises(ConfigError, match=r"models: .*leave models out to learn them"):
        parse_cluster({"backends": [{"name": "x", "url": "http://x", "models": []}]}, Path("."))


async def test_no_models_and_no_index_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    index = Index()
    index.status = 404
    p, reg, _, st = setup(None, index)
    for _ in range(3):
        await p.probe_index(st)
    said = [m for m in caplog.messages if "no models configured" in m]
    assert len(said) == 1 and "gpu0" in said[0]
    assert not st.learned and reg.hosts_of("a") == ("gpu1",)


async def test_the_gateways_index_readiness_and_404_follow_the_learned_states() -> None:
    from evenserve.gateway.server import Gateway
    from evenserve.httpio.server import Request

    raw = {
        "gateway": {"admin": {"token": "t" * 16}},
        "backends": [
            {"name": "g0", "url": "http://g0.test", "models": ["a"]},
            {"name": "g1", "url": "http://g1.test"},
        ],
    }
    g = Gateway(parse_cluster(raw, Path(".")), clock=FakeClock(5.0))
    reg = g.registry
    reg.admit("g0")
    reg.admit("g1")

    async def index() -> list[dict[str, Any]]:
        resp = await g.repository_index(Request("POST", "/v2/repository/index", "", {}, b"{}"))
        return list(json.loads(resp.body))

    assert g.ready()
    reg.set_index("g1", {"a": "READY", "b": "LOADING", "c": "UNAVAILABLE"})
    assert await index() == [
        {"name": "a", "state": "READY", "backends": {"g0": "READY", "g1": "READY"}},
        {"name": "b", "state": "LOADING", "backends": {"g1": "LOADING"}},
        {"name": "c", "state": "UNAVAILABLE", "backends": {"g1": "UNAVAILABLE"}},
    ]
    assert g.model_ready("b").status == 503 and g.model_ready("z").status == 404
    assert g.ready()  # b loading and c unavailable do not make the gateway unready
    reg.eject("g1", "connect-refused")
    assert (await index())[0]["backends"] == {"g0": "READY", "g1": "UNAVAILABLE"}
    reg.eject("g0", "connect-refused")
    assert (await index())[0]["state"] == "UNAVAILABLE" and not g.ready()
    # Nothing READY anywhere: not ready (it can serve nothing).
    reg.admit("g0")
    reg.admit("g1")
    reg.set_index("g0", {})
    reg.set_index("g1", {"b": "LOADING"})
    assert reg.models() == ["b"] and not g.ready()
    await g.dispatcher.aclose()


async def test_the_index_is_read_again_only_when_the_models_version_moved() -> None:
    from evenserve.gateway.repository_index import INDEX_REFRESH_S

    index = Index({"a": "READY"})
    p, reg, clock, st = setup(["a"], index)
    await p.probe_index(st)  # no version reported yet: read every time
    await p.probe_index(st)
    assert len(index.calls) == 2
    st.models_version = 7  # a load report carried a version
    await p.probe_index(st)
    await p.probe_index(st)  # unchanged: no request
    clock.advance(INDEX_REFRESH_S / 2)
    await p.probe_index(st)
    assert len(index.calls) == 3
    index.entries["b"] = "READY"
    st.models_version = 8  # the worker loaded a model
    await p.probe_index(st)
    assert len(index.calls) == 4 and routed(reg, "b") == ["gpu0"]
    clock.advance(INDEX_REFRESH_S)  # the safety net: read again after the refresh bound
    await p.probe_index(st)
    assert len(index.calls) == 5
    index.error = ResponseTimeout("index")  # a failed read is not a read: tried again
    st.models_version = 9
    await p.probe_index(st)
    await p.probe_index(st)
    assert len(index.calls) == 7


async def test_on_index_read_is_called_after_each_index_applied_and_not_after_a_failure() -> None:
    index = Index({"a": "READY"})
    p, reg, _, st = setup(None, index)
    seen: list[tuple[str, dict[str, str]]] = []
    reg.on_index_read = lambda name: seen.append((name, dict(reg.states[name].index)))
    await p.probe_index(st)
    assert seen == [("gpu0", {"a": "READY"})]
    index.error = ConnectFailed("connect-refused")
    await p.probe_index(st)
    assert len(seen) == 1  # no answer: nothing to reconcile with
    index.error = None
    index.entries["b"] = "READY"
    await p.probe_index(st)
    assert seen[-1] == ("gpu0", {"a": "READY", "b": "READY"})


async def test_an_older_index_read_answered_after_a_newer_one_is_dropped() -> None:
    """Two reads of one backend's index overlap (a tick's and another's) and the older one's
    answer comes in last: it must not undo what the newer one showed."""
    index = Index({"a": "READY"})
    p, reg, _clock, st = setup(None, index)
    gates: list[asyncio.Future[None]] = []

    async def post(url: str, timeout_s: float) -> Reply:
        held = dict(index.entries)  # what the backend held when it answered
        gate = asyncio.get_running_loop().create_future()
        gates.append(gate)
        await gate
        body = json.dumps([{"name": m, "version": "1", "state": s} for m, s in held.items()])
        return Reply(200, {}, body.encode(), 0)

    p.index = post
    older = asyncio.ensure_future(p.probe_index(st))
    await asyncio.sleep(0)
    index.entries = {"a": "READY", "b": "READY"}
    newer = asyncio.ensure_future(p.probe_index(st))
    await asyncio.sleep(0)
    gates[1].set_result(None)
    await newer
    assert routed(reg, "b") == ["gpu0"]
    gates[0].set_result(None)
    await older
    assert routed(reg, "b") == ["gpu0"]  # not back to [a] alone
