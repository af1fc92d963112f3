"""OpenAI's error bodies and statuses, one factory per case."""

from __future__ import annotations

import orjson
import pytest

from evenserve.core.wire import DEADLINE_EXPIRED, LOAD_TIMEOUT, QUEUE_FULL, SHED
from evenserve.worker.openai import errors


def test_body_is_openai_shape() -> None:
    e = errors.invalid_request("max_tokens: bad", "max_tokens")
    assert e.status == 400
    assert orjson.loads(e.body()) == {
        "error": {
            "message": "max_tokens: bad",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": None,
        }
    }
    assert e.retry_after_header() is None


def test_model_not_found() -> None:
    e = errors.model_not_found("gpt-x")
    assert (e.status, e.type, e.code, e.param) == (
        404,
        "invalid_request_error",
        "model_not_found",
        None,
    )
    assert e.message == "The model `gpt-x` does not exist."


def test_model_not_found_cuts_a_huge_name() -> None:
    assert len(errors.model_not_found("x" * 10_000).message) < 300


def test_context_length_exceeded_messages() -> None:
    e = errors.context_length_exceeded(4096, 4000, 200, chat=True)
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", "messages")
    assert e.message == (
        "This model's maximum context length is 4096 tokens. However, you requested 4200 "
        "tokens (4000 in the messages, 200 in the completion). Please reduce the length of "
        "the messages or completion."
    )
    e = errors.context_length_exceeded(4096, 5000, None, chat=False)
    assert e.param == "prompt"
    assert e.message == (
        "This model's maximum context length is 4096 tokens. However, your prompt resulted "
        "in 5000 tokens. Please reduce the length of the prompt."
    )


def test_rate_limited_carries_retry_after() -> None:
    e = errors.rate_limited("busy", retry_after_s=0.2)
    assert (e.status, e.type, e.code) == (429, "requests", "rate_limit_exceeded")
    assert e.retry_after_header() == "1"
    assert errors.rate_limited("busy", retry_after_s=2.5).retry_after_header() == "3"


def test_unavailable_and_internal_are_server_errors() -> None:
    e = errors.unavailable("loading", retry_after_s=5, code="loading")
    assert (e.status, e.type, e.code, e.retry_after_header()) == (
        503,
        "server_error",
        "loading",
        "5",
    )
    i = errors.internal()
    assert (i.status, i.type) == (500, "server_error")


@pytest.mark.parametrize(
    ("reason", "status", "type_"),
    [
        (QUEUE_FULL, 429, "requests"),
        (SHED, 429, "requests"),
        (DEADLINE_EXPIRED, 504, "server_error"),
        (LOAD_TIMEOUT, 503, "server_error"),
    ],
)
def test_from_refusal(reason: str, status: int, type_: str) -> None:
    e = errors.from_refusal(reason, "no", retry_after_s=1.0)
    assert (e.status, e.type, e.code, e.retry_after_header()) == (status, type_, reason, "1")


def test_from_refusal_refuses_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match="not a refusal reason"):
        errors.from_refusal("nope", "x")
