"""The load generator's OpenAI streaming client, and open- and closed-loop runners of it.

Theory of operation. One request is one POST to ``/v1/completions`` (prompt as token ids, or
as text through a tokenizer) or ``/v1/chat/completions`` (one user message, the prompt's
text) with ``stream: true`` and ``stream_options.include_usage``, over an aiohttp session's
pooled keep-alive connections. aiohttp, not httpx: reading raw chunks with ``iter_any`` and
splitting server-sent events here, this client spends 7-13 us of CPU per streamed token where
httpx's line iterator alone spends 41-44 us (1000-token streams from a local server, one
token per write or eight, 50 requests in a row).

The body is read as it arrives; :class:`SseParser` cuts it into events (a blank line ends
one; ``data:`` lines join; comments skipped). Every event read in one chunk of the body gets
that chunk's arrival time on the injected clock. The record's times are seconds from the
client's ``origin_s`` on that clock, so they are comparable with the schedule's.

Counting tokens (the rule): an event whose choice carries text (``text``; chat:
``delta.content``) is a content event. If an event carries ``usage.completion_tokens`` (a
cumulative count: vLLM's ``continuous_usage_stats``) beside its choices, it holds the
difference from the previous count; otherwise a content event holds one token. The final
usage (an event without choices) then corrects the total: missing tokens get the last
content event's time (TTFT, TPOT and end-to-end stay right: they read only the first and
last time and the count), surplus ones are dropped from just before the last. Tokens the
usage reports with no content event at all get the usage event's time.

Outcomes: ``completed`` (the stream ended with ``[DONE]`` or closed after a finish reason);
an HTTP error status as the load generator names it (``overloaded`` for 429, ``http-503``),
with ``Retry-After`` kept as information only (nothing is retried); ``stream-error`` for an
error event; ``aborted`` for a finish reason ``abort``; ``bad-response`` for a stream cut
short or not JSON; the load generator's names for connection failures and timeouts;
``unfinished`` when the send's ``deadline_s`` (a run's horizon) came before the answer ended
(the tokens read by then are kept; the simulator names what its drain did not answer so).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from evenserve.core.clock import Clock
from evenserve.core.llm import UNFINISHED, GenerationRecord, Tokenizer
from evenserve.core.wire import (
    BACKEND_HEADER,
    PRIORITY_HEADER,
    REASON_HEADER,
    TPOT_HEADER,
    TTFT_HEADER,
)
from evenserve.loadgen.sse import SseParser
from evenserve.loadgen.target import classify_exception, classify_status
from evenserve.workload.llm import LlmRequest, LlmUser

Api = Literal["completions", "chat"]
PATHS: Mapping[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(slots=True)
class StreamedReply:
    """One request's record and what else the answer said."""

    record: GenerationRecord
    status: int | None = None
    #: ``Retry-After`` of a refusal, seconds (information only: nothing is retried).
    retry_after_s: float | None = None
    #: A refusal's ``x-evenserve-reason`` (the gateway's LLM router: ``ttft-unreachable``).
    reason: str | None = None
    #: The backend a gateway relayed the answer from (``x-evenserve-backend``), if it says.
    backend: str | None = None
    error: str | None = None
    text: str = ""
    finish_reason: str | None = None
    #: Tokens counted from the content events, and those the final usage reported.
    counted_tokens: int = 0
    usage_tokens: int | None = None


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` in seconds (the delay form; a date is not read: None)."""
    if value is None:
        return None
    try:
        s = float(value.strip())
    except ValueError:
        return None
    return s if s >= 0 else None


def _content(choice: Mapping[str, Any], api: Api) -> str:
    if api == "chat":
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


class _Tokens:
    """Token times of one stream under the counting rule (module docstring)."""

    __slots__ = ("last_content_s", "times", "usage_total")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.usage_total: int | None = None
        self.last_content_s: float | None = None

    def event(self, now_s: float, has_content: bool, usage_total: int | None) -> None:
        if usage_total is not None:
            k = max(0, usage_total - self.usage_total_or_count())
            self.usage_total = usage_total
        else:
            k = 1 if has_content else 0
        if has_content:
            self.last_content_s = now_s
        self.times.extend([now_s] * k)

    def usage_total_or_count(self) -> int:
        return self.usage_total if self.usage_total is not None else len(self.times)

    def corrected(self, final_total: int | None, usage_s: float) -> list[float]:
        t = self.times
        if final_total is None or final_total == len(t):
            return t
        if final_total > len(t):
            at = self.last_content_s if self.last_content_s is not None else usage_s
            return sorted(t + [at] * (final_total - len(t)))
        if final_total <= 1:
            return t[:final_total]
        return t[: final_total - 1] + t[-1:]


class OpenAiStreamClient:
    """Sends :class:`LlmRequest` s as OpenAI streaming requests to ``base_url``.

    ``api``: ``completions`` or ``chat``. ``prompt``: ``ids`` (completions only) or ``text``
    (the prompt's ids decoded with ``tokenizer``; chat always sends text). ``extra_body`` is
    merged into every request body (``temperature``, ``priority``...). ``continuous_usage``
    asks for usage in every event (vLLM's extension), so multi-token events count exactly.
    ``target_headers``: send each request's TTFT and TPOT targets as the headers evenserve's
    gateway reads (``x-evenserve-ttft-ms``, ``x-evenserve-tpot-ms``; its LLM router refuses
    what no engine can meet).
    Record times are ``clock.now() - origin_s`` (default origin: the clock at construction).
    """

    def __init__(
        self,
        base_url: str,
        clock: Clock,
        *,
        api: Api = "completions",
        prompt: Literal["ids", "text"] = "ids",
        tokenizer: Tokenizer | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        continuous_usage: bool = False,
        extra_body: Mapping[str, Any] | None = None,
        origin_s: float | None = None,
        target_headers: bool = False,
    ) -> None:
        if api not in PATHS:
            raise ValueError(f"api: expected one of {sorted(PATHS)}, got {api!r}")
        if prompt not in ("ids", "text"):
            raise ValueError(f"prompt: expected 'ids' or 'text', got {prompt!r}")
        if (api == "chat" or prompt == "text") and tokenizer is None:
            raise ValueError("tokenizer: required to send prompts as text (chat, or prompt=text)")
        self.url = base_url.rstrip("/") + PATHS[api]
        self.api: Api = api
        self.as_text = api == "chat" or prompt == "text"
        self.tokenizer = tokenizer
        self.clock = clock
        self.origin_s = clock.now() if origin_s is None else origin_s
        self.continuous_usage = continuous_usage
        self.target_headers = target_headers
        self.extra_body = dict(extra_body or {})
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> OpenAiStreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _now(self) -> float:
        return self.clock.now() - self.origin_s

    def body(self, request: LlmRequest) -> dict[str, Any]:
        """The JSON body of ``request``."""
        stream_options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "ignore_eos": request.ignore_eos,
            "stream": True,
            "stream_options": stream_options,
        }
        if self.as_text:
            assert self.tokenizer is not None  # checked in __init__
            text = self.tokenizer.decode(request.prompt_ids)
            if self.api == "chat":
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
        else:
            body["prompt"] = list(request.prompt_ids)
        body.update(self.extra_body)
        return body

    async def send(
        self, request: LlmRequest, scheduled_s: float | None = None, deadline_s: float | None = None
    ) -> StreamedReply:
        """Send ``request`` (due at ``scheduled_s``, default its arrival time) and read its
        stream to the end, or until ``deadline_s`` (the record's clock; None: no deadline),
        where it is left ``unfinished``; every failure is an outcome, none is raised."""
        reply = StreamedReply(request.record(scheduled_s))
        if deadline_s is None:
            await self._exchange(request, reply)
            return reply
        left = deadline_s - self._now()
        try:
            if left <= 0:
                raise TimeoutError
            async with asyncio.timeout(left):
                await self._exchange(request, reply)
        except TimeoutError:
            rec = reply.record
            rec.outcome, rec.finished_s = UNFINISHED, None
            rec.token_times_s = rec.token_times_s or None
            reply.error = f"not answered by the deadline ({deadline_s:.3f} s)"
        return reply

    async def _exchange(self, request: LlmRequest, reply: StreamedReply) -> None:
        """The POST and its stream, into ``reply``."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        data = orjson.dumps(self.body(request))
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            # The request's class, as the v2 load generator sends it (the worker's and the
            # gateway's header; the simulator reads the same field).
            PRIORITY_HEADER: str(request.priority),
        }
        if self.target_headers:
            if request.ttft_target_s is not None:
                headers[TTFT_HEADER] = f"{request.ttft_target_s * 1e3:.9g}"
            if request.tpot_target_s is not None:
                headers[TPOT_HEADER] = f"{request.tpot_target_s * 1e3:.9g}"
        try:
            async with self._session.post(self.url, data=data, headers=headers) as resp:
                reply.status = resp.status
                reply.backend = resp.headers.get(BACKEND_HEADER)
                if resp.status != 200:
                    reply.record.outcome = classify_status(resp.status)
                    reply.retry_after_s = retry_after_s(resp.headers.get("retry-after"))
                    reply.reason = resp.headers.get(REASON_HEADER)
                    reply.error = (await resp.read()).decode(errors="replace")[:500]
                    reply.record.finished_s = self._now()
                    return
                await self._read_stream(resp, reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is counted, none is raised
            reply.record.outcome = classify_exception(exc)
            reply.error = f"{type(exc).__name__}: {exc}"
            reply.record.finished_s = self._now()
            reply.record.token_times_s = reply.record.token_times_s or None

    async def _read_stream(self, resp: aiohttp.ClientResponse, reply: StreamedReply) -> None:
        parser = SseParser()
        tokens = _Tokens()
        texts: list[str] = []
        final_usage: int | None = None
        usage_s = 0.0
        done = False
        rec = reply.record
        rec.token_times_s = tokens.times  # a failure mid-stream keeps the tokens that came
        async for chunk in resp.content.iter_any():
            now = self._now()
            for ev in parser.feed(chunk):
                if ev.data == "[DONE]":
                    done = True
                    continue
                try:
                    doc = orjson.loads(ev.data)
                except orjson.JSONDecodeError:
                    rec.outcome, reply.error = "bad-response", f"not JSON: {ev.data[:200]!r}"
                    continue
                if ev.event == "error" or (isinstance(doc, dict) and "error" in doc):
                    err = doc.get("error", doc) if isinstance(doc, dict) else doc
                    rec.outcome = "stream-error"
                    reply.error = str(err.get("message", err) if isinstance(err, dict) else err)
                    continue
                if not isinstance(doc, dict):
                    continue
                text = ""
                choices = doc.get("choices") or ()
                for choice in choices:
                    text += _content(choice, self.api)
                    if choice.get("finish_reason"):
                        reply.finish_reason = str(choice["finish_reason"])
                usage = doc.get("usage")
                total: int | None = None
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    total = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        rec.prompt_tokens = int(usage["prompt_tokens"])
                    final_usage, usage_s = total, now
                if text:
                    texts.append(text)
                if choices:  # the final usage event has none: it only corrects the count
                    tokens.event(now, bool(text), total)
        rec.finished_s = self._now()
        reply.text = "".join(texts)
        reply.counted_tokens = len(tokens.times)
        reply.usage_tokens = final_usage
        times = tokens.corrected(final_usage, usage_s)
        rec.token_times_s = times or None
        if rec.outcome != "completed":
            return
        if reply.finish_reason == "abort":
            rec.outcome = "aborted"
        elif not done and reply.finish_reason is None:
            rec.outcome, reply.error = "bad-response", "the stream ended before [DONE]"


WaitUntil = Callable[[float], Awaitable[None]]


def sleeping_wait(clock: Clock) -> WaitUntil:
    """Waits until ``clock.now()`` reaches a time by sleeping on the event loop."""

    async def wait_until(t_s: float) -> None:
        delay = t_s - clock.now()
        if delay > 0:
            await asyncio.sleep(delay)

    return wait_until


async def run_open_loop(
    url: str,
    requests: Sequence[LlmRequest],
    clock: Clock,
    *,
    client: OpenAiStreamClient | None = None,
    wait_until: WaitUntil | None = None,
    max_in_flight: int | None = None,
    **client_options: Any,
) -> list[GenerationRecord]:
    """Send each request at its arrival time (seconds after the start, on ``clock``), not
    waiting for answers; the records in the order of ``requests``. A late send still counts
    its TTFT from the arrival time. ``client`` (else one made with ``client_options``): its
    origin is reset to the start. ``wait_until(t)`` waits until ``clock`` reads ``t``. A
    request due while ``max_in_flight`` are out is not sent: its outcome is ``client-limit``
    (the generator never queues, which would hide the target's delay)."""
    own = client is None
    c = client or OpenAiStreamClient(url, clock, **client_options)
    wait = wait_until or sleeping_wait(clock)
    c.origin_s = clock.now()
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    tasks: dict[int, asyncio.Task[StreamedReply]] = {}
    limited: dict[int, GenerationRecord] = {}
    in_flight = 0

    def answered(_: object) -> None:
        nonlocal in_flight
        in_flight -= 1

    try:
        for i in order:
            r = requests[i]
            await wait(c.origin_s + r.arrival_s)
            if max_in_flight is not None and in_flight >= max_in_flight:
                limited[i] = r.record()
                limited[i].outcome = "client-limit"
                continue
            in_flight += 1
            tasks[i] = asyncio.create_task(c.send(r, r.arrival_s))
            tasks[i].add_done_callback(answered)
        await asyncio.gather(*tasks.values())
    finally:
        pending = [t for t in tasks.values() if not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if own:
            await c.close()
    return [limited[i] if i in limited else tasks[i].result().record for i in range(len(requests))]


async def run_closed_loop(
    url: str,
    users: Sequence[LlmUser],
    clock: Clock,
    duration_s: float,
    *,
    max_requests: int | None = None,
    client: OpenAiStreamClient | None = None,
    wait_until: WaitUntil | None = None,
    **client_options: Any,
) -> list[GenerationRecord]:
    """Closed loop: each user thinks, sends its next request, waits for the whole answer and
    thinks again; no send at or after ``duration_s`` (seconds from the start) or past
    ``max_requests`` in all. The records in the order they were sent."""
    own = client is None
    c = client or OpenAiStreamClient(url, clock, **client_options)
    wait = wait_until or sleeping_wait(clock)
    c.origin_s = clock.now()
    records: list[GenerationRecord] = []

    async def user_loop(user: LlmUser) -> None:
        due = user.think_s()

        def full() -> bool:
            return max_requests is not None and len(records) >= max_requests

        while due < duration_s and not full():
            await wait(c.origin_s + due)
            if full():  # another user took the last request meanwhile
                return
            req = user.next_request(due)
            slot = len(records)
            records.append(req.record(due))  # holds the count (and the order) meanwhile
            records[slot] = (await c.send(req, due)).record
            due = c.clock.now() - c.origin_s + user.think_s()

    try:
        await asyncio.gather(*(user_loop(u) for u in users))
    finally:
        if own:
            await c.close()
    return records
