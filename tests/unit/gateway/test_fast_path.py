"""The server's fast handler (``FastPath.serve``) and its tries (``FastPath.next_try``) run
``Dispatcher.admit``'s and ``pick``'s steps inlined: held here to the two steps themselves,
on twin gateways fed the same requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core import wire
from evenserve.core.clock import FakeClock
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample
from evenserve.gateway.answers import Answer
from evenserve.gateway.forward import Forward
from evenserve.gateway.server import Gateway
from evenserve.httpio.client import HttpClient
from evenserve.httpio.client import Reply as HttpReply
from evenserve.httpio.server import Request, Response

PATH = "/v2/models/m/infer"
BODY = b'{"inputs": []}'


def gateway(routing: str) -> Gateway:
    raw = {
        "gateway": {"routing": routing, "overload": {"enabled": True}},
        "backends": [
            {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": ["m"]}
            for i, n in enumerate(("a", "b", "c"))
        ],
    }
    gw = Gateway(parse_cluster(raw, Path(".")), clock=FakeClock(100.0))
    for n in ("a", "b", "c"):
        gw.registry.admit(n)
    return gw


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Forward]]:
    """Every try the fast path sends (taken at once, never answered unless a test says so)."""
    out: list[Forward] = []

    def send_with(self: HttpClient, head: bytes, body: bytes, cb: Any, arg: Any) -> bool:
        assert head.endswith(b"content-length: %d\r\n\r\n" % len(body))
        out.append(arg)
        return True

    monkeypatch.setattr(HttpClient, "send_with", send_with)
    yield out


def state(gw: Gateway) -> tuple[Any, ...]:
    r = gw.registry.router
    views = [r.view(n) for n in ("a", "b", "c")]
    d = gw.dispatcher
    return (
        [(v.in_flight, dict(v.in_flight_by_model), dict(v.queued_by_model)) for v in views],
        [[list(lane.sends) for lane in r._backends[n].lanes.values()] for n in ("a", "b", "c")],
        sum(d.metrics.decision.counts),
        d.metrics.retries.labels("m")._value.get(),
    )


def forward_fields(fw: Forward) -> tuple[Any, ...]:
    q = fw.req
    return (
        (q.request_id, q.model, q.arrival_s, q.priority, q.deadline_s),
        (fw.path, fw.body, fw.head_key, fw.attempt, fw.tried, fw.failures, fw.refused_by),
    )


def refusing(name: str) -> HttpReply:
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
    return HttpReply(503, {}, b"", 0, head, head)


@pytest.mark.parametrize("routing", ["queue-aware", "least-expected-work", "round-robin"])
@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/json"},
        {wire.PRIORITY_HEADER: "3", wire.DEADLINE_HEADER: "250"},
        {wire.PRIORITY_HEADER: "nope"},
    ],
)
def test_serve_and_next_try_are_admit_and_pick(
    sent: list[Forward], routing: str, headers: dict[str, str]
) -> None:
    fast, plain = gateway(routing), gateway(routing)
    answers: list[Response] = []
    for i in range(4):
        for gw in (fast, plain):
            assert isinstance(gw.clock, FakeClock)
            gw.clock.advance(0.01)
        assert fast.fast(Request("POST", PATH, "", dict(headers), BODY), answers.append)
        fw = plain.dispatcher.admit("m", PATH, BODY, headers)
        assert isinstance(fw, Forward)
        name = plain.dispatcher.pick(fw)
        got = sent[-1]
        assert got.backend == name and forward_fields(got) == forward_fields(fw)
        assert state(fast) == state(plain)
        if i % 2:  # refused: the next try, inlined against Dispatcher.pick
            for gw in (fast, plain):
                assert isinstance(gw.clock, FakeClock)
                gw.clock.advance(0.003)
            assert name is not None
            fast.dispatcher.tried(got, refusing(name), None)
            plain.dispatcher.done(name, "m", refusing(name))
            assert plain.dispatcher.settle(fw, name, refusing(name), None) is None
            nxt = plain.dispatcher.pick(fw)
            assert sent[-1] is got and got.backend == nxt
            assert forward_fields(got) == forward_fields(fw) and state(fast) == state(plain)
    assert answers == []  # every request was sent, none answered here


def test_serve_refuses_at_admission_as_admit_does(sent: list[Forward]) -> None:
    fast, plain = gateway("queue-aware"), gateway("queue-aware")
    prof = LatencyProfile.from_points("m", {1: 10.0, 8: 40.0})
    for gw in (fast, plain):
        r = gw.registry.router
        for n in ("a", "b", "c"):
            r.view(n).profiles = {"m": prof}  # what a profile set would give (tests only)
            r.observe(
                n,
                LoadSample(
                    timestamp_s=100.0,
                    queue_depth=80.0,
                    queued_by_model={"m": 80.0},
                    max_batch_size={"m": 8},
                    slo_s={"m": 0.1},
                ),
            )
    answers: list[Response] = []
    assert fast.fast(Request("POST", PATH, "", {}, BODY), answers.append)
    ref = plain.dispatcher.admit("m", PATH, BODY, {})
    assert isinstance(ref, Answer) and sent == []
    (a,) = answers
    assert isinstance(a, Answer)
    assert (a.status, a.body, a.headers, a.outcome) == (
        ref.status,
        ref.body,
        ref.headers,
        ref.outcome,
    )
    assert a.status == 429
