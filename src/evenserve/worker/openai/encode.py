"""OpenAI's response bodies and stream chunks, as JSON bytes.

Nothing here reads a clock or a counter: the caller passes each answer's ``Reply`` (its id,
``created`` in whole seconds, the model's name and the prompt's token count). The shapes are
OpenAI's, as the official client's types read them:

* ``/v1/completions``: ``{"id": "cmpl-<n>", "object": "text_completion", "created", "model",
  "choices": [{"index": 0, "text", "logprobs": null, "finish_reason"}], "usage"}``; a stream
  sends the same object per chunk with the text's delta and ``finish_reason`` null until the
  last.
* ``/v1/chat/completions``: ``object`` ``chat.completion`` with ``choices[0].message``
  ``{"role": "assistant", "content"}``; a stream sends ``chat.completion.chunk`` objects whose
  ``choices[0].delta`` holds the role (first chunk) or the content's delta.
* ``usage``: ``{"prompt_tokens", "completion_tokens", "total_tokens"}``, and
  ``prompt_tokens_details: {"cached_tokens"}`` (the prompt tokens the engine's prefix cache
  gave, as vLLM reports them) when the engine said how many. With
  ``stream_options.include_usage`` every chunk carries ``"usage": null`` and a last chunk
  has ``choices: []`` and the usage.
* ``/v1/models``: ``{"object": "list", "data": [{"id", "object": "model", "created",
  "owned_by"}]}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

FinishReason = Literal["stop", "length"]
TEXT_COMPLETION = "text_completion"
CHAT_COMPLETION = "chat.completion"
CHAT_CHUNK = "chat.completion.chunk"


def completion_id(n: int) -> str:
    """A completion's id from a request counter."""
    return f"cmpl-{n}"


def chat_completion_id(n: int) -> str:
    """A chat completion's id from a request counter."""
    return f"chatcmpl-{n}"


@dataclass(frozen=True, slots=True)
class Reply:
    """What every body and chunk of one answer repeats."""

    id: str
    #: Unix time in whole seconds (the request's arrival).
    created: int
    model: str
    prompt_tokens: int


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI's usage object (``cached_tokens`` None: no ``prompt_tokens_details``)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def _head(reply: Reply, obj: str) -> dict[str, Any]:
    return {"id": reply.id, "object": obj, "created": reply.created, "model": reply.model}


def completion_body(
    reply: Reply,
    text: str,
    finish_reason: FinishReason,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """A whole ``/v1/completions`` answer."""
    body = _head(reply, TEXT_COMPLETION)
    body["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body["usage"] = usage(reply.prompt_tokens, completion_tokens, cached_tokens)
    return orjson.dumps(body)


def chat_completion_body(
    reply: Reply,
    content: str,
    finish_reason: FinishReason,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> bytes:
    """A whole ``/v1/chat/completions`` answer."""
    body = _head(reply, CHAT_COMPLETION)
    body["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    ]
    body["usage"] = usage(reply.prompt_tokens, completion_tokens, cached_tokens)
    return orjson.dumps(body)


def completion_chunk(
    reply: Reply, text: str, finish_reason: FinishReason | None = None, *, usage_null: bool = False
) -> bytes:
    """One streamed ``/v1/completions`` chunk (``usage_null``: with ``"usage": null``)."""
    chunk = _head(reply, TEXT_COMPLETION)
    chunk["choices"] = [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    ]
    if usage_null:
        chunk["usage"] = None
    return orjson.dumps(chunk)


def chat_chunk(
    reply: Reply,
    content: str | None,
    finish_reason: FinishReason | None = None,
    *,
    role: bool = False,
    usage_null: bool = False,
) -> bytes:
    """One streamed chat chunk: ``role`` adds ``"role": "assistant"`` to the delta (the
    first chunk's), ``content`` None leaves it out (a last chunk with nothing more to say)."""
    delta: dict[str, str] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    chunk = _head(reply, CHAT_CHUNK)
    chunk["choices"] = [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    ]
    if usage_null:
        chunk["usage"] = None
    return orjson.dumps(chunk)


def usage_chunk(
    reply: Reply, completion_tokens: int, *, chat: bool, cached_tokens: int | None = None
) -> bytes:
    """A stream's last chunk with ``stream_options.include_usage``: no choices, the usage."""
    chunk = _head(reply, CHAT_CHUNK if chat else TEXT_COMPLETION)
    chunk["choices"] = []
    chunk["usage"] = usage(reply.prompt_tokens, completion_tokens, cached_tokens)
    return orjson.dumps(chunk)


def models_body(names: Iterable[str], created: int, owned_by: str = "evenserve") -> bytes:
    """``GET /v1/models``: each model by name."""
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": owned_by}
                for name in names
            ],
        }
    )
