"""From engine events to OpenAI answers, without a transport: the server only writes bytes.

The engine yields one ``GenEvent`` per engine step of a sequence: the text its new tokens
decoded to (maybe "", as when a token completes no character), how many tokens the step
added, and ``finish_reason`` on the last (``stop``: end-of-sequence; ``length``:
``max_tokens`` or the context's end). The drivers apply the request's stop strings
(``StopMatcher``) and encode:

* ``stream_completion`` / ``stream_chat`` yield SSE bytes, one item per engine step that has
  something to send, to be written as they come. Chat's first item begins with the role
  chunk (``delta.role`` ``assistant``, sent with the first step so a client's first byte is
  the first token's); then one content chunk per step whose text is not empty (a step that
  adds no text sends nothing); the last step's chunk carries ``finish_reason`` (its delta
  empty when it adds no text); then the usage chunk when asked for, then ``[DONE]``, all in
  the last item.
* ``collect_completion`` / ``collect_chat`` give the whole answer's body.

A stop string cuts the text and finishes with ``stop``; the drivers then stop reading and
close the event iterator (``aclose``), which is how the engine learns to drop the sequence.
The usage counts the tokens of every step read, the one that completed the stop included,
and carries ``prompt_tokens_details.cached_tokens`` when the caller set ``Tally.cached_tokens``
(the engine's prefix-cache hit, known at the first token).

Errors: a non-streamed answer lets them propagate (the server answers with the status). A
stream's status is already sent: an error becomes an in-band error event then ``[DONE]``
(``OpenAIError`` as it is; any other exception as a 500 whose message hides the internals).
The ``Tally`` passed in says how it ended (tokens, finish reason, the error) so the server
can count and log it. Cancellation (the client left) propagates, after closing the events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from evenserve.worker.openai.encode import (
    FinishReason,
    Reply,
    chat_chunk,
    chat_completion_body,
    completion_body,
    completion_chunk,
    usage_chunk,
)
from evenserve.worker.openai.errors import OpenAIError, internal
from evenserve.worker.openai.sse import SSE_DONE, sse, sse_error
from evenserve.worker.openai.stop import StopMatcher


@dataclass(frozen=True, slots=True)
class GenEvent:
    """One engine step of one sequence."""

    #: The text this step's tokens decoded to (maybe "").
    text: str
    #: Tokens this step added to the output (1 per decode step; 0 is allowed).
    token_count: int
    #: Set on the sequence's last step.
    finish_reason: FinishReason | None = None


@dataclass(slots=True)
class Tally:
    """How one answer ended, filled in by a driver."""

    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    #: The exception that ended a stream (sent to the client as an error event).
    error: BaseException | None = None
    #: The prompt tokens the engine's prefix cache gave (set by the caller when the engine
    #: says, on the first token; the usage's ``prompt_tokens_details.cached_tokens``).
    cached_tokens: int | None = None


class _Steps:
    """Per event: the text to send now and the finish reason, if this is the last."""

    __slots__ = ("_matcher", "tally")

    def __init__(self, stops: Sequence[str], tally: Tally) -> None:
        self._matcher = StopMatcher(stops)
        self.tally = tally

    def step(self, event: GenEvent) -> tuple[str, FinishReason | None]:
        self.tally.completion_tokens += event.token_count
        text = self._matcher.feed(event.text)
        finish: FinishReason | None = None
        if self._matcher.stopped:
            finish = "stop"
        elif event.finish_reason is not None:
            text += self._matcher.flush()
            finish = event.finish_reason
        self.tally.finish_reason = finish
        return text, finish


def _unfinished() -> OpenAIError:
    return internal("The generation ended without a finish reason.")


async def _close(events: AsyncIterator[GenEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def _error_event(exc: Exception) -> bytes:
    return sse_error(exc if isinstance(exc, OpenAIError) else internal())


def stream_completion(
    events: AsyncIterator[GenEvent],
    reply: Reply,
    *,
    stop: Sequence[str] = (),
    include_usage: bool = False,
    tally: Tally | None = None,
) -> AsyncGenerator[bytes]:
    """A streamed ``/v1/completions`` answer's SSE bytes (see the module docstring)."""
    return _stream(events, reply, stop, include_usage, tally, chat=False)


def stream_chat(
    events: AsyncIterator[GenEvent],
    reply: Reply,
    *,
    stop: Sequence[str] = (),
    include_usage: bool = False,
    tally: Tally | None = None,
) -> AsyncGenerator[bytes]:
    """A streamed ``/v1/chat/completions`` answer's SSE bytes (see the module docstring)."""
    return _stream(events, reply, stop, include_usage, tally, chat=True)


async def _stream(
    events: AsyncIterator[GenEvent],
    reply: Reply,
    stop: Sequence[str],
    include_usage: bool,
    tally: Tally | None,
    *,
    chat: bool,
) -> AsyncGenerator[bytes]:
    """Both streams: a chat's first piece carries the assistant's role, its last chunk's
    empty text is None; otherwise the same pieces in the same order."""
    tally = tally if tally is not None else Tally()
    steps = _Steps(stop, tally)
    first = chat

    def chunk(text: str | None, finish: FinishReason | None = None) -> bytes:
        if chat:
            return sse(chat_chunk(reply, text, finish, usage_null=include_usage))
        return sse(completion_chunk(reply, text or "", finish, usage_null=include_usage))

    try:
        async for event in events:
            text, finish = steps.step(event)
            out = []
            if first:
                out.append(sse(chat_chunk(reply, "", role=True, usage_null=include_usage)))
                first = False
            if finish is None:
                if text:
                    out.append(chunk(text))
                if out:
                    yield b"".join(out)
                continue
            out.append(chunk(text or None, finish))
            if include_usage:
                out.append(
                    sse(
                        usage_chunk(
                            reply,
                            tally.completion_tokens,
                            chat=chat,
                            cached_tokens=tally.cached_tokens,
                        )
                    )
                )
            out.append(SSE_DONE)
            yield b"".join(out)
            return
        raise _unfinished()
    except Exception as exc:
        tally.error = exc
        yield _error_event(exc) + SSE_DONE
    finally:
        await _close(events)


async def _collect(
    events: AsyncIterator[GenEvent], stop: Sequence[str], tally: Tally
) -> tuple[str, FinishReason]:
    steps = _Steps(stop, tally)
    parts = []
    try:
        async for event in events:
            text, finish = steps.step(event)
            parts.append(text)
            if finish is not None:
                return "".join(parts), finish
        raise _unfinished()
    except Exception as exc:
        tally.error = exc
        raise
    finally:
        await _close(events)


async def collect_completion(
    events: AsyncIterator[GenEvent],
    reply: Reply,
    *,
    stop: Sequence[str] = (),
    tally: Tally | None = None,
) -> bytes:
    """A whole ``/v1/completions`` answer; the engine's errors propagate."""
    tally = tally if tally is not None else Tally()
    text, finish = await _collect(events, stop, tally)
    return completion_body(reply, text, finish, tally.completion_tokens, tally.cached_tokens)


async def collect_chat(
    events: AsyncIterator[GenEvent],
    reply: Reply,
    *,
    stop: Sequence[str] = (),
    tally: Tally | None = None,
) -> bytes:
    """A whole ``/v1/chat/completions`` answer; the engine's errors propagate."""
    tally = tally if tally is not None else Tally()
    content, finish = await _collect(events, stop, tally)
    return chat_completion_body(
        reply, content, finish, tally.completion_tokens, tally.cached_tokens
    )
