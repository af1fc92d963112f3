"""Server-sent events as OpenAI streams them: ``data: <json>`` events, then ``data: [DONE]``.

Each event is one ``data:`` line and a blank line; JSON text holds no raw newline, so one
line always suffices. An error after the response has begun (its status already sent) goes
in-band, as vLLM sends it: ``data: {"error": {...}}``, then ``[DONE]``; the official clients
raise on an event whose ``error`` is set.
"""

from __future__ import annotations

from evenserve.worker.openai.errors import OpenAIError

#: The stream's last event.
SSE_DONE = b"data: [DONE]\n\n"
#: The response's content type.
SSE_CONTENT_TYPE = "text/event-stream"


def sse(data: bytes) -> bytes:
    """One event holding ``data`` (JSON text: no newlines)."""
    return b"data: " + data + b"\n\n"


def sse_error(err: OpenAIError) -> bytes:
    """An error event (``{"error": {"message", "type", "param", "code"}}``)."""
    return sse(err.body())
