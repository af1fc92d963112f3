"""Golden bodies and chunks: the exact bytes of each."""

from __future__ import annotations

from evenserve.worker.openai import (
    SSE_DONE,
    Reply,
    chat_chunk,
    chat_completion_body,
    chat_completion_id,
    completion_body,
    completion_chunk,
    completion_id,
    internal,
    models_body,
    sse,
    sse_error,
    usage_chunk,
)

CHAT = Reply(chat_completion_id(7), 1700000000, "tiny", 5)
TEXT = Reply(completion_id(7), 1700000000, "tiny", 5)
HEAD_CHAT = (
    b'{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,"model":"tiny"'
)
HEAD_TEXT = b'{"id":"cmpl-7","object":"text_completion","created":1700000000,"model":"tiny"'


def test_completion_body() -> None:
    assert completion_body(TEXT, "Hi there", "length", 3) == (
        HEAD_TEXT + b',"choices":[{"index":0,"text":"Hi there","logprobs":null,'
        b'"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}'
    )


def test_chat_completion_body() -> None:
    assert chat_completion_body(CHAT, "Hé", "stop", 2) == (
        b'{"id":"chatcmpl-7","object":"chat.completion","created":1700000000,"model":"tiny",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"H\xc3\xa9"},'
        b'"logprobs":null,"finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}'
    )


def test_completion_chunks() -> None:
    assert completion_chunk(TEXT, "a") == (
        HEAD_TEXT + b',"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}'
    )
    assert completion_chunk(TEXT, "", "stop", usage_null=True) == (
        HEAD_TEXT + b',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop"}],'
        b'"usage":null}'
    )


def test_chat_chunks() -> None:
    assert chat_chunk(CHAT, "", role=True) == (
        HEAD_CHAT + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
        b'"logprobs":null,"finish_reason":null}]}'
    )
    assert chat_chunk(CHAT, "x\n") == (
        HEAD_CHAT + b',"choices":[{"index":0,"delta":{"content":"x\\n"},'
        b'"logprobs":null,"finish_reason":null}]}'
    )
    assert chat_chunk(CHAT, None, "length", usage_null=True) == (
        HEAD_CHAT + b',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],'
        b'"usage":null}'
    )


def test_usage_chunks() -> None:
    usage = b'"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}'
    assert usage_chunk(CHAT, 4, chat=True) == HEAD_CHAT + b',"choices":[],' + usage
    assert usage_chunk(TEXT, 4, chat=False) == HEAD_TEXT + b',"choices":[],' + usage


def test_models_body() -> None:
    assert models_body(["a", "b"], 12) == (
        b'{"object":"list","data":['
        b'{"id":"a","object":"model","created":12,"owned_by":"evenserve"},'
        b'{"id":"b","object":"model","created":12,"owned_by":"evenserve"}]}'
    )
    assert models_body([], 0, owned_by="x") == b'{"object":"list","data":[]}'


def test_sse_framing() -> None:
    assert sse(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"
    assert sse_error(internal("boom")) == (
        b'data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}\n\n'
    )
