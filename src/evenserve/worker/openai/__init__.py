"""The OpenAI-compatible API's wire layer, transport-free: requests read and checked, chat
templates, response bodies and stream chunks, SSE framing, and the drivers from engine events
to answers. A server wires it to the engine and writes the bytes it gives.

Modules: ``requests`` (``parse_completion``, ``parse_chat``, ``check_context``), ``errors``
(``OpenAIError`` and its factories), ``chat`` (``ChatTemplate``, ``render_chat``), ``stop``
(``StopMatcher``), ``encode`` (bodies and chunks), ``sse`` (framing), ``stream``
(``GenEvent``, ``stream_chat``, ``collect_chat``...).
"""

from evenserve.worker.openai.chat import ChatTemplate, chat_prompt_ids, render_chat
from evenserve.worker.openai.encode import (
    FinishReason,
    Reply,
    chat_chunk,
    chat_completion_body,
    chat_completion_id,
    completion_body,
    completion_chunk,
    completion_id,
    models_body,
    usage_chunk,
)
from evenserve.worker.openai.errors import (
    OpenAIError,
    context_length_exceeded,
    from_refusal,
    internal,
    invalid_request,
    model_not_found,
    rate_limited,
    unavailable,
    unsupported,
)
from evenserve.worker.openai.requests import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    check_context,
    parse_chat,
    parse_completion,
    prompt_token_ids,
)
from evenserve.worker.openai.sse import SSE_CONTENT_TYPE, SSE_DONE, sse, sse_error
from evenserve.worker.openai.stop import StopMatcher
from evenserve.worker.openai.stream import (
    GenEvent,
    Tally,
    collect_chat,
    collect_completion,
    stream_chat,
    stream_completion,
)

__all__ = [
    "SSE_CONTENT_TYPE",
    "SSE_DONE",
    "ChatMessage",
    "ChatRequest",
    "ChatTemplate",
    "CompletionRequest",
    "FinishReason",
    "GenEvent",
    "OpenAIError",
    "Reply",
    "StopMatcher",
    "Tally",
    "chat_chunk",
    "chat_completion_body",
    "chat_completion_id",
    "chat_prompt_ids",
    "check_context",
    "collect_chat",
    "collect_completion",
    "completion_body",
    "completion_chunk",
    "completion_id",
    "context_length_exceeded",
    "from_refusal",
    "internal",
    "invalid_request",
    "model_not_found",
    "models_body",
    "parse_chat",
    "parse_completion",
    "prompt_token_ids",
    "rate_limited",
    "render_chat",
    "sse",
    "sse_error",
    "stream_chat",
    "stream_completion",
    "unavailable",
    "unsupported",
    "usage_chunk",
]
