"""The bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions``, read and checked.

``parse_completion`` and ``parse_chat`` take the raw body and give a frozen request model or
raise ``OpenAIError`` (400, ``param`` naming the first bad field as OpenAI names it:
``max_tokens``, ``messages.[0].role``). The body is read by ``core.wire.parse_json``
(bounded nesting, bounded integers); fields are checked strictly, as OpenAI does (``"5"`` is
no integer, ``1`` no boolean).

What is honoured and what is refused (never silently dropped when it would change the
answer):

* Honoured: ``model``, ``prompt`` (a string, token ids, or a list of exactly one of either),
  ``messages`` (roles system, developer, user, assistant, tool; content a string or text
  parts), ``max_tokens`` / ``max_completion_tokens``, ``stream``,
  ``stream_options.include_usage``, ``stop`` (by ``StopMatcher`` on the streamed text),
  ``ignore_eos`` (vLLM's), ``add_generation_prompt`` and ``chat_template_kwargs`` (vLLM's, for
  the chat template). ``temperature``, ``top_p`` and ``seed`` are checked and carried for the
  engine to apply.
* Refused with 400 ``unsupported_value`` naming the field when set to anything but its
  default (``UNSUPPORTED``): ``n`` > 1, ``best_of``, ``echo``, ``logprobs``,
  ``top_logprobs``, ``suffix``, penalties, ``logit_bias``, tools and functions, structured
  output, audio, vLLM's sampling extensions (``top_k``, ``min_p``...), ``priority`` (evenserve
  reads a class from its header) and a request-supplied ``chat_template``.
* Anything else (``user``, ``metadata``, ``store``, a field this server has never heard of)
  is accepted and ignored, as vLLM does (OpenAI itself refuses unknown fields; vLLM's
  clients send extensions freely). ``request.ignored`` names them for the server's log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evenserve.core.llm import Tokenizer
from evenserve.core.wire import parse_json, shown
from evenserve.worker.openai.errors import (
    OpenAIError,
    context_length_exceeded,
    invalid_request,
    unsupported,
)

#: The most stop strings a request may give (OpenAI allows 4; vLLM's clients send more).
MAX_STOP_STRINGS = 16
#: The longest stop string, in characters.
MAX_STOP_LENGTH = 256

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False)


class StreamOptions(_Model):
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, extra="allow")

    include_usage: bool = False


class _Request(_Model):
    """Fields both endpoints share."""

    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    #: vLLM's: generate to ``max_tokens`` past the end-of-sequence token.
    ignore_eos: bool = False
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    #: The stop strings (``stop`` as a string is one of them).
    stop: tuple[str, ...] = ()
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of strings")
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(value)}")
        for s in value:
            if not isinstance(s, str) or not s:
                raise ValueError(f"each stop must be a non-empty string, got {shown(s)}")
            if len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"a stop string is at most {MAX_STOP_LENGTH} characters")
        return tuple(value)

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def ignored(self) -> tuple[str, ...]:
        """The fields that were accepted and have no effect (see the module docstring)."""
        extra = self.model_extra or {}
        return tuple(sorted(k for k in extra if k not in UNSUPPORTED))

    @property
    def max_new_tokens(self) -> int | None:
        """The most tokens to generate (None: up to the context's end)."""
        return self.max_tokens


class CompletionRequest(_Request):
    """``POST /v1/completions``; ``prompt`` is text, or token ids when a list."""

    prompt: str | tuple[int, ...]


class ChatMessage(_Model):
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, extra="allow")

    role: Role
    #: The text (text parts joined by newlines, as vLLM joins them).
    content: str
    name: str | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ValueError(f"part [{i}] must be an object with a type")
            if part["type"] != "text":
                raise ValueError(
                    f"only text content parts are supported, part [{i}] is {shown(part['type'])}"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part [{i}] must have a string text")
            texts.append(part["text"])
        return "\n".join(texts)


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    #: vLLM's: end the prompt with the assistant's turn opening (the template's).
    add_generation_prompt: bool = True
    #: vLLM's: more variables for the model's Jinja2 chat template.
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


# -- what is refused -----------------------------------------------------------------------------


def _one(v: Any) -> bool:
    return v is None or (type(v) is int and v == 1)


def _zero(v: Any) -> bool:
    return v is None or (type(v) in (int, float) and v == 0)


def _off(v: Any) -> bool:
    return v is None or v is False


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {} or v == ""


def _absent(v: Any) -> bool:
    return v is None


def _top_k_off(v: Any) -> bool:
    return v is None or (type(v) is int and v in (-1, 0))


def _unit(v: Any) -> bool:
    return v is None or (type(v) in (int, float) and v == 1)


def _tool_choice_off(v: Any) -> bool:
    return v is None or v in ("none", "auto")


def _text_format(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and v.get("type") == "text")


def _text_modality(v: Any) -> bool:
    return v is None or v == ["text"]


def _on(v: Any) -> bool:
    return v is None or v is True


_Check = tuple[Callable[[Any], bool], str]
_NOT_SUPPORTED = "not supported by this server"

#: Fields refused unless absent or at their default: field -> (accepts, what is supported).
UNSUPPORTED: Mapping[str, _Check] = {
    "n": (_one, "only one choice per request (n=1) is supported"),
    "best_of": (_one, "only best_of=1 is supported"),
    "echo": (_off, _NOT_SUPPORTED),
    "logprobs": (_off, _NOT_SUPPORTED),
    "top_logprobs": (_zero, _NOT_SUPPORTED),
    "prompt_logprobs": (_absent, _NOT_SUPPORTED),
    "suffix": (_empty, _NOT_SUPPORTED),
    "frequency_penalty": (_zero, _NOT_SUPPORTED),
    "presence_penalty": (_zero, _NOT_SUPPORTED),
    "repetition_penalty": (_unit, _NOT_SUPPORTED),
    "length_penalty": (_unit, _NOT_SUPPORTED),
    "logit_bias": (_empty, _NOT_SUPPORTED),
    "top_k": (_top_k_off, _NOT_SUPPORTED),
    "min_p": (_zero, _NOT_SUPPORTED),
    "min_tokens": (_zero, _NOT_SUPPORTED),
    "stop_token_ids": (_empty, _NOT_SUPPORTED),
    "include_stop_str_in_output": (_off, _NOT_SUPPORTED),
    "skip_special_tokens": (_on, "special tokens are always skipped"),
    "use_beam_search": (_off, _NOT_SUPPORTED),
    "tools": (_empty, _NOT_SUPPORTED),
    "tool_choice": (_tool_choice_off, _NOT_SUPPORTED),
    "functions": (_empty, _NOT_SUPPORTED),
    "function_call": (_tool_choice_off, _NOT_SUPPORTED),
    "response_format": (_text_format, "only text responses are supported"),
    "structured_outputs": (_absent, _NOT_SUPPORTED),
    "guided_json": (_absent, _NOT_SUPPORTED),
    "guided_regex": (_absent, _NOT_SUPPORTED),
    "guided_choice": (_absent, _NOT_SUPPORTED),
    "guided_grammar": (_absent, _NOT_SUPPORTED),
    "audio": (_absent, _NOT_SUPPORTED),
    "modalities": (_text_modality, "only the text modality is supported"),
    "prediction": (_absent, _NOT_SUPPORTED),
    "web_search_options": (_absent, _NOT_SUPPORTED),
    "continue_final_message": (_off, _NOT_SUPPORTED),
    "chat_template": (_absent, "the model's own chat template is used"),
    "priority": (_zero, "send the class in the x-evenserve-priority header"),
}


def _refuse_unsupported(raw: Mapping[str, Any]) -> None:
    for field in raw:
        check = UNSUPPORTED.get(field)
        if check is not None and not check[0](raw[field]):
            raise unsupported(field, f"{field}: {check[1]}, got {shown(raw[field])}")
    options = raw.get("stream_options")
    if isinstance(options, dict) and not _off(options.get("continuous_usage_stats")):
        raise unsupported(
            "stream_options.continuous_usage_stats",
            "stream_options.continuous_usage_stats: not supported by this server",
        )


# -- parsing -------------------------------------------------------------------------------------


def _param(loc: Sequence[int | str]) -> str:
    """A field's path as OpenAI writes it: ``messages.[0].content``."""
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in loc)


