"""The drivers: engine events to SSE chunks in order, and to whole answers."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from evenserve.worker.openai import (
    SSE_DONE,
    GenEvent,
    OpenAIError,
    Reply,
    Tally,
    collect_chat,
    collect_completion,
    rate_limited,
    stream_chat,
    stream_completion,
)

from .fakes import ScriptedEvents, gather, steps

REPLY = Reply("chatcmpl-1", 100, "tiny", 4)
TEXT_REPLY = Reply("cmpl-1", 100, "tiny", 4)


def events_of(items: list[bytes]) -> list[dict[str, object] | str]:
    """Each SSE event's JSON (or ``[DONE]``), in order, checking the framing."""
    out: list[dict[str, object] | str] = []
    for raw in b"".join(items).split(b"\n\n")[:-1]:
        assert raw.startswith(b"data: ")
        data = raw[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    assert b"".join(items).endswith(b"\n\n")
    return out


def deltas(events: list[dict[str, object] | str]) -> list[object]:
    return [
        (e["choices"][0]["delta"], e["choices"][0]["finish_reason"])  # type: ignore[index]
        if isinstance(e, dict) and e["choices"]
        else e
        for e in events
    ]


async def test_chat_stream_order() -> None:
    src = ScriptedEvents(steps("Hel", "", "lo", "!", finish="length"))
    tally = Tally()
    items = await gather(stream_chat(src, REPLY, tally=tally))
    evs = events_of(items)
    assert deltas(evs) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "Hel"}, None),
        ({"content": "lo"}, None),
        ({"content": "!"}, "length"),
        "[DONE]",
    ]
    # one item per step with something to send: the empty step sends nothing
    assert len(items) == 3
    assert items[-1].endswith(SSE_DONE)
    assert all(e["id"] == "chatcmpl-1" for e in evs if isinstance(e, dict))
    assert (tally.completion_tokens, tally.finish_reason, tally.error) == (4, "length", None)
    assert "usage" not in evs[0]  # type: ignore[operator]


async def test_chat_stream_with_usage() -> None:
    src = ScriptedEvents([GenEvent("a", 1), GenEvent("", 1, "stop")])
    evs = events_of(await gather(stream_chat(src, REPLY, include_usage=True)))
    assert deltas(evs)[:-1] == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "a"}, None),
        ({}, "stop"),
        evs[3],
    ]
    assert all(e["usage"] is None for e in evs[:3])  # type: ignore[index]
    assert evs[3] == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 100,
        "model": "tiny",
        "choices": [],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    assert evs[4] == "[DONE]"


async def test_one_step_answer_is_one_item() -> None:
    items = await gather(stream_chat(ScriptedEvents(steps("x")), REPLY))
    assert len(items) == 1
    assert deltas(events_of(items)) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "x"}, "stop"),
        "[DONE]",
    ]


async def test_a_stop_string_cuts_and_closes_the_engine() -> None:
    src = ScriptedEvents(steps("one ", "tw", "o\nthree", "four", finish="length"))
    tally = Tally()
    evs = events_of(await gather(stream_chat(src, REPLY, stop=["two"], tally=tally)))
    assert deltas(evs) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "one "}, None),
        ({}, "stop"),
        "[DONE]",
    ]
    assert src.closed and src.read == 3
    assert (tally.completion_tokens, tally.finish_reason) == (3, "stop")


async def test_held_text_is_flushed_at_the_end() -> None:
    src = ScriptedEvents(steps("a", "b\n", finish="length"))
    evs = events_of(await gather(stream_completion(src, TEXT_REPLY, stop=["\n\n"])))
    texts = [(e["choices"][0]["text"], e["choices"][0]["finish_reason"]) for e in evs[:-1]]  # type: ignore[index]
    assert texts == [("a", None), ("b\n", "length")]


async def test_completion_stream_order_and_usage() -> None:
    src = ScriptedEvents(steps("a", "", "b"))
    items = await gather(stream_completion(src, TEXT_REPLY, include_usage=True))
    evs = events_of(items)
    assert [e if isinstance(e, str) else e["object"] for e in evs] == [
        "text_completion",
        "text_completion",
        "text_completion",
        "[DONE]",
    ]
    assert [e["choices"] for e in evs[:2]] == [  # type: ignore[index]
        [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
        [{"index": 0, "text": "b", "logprobs": None, "finish_reason": "stop"}],
    ]
    assert evs[2]["choices"] == [] and evs[2]["usage"]["completion_tokens"] == 3  # type: ignore[index]
    assert len(items) == 2


async def test_an_engine_error_mid_stream_is_an_error_event() -> None:
    src = ScriptedEvents([GenEvent("a", 1)], fail=RuntimeError("cuda: secret detail"))
    tally = Tally()
    evs = events_of(await gather(stream_chat(src, REPLY, tally=tally)))
    assert deltas(evs[:2]) == [
        ({"role": "assistant", "content": ""}, None),
        ({"content": "a"}, None),
    ]
    assert evs[2] == {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert evs[3] == "[DONE]"
    assert isinstance(tally.error, RuntimeError)
    assert src.closed


async def test_an_openai_error_mid_stream_is_sent_as_it_is() -> None:
    src = ScriptedEvents([], fail=rate_limited("preempted"))
    evs = events_of(await gather(stream_completion(src, TEXT_REPLY)))
    assert evs[0]["error"]["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert evs[1] == "[DONE]"


async def test_events_that_end_without_a_finish_are_an_error() -> None:
    tally = Tally()
    evs = events_of(
        await gather(stream_chat(ScriptedEvents([GenEvent("a", 1)]), REPLY, tally=tally))
    )
    assert evs[-2]["error"]["type"] == "server_error"  # type: ignore[index]
    assert evs[-1] == "[DONE]"
    assert isinstance(tally.error, OpenAIError)


async def test_a_client_that_leaves_closes_the_engine() -> None:
    src = ScriptedEvents(steps("a", "b", "c"))
    stream = stream_chat(src, REPLY)
    await stream.__anext__()
    await stream.aclose()  # type: ignore[attr-defined]
    assert src.closed and src.read == 1


async def test_cancellation_propagates() -> None:
    class Hang(ScriptedEvents):
        async def __anext__(self) -> GenEvent:
            await asyncio.Event().wait()
            raise AssertionError

    src = Hang([])
    task = asyncio.ensure_future(gather(stream_chat(src, REPLY)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert src.closed


async def test_collect_completion() -> None:
    tally = Tally()
    body = await collect_completion(
        ScriptedEvents(steps("a", "", "b", finish="length")), TEXT_REPLY, tally=tally
    )
    doc = orjson.loads(body)
    assert doc["choices"] == [
        {"index": 0, "text": "ab", "logprobs": None, "finish_reason": "length"}
    ]
    assert doc["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert tally.finish_reason == "length"


async def test_collect_chat_with_a_stop() -> None:
    src = ScriptedEvents(steps("Hi.", " User:", " more"))
    doc = orjson.loads(await collect_chat(src, REPLY, stop=["User:"]))
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": "Hi. "}
    assert doc["choices"][0]["finish_reason"] == "stop"
    assert doc["usage"]["completion_tokens"] == 2
    assert src.closed


async def test_collect_lets_errors_propagate() -> None:
    tally = Tally()
    with pytest.raises(OpenAIError) as info:
        await collect_chat(ScriptedEvents([], fail=rate_limited("x", 1)), REPLY, tally=tally)
    assert info.value.status == 429
    assert tally.error is info.value
    with pytest.raises(OpenAIError, match="without a finish"):
        await collect_completion(ScriptedEvents([GenEvent("a", 1)]), TEXT_REPLY)
