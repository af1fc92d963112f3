"""Dispatcher outcomes against an httpx MockTransport: retry once, eject, 503, 504, 429."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample
from evenserve.core.wire import BACKEND_HEADER, OVERLOADED, REASON_HEADER
from evenserve.gateway.answers import RELAY_RESPONSE_HEADERS, Answer, GrpcReply
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.httpio.client import Reply as HttpReply
from evenserve.metrics.gateway import GatewayMetrics
from evenserve.policy.routing import ROUTING
from evenserve.policy.routing.router import LEARN_MIN_ANSWERS
from tests.unit.gateway.fakes import HttpxForwarder

Handler = Callable[[httpx.Request], httpx.Response]


def setup(
    handler: Handler,
    names: tuple[str, ...] = ("a", "b"),
    routing: str = "round-robin",
    enabled: bool = True,
) -> tuple[Dispatcher, BackendRegistry, FakeClock]:
    raw = {
        "gateway": {"routing": routing, "overload": {"enabled": enabled}},
        "backends": [{"name": n, "url": f"http://{n}.test:80", "models": ["m"]} for n in names],
    }
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(100.0)
    cfg = cluster.config.gateway
    reg = BackendRegistry.build(
        cluster.backends(),
        ROUTING.build(routing, random.Random(0)),
        clock,
        window=3,
        stale_after_s=0.5,
    )
    for n in names:
        reg.admit(n)
    metrics = GatewayMetrics(lambda: [])
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    fwd = HttpxForwarder(client, RELAY_RESPONSE_HEADERS)
    return Dispatcher(reg, cfg, clock, metrics, forwarder=fwd), reg, clock


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"host": request.url.host})


async def infer(d: Dispatcher, model: str = "m") -> tuple[int, dict[str, str], bytes]:
    a = await d.infer(model, f"/v2/models/{model}/infer", b'{"inputs": []}', {})
    return a.status, a.headers, a.body


async def test_success_names_backend_and_counts_in_flight_back_to_zero() -> None:
    d, reg, _ = setup(ok)
    status, headers, body = await infer(d)
    assert status == 200
    assert headers[BACKEND_HEADER] == json.loads(body)["host"].split(".")[0]
    assert all(reg.router.view(n).in_flight == 0 for n in ("a", "b"))


async def test_an_answer_of_any_status_marks_the_backend_answering() -> None:
    """The poller does not eject a backend for slow probes while it answers requests: the
    dispatcher marks each answer (any status); a failure to answer marks nothing."""
    d, reg, clock = setup(lambda r: httpx.Response(500 if r.url.host == "a.test" else 200))
    clock.advance(1.0)
    await infer(d)  # round robin: a answers 500, relayed
    assert reg.states["a"].answered_s == clock.now() and reg.states["b"].answered_s < 0


async def test_connect_refused_ejects_and_retries_on_the_other_host() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            raise httpx.ConnectError("refused", request=request)
        return ok(request)

    d, reg, clock = setup(handler)
    status, headers, _ = await infer(d)  # round robin tries a first
    assert status == 200 and headers[BACKEND_HEADER] == "b"
    assert not reg.is_healthy("a") and reg.states["a"].reason == "connect-refused"
    ev = reg.events[-1]
    assert (ev.backend, ev.event, ev.t_s) == ("a", "ejected", clock.now())
    # Ejected: later requests never try a.
    for _ in range(3):
        status, headers, _ = await infer(d)
        assert headers[BACKEND_HEADER] == "b"


async def test_dropped_connection_is_retried_without_ejection() -> None:
    calls = Counter[str]()

    def handler(request: httpx.Request) -> httpx.Response:
        calls[request.url.host] += 1
        if request.url.host == "a.test":
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        return ok(request)

    d, reg, _ = setup(handler)
    status, headers, _ = await infer(d)
    assert status == 200 and headers[BACKEND_HEADER] == "b"
    assert reg.is_healthy("a")  # the poller decides; a stale keep-alive must not eject
    assert calls == {"a.test": 1, "b.test": 1}


async def test_read_timeout_ejects_and_answers_504_without_retry() -> None:
    calls = Counter[str]()

    def handler(request: httpx.Request) -> httpx.Response:
        calls[request.url.host] += 1
        raise httpx.ReadTimeout("slow", request=request)

    d, reg, _ = setup(handler)
    status, headers, body = await infer(d)
    assert status == 504 and headers[BACKEND_HEADER] == "a"
    assert "did not answer" in json.loads(body)["error"]
    assert calls == {"a.test": 1}
    assert not reg.is_healthy("a")


async def test_every_host_failing_is_one_clear_503() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    d, _reg, _ = setup(handler)
    status, headers, body = await infer(d)
    assert status == 503
    msg = json.loads(body)["error"]
    assert "no backend available for model 'm'" in msg
    assert "a: connect-refused" in msg and "b: connect-refused" in msg
    assert headers["retry-after"] == "1"
    status, _, body = await infer(d)  # both ejected now: nothing is tried
    assert status == 503 and "none is ready" in json.loads(body)["error"]


async def test_retry_budget_is_one_extra_host() -> None:
    calls = Counter[str]()

    def handler(request: httpx.Request) -> httpx.Response:
        calls[request.url.host] += 1
        return httpx.Response(503, json={"error": "draining"})

    d, _, _ = setup(handler, names=("a", "b", "c"))
    status, headers, _ = await infer(d)
    assert status == 503 and headers[BACKEND_HEADER] in ("a", "b", "c")
    assert sum(calls.values()) == 2


async def test_client_errors_are_relayed_not_retried() -> None:
    calls = Counter[str]()

    def handler(request: httpx.Request) -> httpx.Response:
        calls[request.url.host] += 1
        return httpx.Response(400, json={"error": "input 'x': bad shape"})

    d, _, _ = setup(handler)
    status, _, body = await infer(d)
    assert status == 400 and b"bad shape" in body
    assert sum(calls.values()) == 1


BERT = LatencyProfile.from_points("m", {1: 15.5, 8: 40.0})  # a full batch of 8: 40 ms


def report(reg: BackendRegistry, name: str, t: float, q: float, slo_s: float | None) -> None:
    reg.router.observe(
        name,
        LoadSample(
            timestamp_s=t,
            queue_depth=q,
            queued_by_model={"m": q},
            max_batch_size={"m": 8},
            slo_s={} if slo_s is None else {"m": slo_s},
        ),
    )


async def test_429_only_when_every_host_predicts_a_wait_past_the_slo() -> None:
    d, reg, clock = setup(ok, routing="queue-aware")
    for n in ("a", "b"):
        reg.router.view(n).profiles = {"m": BERT}
        report(reg, n, clock.now(), 6, 0.1)
    # 6 queued on a device that runs 8 at once: not overload (the old rule's 429)
    status, _, _ = await infer(d)
    assert status == 200
    for n in ("a", "b"):
        for _ in range(3):
            report(reg, n, clock.now(), 24, 0.1)  # 3 full batches ahead: 120 ms > 100 ms
    status, headers, body = await infer(d)
    assert status == 429 and headers["retry-after"] == "1"
    assert headers[REASON_HEADER] == OVERLOADED and BACKEND_HEADER not in headers
    assert "predicted wait 120 ms > SLO 100 ms" in json.loads(body)["error"]
    for _ in range(3):
        report(reg, "a", clock.now(), 0, 0.1)
    status, headers, _ = await infer(d)
    assert status == 200 and headers[BACKEND_HEADER] == "a"


@pytest.mark.parametrize("what", ["no SLO reported", "no profile", "overload disabled"])
async def test_no_evidence_or_no_permission_no_429(what: str) -> None:
    d, reg, clock = setup(ok, routing="least-expected-work", enabled=what != "overload disabled")
    for n in ("a", "b"):
        if what != "no profile":
            reg.router.view(n).profiles = {"m": BERT}
        for _ in range(3):
            report(reg, n, clock.now(), 400, None if what == "no SLO reported" else 0.1)
    status, _, _ = await infer(d)
    assert status == 200, what


async def test_the_router_learns_from_served_answers_only() -> None:
    def slow_a(request: httpx.Request) -> httpx.Response:
        clock.advance(0.030)
        if request.url.host == "b.test":
            return httpx.Response(429, headers={REASON_HEADER: "queue-full"})
        return ok(request)

    d, reg, clock = setup(slow_a)
    # Round robin: a answers (30 ms) or b refuses (not learned) and a answers on the retry.
    for _ in range(LEARN_MIN_ANSWERS):
        await infer(d)
    assert reg.router.view("a").latency_per_request_s == {"m": pytest.approx(0.030)}
    assert reg.router.view("b").latency_per_request_s == {}
    assert reg.router.view("a").in_flight_by_model == {"m": 0}


async def test_unknown_model_is_404() -> None:
    d, _, _ = setup(ok)
    status, _, body = await infer(d, "nope")
    assert status == 404 and "unknown model 'nope'" in json.loads(body)["error"]


@pytest.mark.parametrize("routing", sorted(ROUTING.names()))
async def test_every_policy_routes_through_the_gateway(routing: str) -> None:
    d, _, _ = setup(ok, names=("a", "b", "c"), routing=routing)
    for _ in range(6):
        status, headers, _ = await infer(d)
        assert status == 200 and headers[BACKEND_HEADER] in ("a", "b", "c")


async def test_completions_settle_the_routers_send_count_between_polls() -> None:
    # 500 req/s with a 100 ms poll: 50 sends between two polls. Answered requests must not
    # keep counting as queued, or queue-aware would call an idle backend overloaded.
    d, reg, clock = setup(ok, names=("a",), routing="queue-aware")
    reg.router.observe("a", LoadSample(timestamp_s=clock.now(), queue_depth=0))
    for _ in range(50):
        status, _, _ = await infer(d)
        assert status == 200
    v = reg.router.view("a")
    assert v.queue_depth == 0.0 and v.in_flight == 0
    assert v.queued_by_model.get("m", 0.0) == 0.0


def test_outcome_labels_are_the_declared_ones() -> None:
    from evenserve.gateway.answers import outcome_of
    from evenserve.metrics.names import GATEWAY_OUTCOMES

    assert {outcome_of(s) for s in (200, 204, 400, 404, 429, 500, 503)} <= set(GATEWAY_OUTCOMES)
    for literal in ("overloaded", "unavailable", "timeout", "unknown_model"):
        assert literal in GATEWAY_OUTCOMES


@pytest.mark.parametrize(
    ("status", "reason", "tries"),
    [
        (429, "queue-full", 2),  # never entered a queue: another host may have room
        (429, "shed", 1),  # taken, then shed for a higher class: relayed, not moved elsewhere
        (504, "deadline-infeasible", 1),
        (504, "deadline-expired", 1),
    ],
)
async def test_worker_refusals_retry_only_when_the_work_was_not_taken(
    status: int, reason: str, tries: int
) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {"x-evenserve-reason": reason, "retry-after": "1"}
        return httpx.Response(status, json={"error": f"{reason}: ..."}, headers=headers)

    d, reg, _ = setup(handler)
    headers_in = {
        "content-type": "application/json",
        "x-evenserve-priority": "offline",
        "x-evenserve-deadline-ms": "250",
        "x-unrelated": "not forwarded",
    }
    a = await d.infer("m", "/v2/models/m/infer", b'{"inputs": []}', headers_in)
    assert a.status == status and a.headers["x-evenserve-reason"] == reason
    assert len(seen) == tries
    for r in seen:  # the request's class and deadline reach the worker
        assert r.headers["x-evenserve-priority"] == "offline"
        assert r.headers["x-evenserve-deadline-ms"] == "250"
        assert "x-unrelated" not in r.headers
    assert all(reg.router.view(n).in_flight == 0 for n in ("a", "b"))


@pytest.mark.parametrize(
    ("status", "reason", "tries", "relayed"),
    [
        (503, None, 2, 503),  # UNAVAILABLE: not ready, draining, or no connection
        (429, "queue-full", 2, 429),
        (429, "shed", 1, 429),
        (413, None, 1, 413),  # RESOURCE_EXHAUSTED without a reason: over the size limit
        (400, None, 1, 400),
        (504, "deadline-expired", 1, 504),
    ],
)
async def test_grpc_tries_follow_the_http_rules(
    status: int, reason: str | None, tries: int, relayed: int
) -> None:
    d, reg, _ = setup(ok)
    sent: list[str] = []

    async def send(name: str) -> GrpcReply:
        sent.append(name)
        return GrpcReply(status, reason, f"code-{status}", f"from {name}")

    a = await d.infer_grpc("m", send)
    assert len(sent) == tries and len(set(sent)) == tries
    assert a.status == relayed and a.grpc is not None and a.backend == sent[-1]
    assert a.grpc.message == f"from {sent[-1]}"
    assert all(reg.router.view(n).in_flight == 0 for n in ("a", "b"))


async def test_grpc_excluded_backends_are_never_tried_and_timeouts_eject() -> None:
    from evenserve.gateway.forwarder import ResponseTimeout

    d, reg, _ = setup(ok)
    sent: list[str] = []

    async def send(name: str) -> GrpcReply:
        sent.append(name)
        return GrpcReply(200, None, "OK", response=name)

    for _ in range(3):
        a = await d.infer_grpc("m", send, exclude=["a"])
        assert a.grpc is not None and a.grpc.response == "b" and a.backend == "b"
    assert sent == ["b"] * 3
    assert (await d.infer_grpc("m", send, exclude=["a", "b"])).status == 503
    assert (await d.infer_grpc("zzz", send)).status == 404

    async def stuck(name: str) -> GrpcReply:
        raise ResponseTimeout("timeout")

    a = await d.infer_grpc("m", stuck)
    assert a.status == 504 and a.grpc is None
    assert not reg.is_healthy(a.headers[BACKEND_HEADER])


async def test_the_router_receives_class_and_deadline_on_every_path() -> None:
    """Parsed at admission into the RequestInfo the router chooses with: the HTTP headers,
    the relayed gRPC path's metadata; a value that does not parse leaves the default and is
    forwarded as it came (the worker refuses it)."""
    from evenserve.core.types import RequestInfo
    from evenserve.core.wire import DEADLINE_HEADER, OFFLINE, ONLINE, PRIORITY_HEADER

    forwarded: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        forwarded.append(request.headers.get(PRIORITY_HEADER))
        return ok(request)

    d, reg, clock = setup(handler)
    seen: list[RequestInfo] = []
    choose = reg.router.choose

    def spy(request: RequestInfo, now_s: float, exclude: object = ()) -> object:
        seen.append(request)
        return choose(request, now_s, exclude)  # type: ignore[arg-type]

    reg.router.choose = spy  # type: ignore[assignment]
    headers = {PRIORITY_HEADER: "offline", DEADLINE_HEADER: "250"}
    await d.infer("m", "/v2/models/m/infer", b"{}", headers)
    await d.infer("m", "/v2/models/m/infer", b"{}", {PRIORITY_HEADER: "urgent"})

    async def send(name: str) -> GrpcReply:
        return GrpcReply(200, None, "OK", response=name)

    await d.infer_grpc("m", send, (), {PRIORITY_HEADER: "7", DEADLINE_HEADER: "1500.5"})
    http, bad, relayed = seen
    assert (http.priority, http.deadline_s) == (OFFLINE, clock.now() + 0.25)
    assert (bad.priority, bad.deadline_s) == (ONLINE, None)
    assert forwarded == ["offline", "urgent"]
    assert (relayed.priority, relayed.deadline_s) == (7, clock.now() + 1.5005)


def _http_reply(status: int, reason: str | None, whole: bool) -> HttpReply:
    body = b'{"ok": true}'
    lines = [f"HTTP/1.1 {status} X", "content-type: application/json"]
    if reason is not None:
        lines.append(f"{REASON_HEADER}: {reason}")
    lines.append(f"content-length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return HttpReply(status, {}, body, 0, head, head + body if whole else None)


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(
    ("status", "reason"),
    [(200, None), (400, None), (429, OVERLOADED), (429, "shed"), (503, None), (500, None)],
)
def test_tried_is_done_settle_and_finish(status: int, reason: str | None, whole: bool) -> None:
    """The fast path's one step for an answer (``Dispatcher.tried``) gives what the three
    steps give: the same answer (or the same kept refusal, and the next try), router state
    and metrics."""
    got = []
    for fused in (False, True):
        d, reg, clock = setup(ok, routing="least-expected-work")
        fw = d.admit("m", "/v2/models/m/infer", b"{}", {})
        assert not isinstance(fw, Answer)
        name = d.pick(fw)
        assert name is not None
        fw.backend = name
        clock.advance(0.25)
        reply = _http_reply(status, reason, whole)
        if fused:
            answers: list[Answer] = []
            fw.answer = answers.append
            retried: list[object] = []
            d.fast_path.next_try = retried.append  # type: ignore[method-assign]
            d.tried(fw, reply, None)
            assert len(answers) + len(retried) == 1 and retried in ([], [fw])
            ans = answers[0] if answers else None
        else:
            d.done(name, fw.model, reply)
            ans = d.settle(fw, name, reply, None)
            if ans is not None:
                ans = d.finish(fw.model, ans, fw.t0)
        v = reg.router.view(name)
        kept = fw.relayed
        got.append(
            (
                None if ans is None else (ans.status, ans.body, ans.headers, ans.raw, ans.outcome),
                None if kept is None else (kept.status, kept.raw, kept.headers, kept.outcome),
                fw.refused_by,
                fw.failures,
                (v.in_flight, dict(v.in_flight_by_model), dict(v.queued_by_model)),
                reg.router._backends[name].lanes["m"].count,
                reg.states[name].answered_s,
                dict(d.metrics._hot.requests),
                [sum(h.counts) for h in d.metrics._hot.latency.values()],
            )
        )
    assert got[0] == got[1]