def _validation_error(err: ValidationError) -> OpenAIError:
    first = err.errors()[0]
    param = _param(first["loc"]) or None
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "missing":
        message = "required"
    return invalid_request(f"{param}: {message}" if param else message, param)


def _read_object(body: bytes) -> dict[str, Any]:
    try:
        raw = parse_json(body)
    except ValueError as exc:
        raise invalid_request(str(exc)) from None
    if not isinstance(raw, dict):
        raise invalid_request("body: expected a JSON object")
    return raw


def _check_stream_options(raw: Mapping[str, Any]) -> None:
    if raw.get("stream_options") is not None and raw.get("stream") is not True:
        raise invalid_request("stream_options: only allowed when stream is true", "stream_options")


def _prompt(value: Any) -> str | tuple[int, ...]:
    """A completion's one prompt: a string, token ids, or a list of one of either."""
    kinds = "a string, a list of token ids, or a list of one of either"
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        if value is None:
            raise invalid_request("prompt: required", "prompt")
        raise invalid_request(f"prompt: must be {kinds}, got {shown(value)}", "prompt")
    if not value:
        raise invalid_request("prompt: must not be empty", "prompt")
    if all(type(t) is int for t in value):
        if any(t < 0 for t in value):
            raise invalid_request("prompt: token ids must be >= 0", "prompt")
        return tuple(value)
    if all(isinstance(p, str | list) for p in value):
        if len(value) != 1:
            raise unsupported(
                "prompt", f"prompt: only one prompt per request is supported, got {len(value)}"
            )
        inner = value[0]
        if isinstance(inner, list) and not all(type(t) is int for t in inner):
            raise invalid_request("prompt: a nested prompt must be a list of token ids", "prompt")
        return _prompt(inner)
    raise invalid_request(f"prompt: must be {kinds}", "prompt")


