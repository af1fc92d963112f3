"""Chat messages to one prompt: the model's chat template, or a built-in one.

A model folder may give a Jinja2 chat template (Hugging Face's ``chat_template``); it is
rendered as Hugging Face and vLLM render it: a sandboxed, immutable environment with
``trim_blocks`` and ``lstrip_blocks``, the variables ``messages`` (``role`` and ``content``
each, content as text), ``add_generation_prompt``, ``bos_token``, ``eos_token``, a
``raise_exception`` the template calls to refuse a conversation, a ``tojson`` that keeps
non-ASCII text, and the request's ``chat_template_kwargs``. A template that does not compile
is a ConfigError (the model's folder is wrong); one that refuses the conversation (raises, or
reads an undefined variable) is a 400 on ``messages``.

Without a template the built-in one is used, plain and dependency-free:
``<|role|>\\n{content}\\n`` per message, then ``<|assistant|>\\n`` when the generation prompt
is asked for.

jinja2 is imported only when a template is given; without it the error names the package
(the ``torch`` and ``transformers`` extras bring it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from evenserve.core.errors import ConfigError
from evenserve.core.llm import Tokenizer
from evenserve.worker.openai.errors import OpenAIError, invalid_request
from evenserve.worker.openai.requests import ChatMessage, ChatRequest

if TYPE_CHECKING:
    import jinja2

#: Variables a template reads that ``chat_template_kwargs`` may not replace.
RESERVED_VARIABLES = frozenset(
    {"messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"}
)


class _TemplateRefusal(Exception):
    """What ``raise_exception`` raises inside a template."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRefusal(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _builtin(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
    parts = [f"<|{m['role']}|>\n{m['content']}\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


class ChatTemplate:
    """A compiled chat template (``source`` None: the built-in one)."""

    __slots__ = ("_compiled", "bos_token", "eos_token", "source")

    def __init__(self, source: str | None = None, *, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._compiled: jinja2.Template | None = None if source is None else _compile(source)

    def render(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages``; OpenAIError (400) if the template refuses it."""
        plain = [{"role": m.role, "content": m.content} for m in messages]
        if self._compiled is None:
            return _builtin(plain, add_generation_prompt)
        extra = dict(variables or {})
        clash = sorted(RESERVED_VARIABLES.intersection(extra))
        if clash:
            raise invalid_request(
                f"chat_template_kwargs: may not set {', '.join(clash)}", "chat_template_kwargs"
            )
        import jinja2

        try:
            return self._compiled.render(
                **extra,
                messages=plain,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except _TemplateRefusal as exc:
            raise invalid_request(f"messages: {exc}", "messages") from None
        except jinja2.TemplateError as exc:
            raise invalid_request(
                f"messages: the model's chat template cannot render them: {exc}", "messages"
            ) from None


def _compile(source: str) -> jinja2.Template:
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError(
            "this model's chat template needs jinja2: pip install jinja2 "
            "(the torch and transformers extras bring it)"
        ) from None
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"chat template: line {exc.lineno}: {exc.message}") from None


@functools.lru_cache(maxsize=32)
def _cached(source: str | None) -> ChatTemplate:
    return ChatTemplate(source)


def render_chat(
    messages: Sequence[ChatMessage],
    template: str | None,
    *,
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """``messages`` rendered by ``template`` (a Jinja2 source; None: the built-in one).

    Compiled templates are kept (a few, by source). ConfigError when ``template`` does not
    compile or jinja2 is missing; OpenAIError (400) when it refuses the messages."""
    return _cached(template).render(
        messages, add_generation_prompt=add_generation_prompt, variables=variables
    )


def chat_prompt_ids(
    request: ChatRequest, tokenizer: Tokenizer, template: ChatTemplate
) -> list[int]:
    """The chat request's prompt token ids: its messages rendered, then encoded."""
    text = template.render(
        request.messages,
        add_generation_prompt=request.add_generation_prompt,
        variables=request.chat_template_kwargs,
    )
    ids = tokenizer.encode(text)
    if not ids:
        raise OpenAIError(400, "messages: the prompt holds no tokens", param="messages")
    return ids
