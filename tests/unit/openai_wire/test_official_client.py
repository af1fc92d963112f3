"""Our bytes read by the official ``openai`` client: its SSE decoder and its types, then the
client itself over an in-process transport (no server, no socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from evenserve.worker.openai import (
    SSE_CONTENT_TYPE,
    GenEvent,
    OpenAIError,
    Reply,
    check_context,
    collect_chat,
    collect_completion,
    model_not_found,
    models_body,
    parse_chat,
    parse_completion,
    prompt_token_ids,
    rate_limited,
    stream_chat,
    stream_completion,
)
from evenserve.worker.openai.chat import ChatTemplate, chat_prompt_ids

from .fakes import ByteTokenizer, ScriptedEvents, gather, steps

openai = pytest.importorskip("openai")
from openai._streaming import SSEDecoder  # noqa: E402
from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

REPLY = Reply("chatcmpl-3", 1700000000, "tiny", 6)
TEXT_REPLY = Reply("cmpl-3", 1700000000, "tiny", 6)


def decoded(items: list[bytes]) -> list[str]:
    return [sse.data for sse in SSEDecoder().iter_bytes(iter(items))]


async def test_chat_chunks_are_official_chunks() -> None:
    items = await gather(
        stream_chat(ScriptedEvents(steps("Hel", "lo", "")), REPLY, include_usage=True)
    )
    datas = decoded(items)
    assert datas[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(d) for d in datas[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 9


async def test_completion_chunks_are_official_completions() -> None:
    items = await gather(stream_completion(ScriptedEvents(steps("a", "b")), TEXT_REPLY))
    datas = decoded(items)
    assert datas[-1] == "[DONE]"
    last = Completion.model_validate_json(datas[-2])
    assert (last.choices[0].text, last.choices[0].finish_reason) == ("b", "stop")
    # A chunk before the last has finish_reason null, as OpenAI streams it (the client reads
    # chunks without validation; its type has no null there): nothing else is amiss.
    with pytest.raises(Exception) as info:
        Completion.model_validate_json(datas[0])
    assert [e["loc"] for e in info.value.errors()] == [("choices", 0, "finish_reason")]  # type: ignore[attr-defined]


async def test_bodies_are_official_objects() -> None:
    chat = ChatCompletion.model_validate_json(
        await collect_chat(ScriptedEvents(steps("Hi", finish="length")), REPLY)
    )
    assert chat.choices[0].message.content == "Hi"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 1
    text = Completion.model_validate_json(
        await collect_completion(ScriptedEvents(steps("Yo")), TEXT_REPLY)
    )
    assert text.choices[0].text == "Yo" and text.object == "text_completion"


# -- the official client against an in-process server ------------------------------------------

MAX_MODEL_LEN = 64


def _error(err: OpenAIError) -> httpx.Response:
    headers = {"content-type": "application/json"}
    retry_after = err.retry_after_header()
    if retry_after is not None:
        headers["retry-after"] = retry_after
    return httpx.Response(err.status, content=err.body(), headers=headers)


async def _serve(request: httpx.Request) -> httpx.Response:
    """A minimal front: the wiring a server does, over a scripted engine that answers
    every prompt with "Hello, world" in three steps."""
    tok = ByteTokenizer()
    if request.url.path == "/v1/models":
        return httpx.Response(200, content=models_body(["tiny"], 1700000000))
    body = await request.aread()
    try:
        if request.url.path == "/v1/chat/completions":
            req = parse_chat(body)
            chat = True
            ids = chat_prompt_ids(req, tok, ChatTemplate())
        else:
            creq = parse_completion(body)
            req, chat = creq, False
            ids = prompt_token_ids(creq, tok)
        if req.model == "busy":
            raise rate_limited("The model's queue is full.", retry_after_s=0.5)
        if req.model != "tiny":
            raise model_not_found(req.model)
        max_tokens = check_context(len(ids), req.max_new_tokens, MAX_MODEL_LEN, chat=chat)
    except OpenAIError as err:
        return _error(err)
    texts = ["Hello", ",", " world"][:max_tokens]
    events = ScriptedEvents(steps(*texts, finish="stop" if max_tokens >= 3 else "length"))
    reply = Reply("chatcmpl-9" if chat else "cmpl-9", 1700000000, req.model, len(ids))
    if not req.stream:
        collect = collect_chat if chat else collect_completion
        return httpx.Response(200, content=await collect(events, reply, stop=req.stop))
    drive = stream_chat if chat else stream_completion
    stream: AsyncIterator[bytes] = drive(
        events, reply, stop=req.stop, include_usage=req.include_usage
    )
    return httpx.Response(200, content=stream, headers={"content-type": SSE_CONTENT_TYPE})


@pytest.fixture
def client() -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key="unused",
        base_url="http://worker/v1",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(_serve)),
    )


async def test_client_chat_streamed(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello, world"
    )
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(b"<|user|>\nhi\n<|assistant|>\n")
    assert chunks[-1].usage.completion_tokens == 3


async def test_client_chat_whole_with_a_stop(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stop=[","]
    )
    assert answer.choices[0].message.content == "Hello"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.id == "chatcmpl-9" and answer.object == "chat.completion"


async def test_client_completion_streamed_and_whole(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(model="tiny", prompt=[1, 2, 3], stream=True)
    texts = [c.choices[0].text async for c in stream]
    assert "".join(texts) == "Hello, world"
    whole = await client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert whole.choices[0].text == "Hello,"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.total_tokens == 4


async def test_client_models(client: openai.AsyncOpenAI) -> None:
    page = await client.models.list()
    assert [m.id for m in page.data] == ["tiny"]


async def test_client_errors(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert (bad.value.param, bad.value.code, bad.value.type) == (
        "n",
        "unsupported_value",
        "invalid_request_error",
    )
    with pytest.raises(openai.NotFoundError) as missing:
        await client.completions.create(model="nope", prompt="hi")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        await client.completions.create(model="tiny", prompt="x" * 60, max_tokens=10)
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.RateLimitError) as busy:
        await client.completions.create(model="busy", prompt="hi")
    assert busy.value.response.headers["retry-after"] == "1"


async def test_client_raises_on_an_error_mid_stream() -> None:
    async def serve(request: httpx.Request) -> httpx.Response:
        events = ScriptedEvents([GenEvent("a", 1)], fail=RuntimeError("boom"))
        stream = stream_chat(events, REPLY)
        return httpx.Response(200, content=stream, headers={"content-type": SSE_CONTENT_TYPE})

    client = openai.AsyncOpenAI(
        api_key="unused",
        base_url="http://worker/v1",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(serve)),
    )
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    got = []
    with pytest.raises(openai.APIError, match="The server had an error"):
        async for c in stream:
            got.append(c.choices[0].delta.content)
    assert got == ["", "a"]