def parse_completion(body: bytes) -> CompletionRequest:
    """A ``/v1/completions`` body, or OpenAIError (400) naming the first bad field."""
    raw = _read_object(body)
    _refuse_unsupported(raw)
    _check_stream_options(raw)
    raw["prompt"] = _prompt(raw.get("prompt"))
    try:
        return CompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def parse_chat(body: bytes) -> ChatRequest:
    """A ``/v1/chat/completions`` body, or OpenAIError (400) naming the first bad field."""
    raw = _read_object(body)
    _refuse_unsupported(raw)
    _check_stream_options(raw)
    messages = raw.get("messages")
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("tool_calls"):
                where = f"messages.[{i}].tool_calls"
                raise unsupported(where, f"{where}: tool calls are not supported by this server")
    try:
        return ChatRequest.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc) from None


# -- prompt tokens and the context ---------------------------------------------------------------


def prompt_token_ids(request: CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids: the text encoded, or the ids given (each below the
    vocabulary's size). 400 ``prompt`` when there are none."""
    if isinstance(request.prompt, str):
        ids = tokenizer.encode(request.prompt)
    else:
        ids = list(request.prompt)
        bad = next((t for t in ids if t >= tokenizer.vocab_size), None)
        if bad is not None:
            raise invalid_request(
                f"prompt: token id {bad} is out of the vocabulary (size {tokenizer.vocab_size})",
                "prompt",
            )
    if not ids:
        raise invalid_request("prompt: must hold at least one token", "prompt")
    return ids


def check_context(
    prompt_tokens: int, max_tokens: int | None, max_model_len: int, *, chat: bool
) -> int:
    """The most tokens to generate: ``max_tokens``, or what is left of the context when None
    (as vLLM). 400 ``context_length_exceeded`` when the prompt leaves no room, or the prompt
    plus ``max_tokens`` exceed ``max_model_len``."""
    if prompt_tokens >= max_model_len:
        raise context_length_exceeded(max_model_len, prompt_tokens, None, chat=chat)
    if max_tokens is None:
        return max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > max_model_len:
        raise context_length_exceeded(max_model_len, prompt_tokens, max_tokens, chat=chat)
    return max_tokens
