"""Chat messages to a prompt: the built-in template and a model's Jinja2 template."""

from __future__ import annotations

import sys

import pytest

from evenserve.core.errors import ConfigError
from evenserve.worker.openai import ChatTemplate, OpenAIError, chat_prompt_ids, render_chat
from evenserve.worker.openai.requests import ChatMessage, parse_chat

from .fakes import ByteTokenizer

MESSAGES = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Hi"),
    ChatMessage(role="assistant", content="Hello."),
    ChatMessage(role="user", content="Bye"),
]

#: ChatML, as many models' tokenizer_config.json give it.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_builtin_template() -> None:
    assert render_chat(MESSAGES, None) == (
        "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.\n<|user|>\nBye\n<|assistant|>\n"
    )
    assert render_chat(MESSAGES[:2], None, add_generation_prompt=False) == (
        "<|system|>\nBe brief.\n<|user|>\nHi\n"
    )


def test_jinja_template() -> None:
    assert render_chat(MESSAGES[:2], CHATML) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_template_variables_and_tokens() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}{% endfor %}"
        "{% if think %}<think>{% endif %}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    got = t.render([ChatMessage(role="user", content="é")], variables={"think": True})
    assert got == '<s>"é"<think></s>'


def test_a_template_that_refuses_is_a_400_on_messages() -> None:
    t = ChatTemplate(
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversation roles must start with user') }}{% endif %}"
    )
    with pytest.raises(OpenAIError) as info:
        t.render(MESSAGES)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert "must start with user" in info.value.message


def test_a_template_error_while_rendering_is_a_400() -> None:
    t = ChatTemplate("{{ messages[5].content }}")
    with pytest.raises(OpenAIError) as info:
        t.render(MESSAGES[:1])
    assert info.value.param == "messages"


def test_kwargs_may_not_replace_the_templates_inputs() -> None:
    with pytest.raises(OpenAIError) as info:
        ChatTemplate(CHATML).render(MESSAGES, variables={"messages": []})
    assert info.value.param == "chat_template_kwargs"


def test_the_sandbox_refuses_unsafe_access() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(OpenAIError):
        t.render(MESSAGES)


def test_a_template_that_does_not_compile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="line 1"):
        ChatTemplate("{% for m in messages %}")


def test_without_jinja2_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ConfigError, match="jinja2"):
        ChatTemplate("{{ 1 }}")
    assert ChatTemplate(None).render(MESSAGES[1:2]) == "<|user|>\nHi\n<|assistant|>\n"


def test_chat_prompt_ids() -> None:
    r = parse_chat(
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}],'
        b' "add_generation_prompt": false}'
    )
    assert chat_prompt_ids(r, ByteTokenizer(), ChatTemplate()) == list(b"<|user|>\nx\n")
    with pytest.raises(OpenAIError) as info:
        chat_prompt_ids(r, ByteTokenizer(), ChatTemplate("{{ '' }}"))
    assert info.value.param == "messages"
