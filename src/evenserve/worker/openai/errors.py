"""The OpenAI API's errors: one exception that knows its HTTP status and its JSON body.

OpenAI answers every failure with ``{"error": {"message", "type", "param", "code"}}``; the
official clients read ``message`` and raise by status (400 BadRequestError, 404
NotFoundError, 429 RateLimitError, 5xx InternalServerError...). The factories here give the
status, ``type`` and ``code`` OpenAI uses for each case, so a server answers from one place:

* 400 ``invalid_request_error``: a malformed body or field (``param`` names the field, as
  ``messages.[0].role``), an unsupported value (``code`` ``unsupported_value``) or a prompt
  plus completion over the context (``code`` ``context_length_exceeded``).
* 404 ``invalid_request_error``, ``code`` ``model_not_found``: no such model.
* 429 ``requests``, ``code`` ``rate_limit_exceeded``: refused for load; ``retry_after_s`` is
  for the ``Retry-After`` header (the official clients honour it when they retry).
* 503 ``server_error``: the server or the model is loading, draining or overloaded.
* 504 ``server_error``: a deadline that cannot be or was not met.
* 500 ``server_error``: the engine failed.

``from_refusal`` maps evenserve's refusal reasons (``core.wire.REFUSAL_REASONS``) onto
these, with the reason as ``code`` (also sent in ``x-evenserve-reason`` by the server).
"""

from __future__ import annotations

import math

from evenserve.core.errors import EvenserveError
from evenserve.core.llm import openai_error_body
from evenserve.core.wire import MAX_NAME_LENGTH, REFUSAL_STATUS, shown_name

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
#: OpenAI's ``type`` for a request-rate limit (``tokens`` for a token-rate one).
RATE_LIMIT = "requests"


class OpenAIError(EvenserveError):
    """A failure to answer in OpenAI's shape: ``status`` and ``body()`` are the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = INVALID_REQUEST,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        #: Seconds for a ``Retry-After`` header (None: send none).
        self.retry_after_s = retry_after_s

    def to_dict(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        """The response body, ``{"error": {"message", "type", "param", "code"}}``."""
        return openai_error_body(self.message, self.type, self.param, self.code)

    def retry_after_header(self) -> str | None:
        """``Retry-After``'s value (whole seconds, rounded up, at least 1), or None."""
        if self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))

    def __repr__(self) -> str:
        return f"OpenAIError({self.status}, {self.message!r}, param={self.param!r})"


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """400: the body or a field is malformed (``param`` names the field)."""
    return OpenAIError(400, message, param=param, code=code)


def unsupported(param: str, message: str) -> OpenAIError:
    """400: a field this server does not honour was set to something other than its default."""
    return OpenAIError(400, message, param=param, code="unsupported_value")


def model_not_found(model: str) -> OpenAIError:
    """404: no model of that name (OpenAI's message and code; ``param`` null as OpenAI's)."""
    name = model if len(model) <= MAX_NAME_LENGTH else shown_name(model)
    return OpenAIError(404, f"The model `{name}` does not exist.", code="model_not_found")


def context_length_exceeded(
    max_model_len: int, prompt_tokens: int, max_tokens: int | None, *, chat: bool
) -> OpenAIError:
    """400: the prompt plus the completion asked for exceed the model's context.

    ``max_tokens`` None: the prompt alone fills the context (no room for one token)."""
    where = "messages" if chat else "prompt"
    head = f"This model's maximum context length is {max_model_len} tokens."
    if max_tokens is None:
        message = (
            f"{head} However, your {where} resulted in {prompt_tokens} tokens. "
            f"Please reduce the length of the {where}."
        )
    else:
        message = (
            f"{head} However, you requested {prompt_tokens + max_tokens} tokens "
            f"({prompt_tokens} in the {where}, {max_tokens} in the completion). "
            f"Please reduce the length of the {where} or completion."
        )
    return OpenAIError(400, message, param=where, code="context_length_exceeded")


def rate_limited(message: str, retry_after_s: float | None = None) -> OpenAIError:
    """429: refused for load; the client may retry after ``retry_after_s``."""
    return OpenAIError(
        429, message, type=RATE_LIMIT, code="rate_limit_exceeded", retry_after_s=retry_after_s
    )


def unavailable(
    message: str, retry_after_s: float | None = None, code: str | None = None
) -> OpenAIError:
    """503: the server or the model is not ready (loading, draining) or overloaded."""
    return OpenAIError(503, message, type=SERVER_ERROR, code=code, retry_after_s=retry_after_s)


def internal(
    message: str = "The server had an error while processing your request.",
) -> OpenAIError:
    """500: the engine failed (the message should not leak internals)."""
    return OpenAIError(500, message, type=SERVER_ERROR)


def from_refusal(reason: str, message: str, retry_after_s: float | None = None) -> OpenAIError:
    """An evenserve refusal (``core.wire.REFUSAL_REASONS``) in OpenAI's shape: the status
    evenserve gives the reason, ``code`` the reason itself; 429 is typed as a rate limit."""
    status = REFUSAL_STATUS.get(reason)
    if status is None:
        raise ValueError(f"not a refusal reason: {reason!r}")
    if status == 429:
        return OpenAIError(429, message, type=RATE_LIMIT, code=reason, retry_after_s=retry_after_s)
    return OpenAIError(status, message, type=SERVER_ERROR, code=reason, retry_after_s=retry_after_s)
