"""The OpenAI streaming client against a local SSE server whose answers the test controls.

Nothing here asserts a timing value: token counts, content, outcomes and the order of times
only (a fake clock where a time must be exact)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from evenserve.core.clock import FakeClock, RealClock
from evenserve.core.llm import UNFINISHED
from evenserve.loadgen.openai_client import (
    OpenAiStreamClient,
    retry_after_s,
    run_closed_loop,
    run_open_loop,
)
from evenserve.loadgen.sse import SseEvent, SseParser
from evenserve.workload.llm import LlmRequest, llm_open_loop, llm_users, parse_llm_workload

PAUSE_S = 0.002


class ByteTokenizer:
    eos_token_id: int | None = None
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode(errors="replace")


def chunk(text: str, chat: bool = False, finish: str | None = None, **extra: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return b"data: " + json.dumps({"choices": [choice], **extra}).encode() + b"\n\n"


def usage(n: int, prompt: int = 3) -> bytes:
    u = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    return b"data: " + json.dumps({"choices": [], "usage": u}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Server:
    """Streams by the request's model name; advances ``clock`` (when given) before each write."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.peers: list[Any] = []
        self.clock = clock
        #: What a ``hang`` stream waits for after its token.
        self.release = asyncio.Event()

    def script(self, model: str, body: dict[str, Any]) -> list[bytes] | web.Response:
        chat = "messages" in body
        words = [f" w{i}" for i in range(5)]
        if model == "plain":
            return [chunk(w, chat) for w in words[:-1]] + [chunk(words[-1], chat, "length")]
        if model == "usage-more":
            return [chunk(w) for w in words[:3]] + [usage(6), DONE]
        if model == "usage-less":
            return [chunk(w) for w in words] + [usage(3), DONE]
        if model == "continuous":
            return [
                chunk(" a b", usage={"completion_tokens": 2}),
                chunk(" c d", usage={"completion_tokens": 4}),
                chunk(" e", "length", usage={"completion_tokens": 5}),
                usage(5),
                DONE,
            ]
        if model == "refuse":
            return web.Response(status=429, text="queue full", headers={"Retry-After": "3"})
        if model == "unavailable":
            headers = {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}
            return web.Response(status=503, text="down", headers=headers)
        if model == "error":
            err = {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}
            return [chunk(" x"), b"event: error\ndata: " + json.dumps(err).encode() + b"\n\n", DONE]
        if model == "cut":
            return [chunk(" x"), chunk(" y")]
        if model == "abort":
            return [chunk(" x"), chunk("", finish="abort"), DONE]
        if model == "drop":
            return [chunk(" x"), chunk(" y"), b"drop"]
        if model == "garbage":
            return [chunk(" x"), b"data: {not json\n\n", DONE]
        if model == "hang":  # one token, then nothing until the client goes away
            return [chunk(" x"), b"hang"]
        raise AssertionError(model)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(
            {"path": request.path, "class": request.headers.get("x-evenserve-priority"), **body}
        )
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.peers.append(peer)
        script = self.script(body["model"], body)
        if isinstance(script, web.Response):
            return script
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for part in script:
            if part == b"hang":
                await self.release.wait()
                return resp
            if part == b"drop":  # the server goes away mid-stream
                assert request.transport is not None
                request.transport.close()
                return resp
            if self.clock is not None:
                self.clock.advance(1.0)
            await resp.write(part + (b"" if part.endswith(b"\n\n") else b"\n\n"))
            if part is not script[-1]:
                await asyncio.sleep(PAUSE_S)
        if script[-1] != DONE and body["model"] == "plain":
            await resp.write(usage(5) + DONE)
        await resp.write_eof()
        return resp


async def serve(server: Server) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/completions", server.handle)
    app.router.add_post("/v1/chat/completions", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def fake_clock_server() -> AsyncIterator[tuple[Server, str, FakeClock]]:
    clock = FakeClock()
    s = Server(clock)
    runner, url = await serve(s)
    yield s, url, clock
    await runner.cleanup()


def req(model: str, rid: int = 0, prompt: tuple[int, ...] = (104, 105), **kw: Any) -> LlmRequest:
    return LlmRequest(rid, model, 0.0, prompt, max_tokens=5, **kw)


async def test_a_stream_fills_the_record(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    server, url, clock = fake_clock_server
    async with OpenAiStreamClient(url, clock, extra_body={"temperature": 0}) as c:
        r = await c.send(req("plain", 7, ttft_target_s=2.0, priority=0), scheduled_s=0.0)
    rec = r.record
    assert (rec.outcome, rec.request_id, rec.priority, rec.ttft_target_s) == (
        "completed",
        7,
        0,
        2.0,
    )
    assert r.text == " w0 w1 w2 w3 w4" and r.finish_reason == "length" and r.status == 200
    assert rec.output_tokens == 5 == r.usage_tokens == r.counted_tokens and rec.prompt_tokens == 3
    times = rec.token_times_s or []
    assert times == sorted(times) and times[0] >= 1.0  # the first chunk was written at 1.0
    assert rec.finished_s is not None and rec.finished_s >= times[-1]
    body = server.bodies[0]
    assert body["path"] == "/v1/completions" and body["prompt"] == [104, 105]
    assert body["class"] == "0"  # the request's class travels as the header
    assert (body["max_tokens"], body["ignore_eos"], body["stream"]) == (5, True, True)
    assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0


@pytest.mark.parametrize(
    ("model", "counted", "final"), [("usage-more", 3, 6), ("usage-less", 5, 3)]
)
async def test_final_usage_corrects_the_count(
    fake_clock_server: tuple[Server, str, FakeClock], model: str, counted: int, final: int
) -> None:
    _, url, clock = fake_clock_server
    async with OpenAiStreamClient(url, clock) as c:
        r = await c.send(req(model))
    times = r.record.token_times_s or []
    assert (r.counted_tokens, r.usage_tokens, len(times)) == (counted, final, final)
    assert times == sorted(times) and r.record.outcome == "completed"
    if model == "usage-more":  # the missing tokens come with the last content event
        assert times[2:] == [times[2]] * 4
    else:  # the first and the last token keep their times
        plain = r.record.token_times_s
        assert plain is not None and plain[-1] == max(times)


async def test_continuous_usage_counts_multi_token_events(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    server, url, clock = fake_clock_server
    async with OpenAiStreamClient(url, clock, continuous_usage=True) as c:
        r = await c.send(req("continuous"))
    t = r.record.token_times_s or []
    assert len(t) == 5 and t[0] == t[1] and t[2] == t[3] and t == sorted(t)
    assert server.bodies[0]["stream_options"]["continuous_usage_stats"] is True


async def test_chat_sends_text_and_reads_deltas(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    server, url, clock = fake_clock_server
    tok = ByteTokenizer()
    async with OpenAiStreamClient(url, clock, api="chat", tokenizer=tok) as c:
        r = await c.send(req("plain", prompt=tuple(tok.encode("hi there"))))
    assert r.record.outcome == "completed" and r.text == " w0 w1 w2 w3 w4"
    body = server.bodies[0]
    assert body["path"] == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "hi there"}]
    async with OpenAiStreamClient(url, clock, prompt="text", tokenizer=tok) as c:
        await c.send(req("plain", prompt=(97, 98)))
    assert server.bodies[1]["prompt"] == "ab"


@pytest.mark.parametrize(
    ("model", "outcome", "status", "retry", "tokens", "error"),
    [
        ("refuse", "overloaded", 429, 3.0, 0, "queue full"),
        ("unavailable", "http-503", 503, None, 0, "down"),
        ("error", "stream-error", 200, None, 1, "boom"),
        ("cut", "bad-response", 200, None, 2, "before [DONE]"),
        ("abort", "aborted", 200, None, 1, None),
        ("garbage", "bad-response", 200, None, 1, "not JSON"),
    ],
)
async def test_refusals_and_failures_are_outcomes(
    fake_clock_server: tuple[Server, str, FakeClock],
    model: str,
    outcome: str,
    status: int,
    retry: float | None,
    tokens: int,
    error: str | None,
) -> None:
    _, url, clock = fake_clock_server
    async with OpenAiStreamClient(url, clock) as c:
        r = await c.send(req(model))
    assert (r.record.outcome, r.status, r.retry_after_s) == (outcome, status, retry)
    assert r.record.output_tokens == tokens and r.record.finished_s is not None
    if error is None:
        assert r.error is None
    else:
        assert r.error is not None and error in r.error


async def test_a_connection_lost_mid_stream_is_a_failure_with_the_tokens_read(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    _, url, clock = fake_clock_server
    async with OpenAiStreamClient(url, clock) as c:
        r = await c.send(req("drop"))
        assert r.record.outcome in ("bad-response", "connection-lost")
        times = r.record.token_times_s or []
        assert len(times) <= 2 and times == sorted(times) and r.error
        again = await c.send(req("plain"))  # the client carries on on a fresh connection
    assert again.record.outcome == "completed"


async def test_a_deadline_leaves_a_request_unfinished_with_the_tokens_read() -> None:
    server = Server()
    runner, url = await serve(server)
    try:
        async with OpenAiStreamClient(url, RealClock()) as c:
            hung = await c.send(req("hang"), deadline_s=c._now() + 0.3)
            late = await c.send(req("plain"), deadline_s=c._now() - 1.0)
            fine = await c.send(req("plain"), deadline_s=c._now() + 60.0)
    finally:
        server.release.set()
        await runner.cleanup()
    rec = hung.record
    assert rec.outcome == UNFINISHED and rec.finished_s is None
    assert rec.token_times_s is not None and len(rec.token_times_s) == 1
    assert hung.error is not None and "deadline" in hung.error
    assert not rec.met_targets()
    # a deadline already past: nothing is sent
    assert late.record.outcome == UNFINISHED and late.record.token_times_s is None
    assert len(server.bodies) == 2
    assert fine.record.outcome == "completed" and fine.record.output_tokens == 5


async def test_nothing_listening_is_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with OpenAiStreamClient(f"http://127.0.0.1:{port}", RealClock()) as c:
        r = await c.send(req("plain"))
    assert r.record.outcome == "connection-refused" and r.record.token_times_s is None


def test_text_prompts_need_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        OpenAiStreamClient("http://127.0.0.1:1", RealClock(), api="chat")
    with pytest.raises(ValueError, match="api"):
        OpenAiStreamClient("http://127.0.0.1:1", RealClock(), api="embeddings")  # type: ignore[arg-type]


def workload(**over: Any) -> Any:
    raw: dict[str, Any] = {
        "model": "plain",
        "rate_rps": 200.0,
        "prompt_tokens": {"dist": "uniform", "min": 2, "max": 6},
        "output_tokens": {"dist": "fixed", "value": 5},
        "vocab": 50,
    }
    raw.update(over)
    return parse_llm_workload(raw, "w")


async def test_open_loop_sends_every_request_and_counts_from_the_schedule(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    server, url, clock = fake_clock_server
    requests = llm_open_loop(workload(), 3, 1.0, max_requests=6)[::-1]  # any order given

    async def late_wait(t_s: float) -> None:
        clock.set(max(clock.now(), t_s + 3.0))  # every send 3 s late

    records = await run_open_loop(url, requests, clock, wait_until=late_wait)
    assert [r.request_id for r in records] == [q.request_id for q in requests]
    for q, r in zip(requests, records, strict=True):
        assert r.outcome == "completed" and r.output_tokens == 5
        assert r.scheduled_s == q.arrival_s and r.prompt_tokens == 3  # as the server's usage
        assert r.ttft_s is not None and r.ttft_s >= 3.0
    sent = sorted(tuple(b["prompt"]) for b in server.bodies)
    assert sent == sorted(q.prompt_ids for q in requests)


async def test_open_loop_refuses_sends_over_the_in_flight_bound(
    fake_clock_server: tuple[Server, str, FakeClock],
) -> None:
    _, url, clock = fake_clock_server
    requests = [req("plain", i) for i in range(4)]  # all due at once

    async def no_wait(t_s: float) -> None:
        return None

    records = await run_open_loop(url, requests, clock, wait_until=no_wait, max_in_flight=1)
    assert [r.outcome for r in records] == ["completed"] + ["client-limit"] * 3
    assert all(r.token_times_s is None for r in records[1:])


async def test_closed_loop_users_wait_for_their_answers() -> None:
    server = Server()
    runner, url = await serve(server)
    try:
        users = llm_users(workload(rate_rps=None, users=2, think_ms=1.0), 5)
        records = await run_closed_loop(url, users, RealClock(), 60.0, max_requests=5)
        one = llm_users(workload(rate_rps=None, users=1), 5)
        alone = await run_closed_loop(url, one, RealClock(), 60.0, max_requests=3)
    finally:
        await runner.cleanup()
    assert len(records) == 5 and len({r.request_id for r in records}) == 5
    assert all(r.outcome == "completed" and r.output_tokens == 5 for r in records)
    for user in (0, 1):
        mine = [r for r in records if r.request_id % 2 == user]
        for a, b in itertools.pairwise(mine):
            assert a.finished_s is not None and b.scheduled_s >= a.finished_s
    assert len(alone) == 3
    assert len(set(server.peers[-3:])) == 1  # one user: one keep-alive connection


events_strategy = st.lists(
    st.tuples(
        st.sampled_from(["", "error", "message"]),
        st.lists(
            st.text(
                st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)),
                max_size=20,
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    max_size=8,
)


@given(events_strategy, st.lists(st.integers(0, 400), max_size=10), st.booleans())
def test_sse_parser_is_split_invariant(
    events: list[tuple[str, list[str]]], cuts: list[int], crlf: bool
) -> None:
    nl = "\r\n" if crlf else "\n"
    text = ": a comment" + nl
    for name, lines in events:
        if name:
            text += f"event: {name}{nl}"
        text += "".join(f"data: {line}{nl}" for line in lines) + nl
    raw = text.encode()
    parser = SseParser()
    got: list[SseEvent] = []
    prev = 0
    for cut in sorted(c % (len(raw) + 1) for c in cuts):
        got += parser.feed(raw[prev:cut])
        prev = cut
    got += parser.feed(raw[prev:])
    assert got == [SseEvent(name or "message", "\n".join(lines)) for name, lines in events]


def test_retry_after_reads_seconds_only() -> None:
    assert retry_after_s("2") == 2.0 and retry_after_s(" 0.5 ") == 0.5
    assert retry_after_s(None) is None and retry_after_s("-1") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") is None
