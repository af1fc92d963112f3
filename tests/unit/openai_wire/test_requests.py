"""Request bodies: what is honoured, what is refused (400, the field named), what is ignored."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from evenserve.worker.openai import (
    OpenAIError,
    check_context,
    parse_chat,
    parse_completion,
    prompt_token_ids,
)

from .fakes import ByteTokenizer

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": USER, **fields}).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "hi", **fields}).encode()


def refused(parse: Any, body: bytes) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse(body)
    err = info.value
    assert err.status == 400
    assert err.type == "invalid_request_error"
    assert orjson.loads(err.body())["error"]["param"] == err.param
    return err


def test_chat_defaults_and_honoured_fields() -> None:
    r = parse_chat(
        chat(
            max_completion_tokens=7,
            max_tokens=99,
            stream=True,
            stream_options={"include_usage": True},
            ignore_eos=True,
            temperature=0,
            top_p=0.5,
            seed=3,
            stop="\n",
            n=1,
            logprobs=False,
            chat_template_kwargs={"enable_thinking": False},
        )
    )
    assert r.model == "m"
    assert r.messages[0].role == "user" and r.messages[0].content == "hi"
    assert r.max_new_tokens == 7
    assert r.stream and r.include_usage and r.ignore_eos
    assert (r.temperature, r.top_p, r.seed) == (0.0, 0.5, 3)
    assert r.stop == ("\n",)
    assert r.add_generation_prompt
    assert r.chat_template_kwargs == {"enable_thinking": False}
    assert r.ignored == ()


def test_chat_max_tokens_is_the_fallback() -> None:
    assert parse_chat(chat(max_tokens=5)).max_new_tokens == 5
    assert parse_chat(chat()).max_new_tokens is None
    assert not parse_chat(chat()).include_usage


def test_text_parts_are_joined_and_all_roles_read() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "developer", "content": "d"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "x", "name": "bot"},
        {"role": "tool", "content": "t", "tool_call_id": "c1"},
    ]
    r = parse_chat(orjson.dumps({"model": "m", "messages": msgs}))
    assert [m.role for m in r.messages] == ["system", "developer", "user", "assistant", "tool"]
    assert r.messages[2].content == "a\nb"
    assert r.messages[3].name == "bot" and r.messages[4].tool_call_id == "c1"


def test_unknown_fields_are_accepted_and_named() -> None:
    r = parse_chat(chat(user="u", metadata={"a": "b"}, frobnicate=1, store=False))
    assert r.ignored == ("frobnicate", "metadata", "store")
    c = parse_completion(completion(add_special_tokens=True))
    assert c.ignored == ("add_special_tokens",)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{", None, None),
        (b"[1]", None, None),
        (b'"x"', None, None),
        (b"[" * 100 + b"]" * 100, None, None),
        (orjson.dumps({"messages": USER}), "model", None),
        (orjson.dumps({"model": 3, "messages": USER}), "model", None),
        (orjson.dumps({"model": "", "messages": USER}), "model", None),
        (orjson.dumps({"model": "m"}), "messages", None),
        (orjson.dumps({"model": "m", "messages": []}), "messages", None),
        (orjson.dumps({"model": "m", "messages": "hi"}), "messages", None),
        (orjson.dumps({"model": "m", "messages": [{"content": "x"}]}), "messages.[0].role", None),
        (
            orjson.dumps({"model": "m", "messages": [*USER, {"role": "bot", "content": "x"}]}),
            "messages.[1].role",
            None,
        ),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "user"}]}),
            "messages.[0].content",
            None,
        ),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": None}]}),
            "messages.[0].content",
            None,
        ),
        (
            orjson.dumps(
                {
                    "model": "m",
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}
                    ],
                }
            ),
            "messages.[0].content",
            None,
        ),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [{"text": 1}]}]}),
            "messages.[0].content",
            None,
        ),
        (
            orjson.dumps(
                {
                    "model": "m",
                    "messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}],
                }
            ),
            "messages.[0].tool_calls",
            "unsupported_value",
        ),
        (chat(max_tokens="5"), "max_tokens", None),
        (chat(max_tokens=0), "max_tokens", None),
        (chat(max_tokens=1.5), "max_tokens", None),
        (chat(max_tokens=True), "max_tokens", None),
        (chat(max_completion_tokens=-1), "max_completion_tokens", None),
        (chat(max_tokens=int("9" * 50)), "max_tokens", None),
        (chat(stream="yes"), "stream", None),
        (chat(stream_options={"include_usage": True}), "stream_options", None),
        (
            chat(stream=True, stream_options={"include_usage": 1}),
            "stream_options.include_usage",
            None,
        ),
        (
            chat(stream=True, stream_options={"continuous_usage_stats": True}),
            "stream_options.continuous_usage_stats",
            "unsupported_value",
        ),
        (chat(temperature=3), "temperature", None),
        (chat(temperature="0"), "temperature", None),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
            "temperature",
            None,
        ),
        (chat(top_p=0), "top_p", None),
        (chat(seed=2**64), "seed", None),
        (chat(stop=5), "stop", None),
        (chat(stop=[""]), "stop", None),
        (chat(stop=["a", 1]), "stop", None),
        (chat(stop=["x"] * 17), "stop", None),
        (chat(stop="x" * 257), "stop", None),
        (chat(ignore_eos="true"), "ignore_eos", None),
        (chat(add_generation_prompt=0), "add_generation_prompt", None),
        (chat(chat_template_kwargs=[1]), "chat_template_kwargs", None),
        (chat(n=2), "n", "unsupported_value"),
        (chat(n=0), "n", "unsupported_value"),
        (chat(n="1"), "n", "unsupported_value"),
        (chat(logprobs=True), "logprobs", "unsupported_value"),
        (chat(top_logprobs=2), "top_logprobs", "unsupported_value"),
        (chat(echo=True), "echo", "unsupported_value"),
        (chat(frequency_penalty=0.5), "frequency_penalty", "unsupported_value"),
        (chat(presence_penalty=-1), "presence_penalty", "unsupported_value"),
        (chat(logit_bias={"5": 1}), "logit_bias", "unsupported_value"),
        (chat(tools=[{"type": "function"}]), "tools", "unsupported_value"),
        (chat(tool_choice="required"), "tool_choice", "unsupported_value"),
        (chat(functions=[{}]), "functions", "unsupported_value"),
        (chat(response_format={"type": "json_object"}), "response_format", "unsupported_value"),
        (chat(modalities=["text", "audio"]), "modalities", "unsupported_value"),
        (chat(audio={"voice": "x"}), "audio", "unsupported_value"),
        (chat(top_k=40), "top_k", "unsupported_value"),
        (chat(min_p=0.1), "min_p", "unsupported_value"),
        (chat(repetition_penalty=1.1), "repetition_penalty", "unsupported_value"),
        (chat(min_tokens=3), "min_tokens", "unsupported_value"),
        (chat(stop_token_ids=[2]), "stop_token_ids", "unsupported_value"),
        (chat(include_stop_str_in_output=True), "include_stop_str_in_output", "unsupported_value"),
        (chat(skip_special_tokens=False), "skip_special_tokens", "unsupported_value"),
        (chat(guided_json={}), "guided_json", "unsupported_value"),
        (chat(continue_final_message=True), "continue_final_message", "unsupported_value"),
        (chat(chat_template="{{ x }}"), "chat_template", "unsupported_value"),
        (chat(priority=5), "priority", "unsupported_value"),
    ],
)
def test_chat_refusals(body: bytes, param: str | None, code: str | None) -> None:
    err = refused(parse_chat, body)
    assert (err.param, err.code) == (param, code)
    if param is not None:
        assert err.message.startswith(param)


def test_defaults_of_refused_fields_are_accepted() -> None:
    r = parse_chat(
        chat(
            n=1,
            best_of=1,
            echo=False,
            logprobs=None,
            top_logprobs=0,
            frequency_penalty=0,
            presence_penalty=0.0,
            logit_bias={},
            tools=[],
            tool_choice="none",
            response_format={"type": "text"},
            modalities=["text"],
            top_k=-1,
            min_p=0,
            repetition_penalty=1,
            skip_special_tokens=True,
            priority=0,
            suffix="",
        )
    )
    assert r.ignored == ()


def test_completion_prompts() -> None:
    assert parse_completion(completion()).prompt == "hi"
    assert parse_completion(completion(prompt=["one"])).prompt == "one"
    assert parse_completion(completion(prompt=[1, 2, 3])).prompt == (1, 2, 3)
    assert parse_completion(completion(prompt=[[4, 5]])).prompt == (4, 5)
    assert parse_completion(completion(prompt="")).prompt == ""


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (orjson.dumps({"model": "m"}), "prompt", None),
        (completion(prompt=None), "prompt", None),
        (completion(prompt=5), "prompt", None),
        (completion(prompt=[]), "prompt", None),
        (completion(prompt=[[]]), "prompt", None),
        (completion(prompt=[1, "a"]), "prompt", None),
        (completion(prompt=[1, True]), "prompt", None),
        (completion(prompt=[-1]), "prompt", None),
        (completion(prompt=[["a"]]), "prompt", None),
        (completion(prompt=[{"a": 1}]), "prompt", None),
        (completion(prompt=["a", "b"]), "prompt", "unsupported_value"),
        (completion(prompt=[[1], [2]]), "prompt", "unsupported_value"),
        (completion(best_of=2), "best_of", "unsupported_value"),
        (completion(logprobs=0), "logprobs", "unsupported_value"),
        (completion(echo=True), "echo", "unsupported_value"),
        (completion(suffix="end"), "suffix", "unsupported_value"),
        (completion(prompt_logprobs=1), "prompt_logprobs", "unsupported_value"),
        (completion(max_tokens=-3), "max_tokens", None),
        (completion(stream_options={}), "stream_options", None),
    ],
)
def test_completion_refusals(body: bytes, param: str | None, code: str | None) -> None:
    err = refused(parse_completion, body)
    assert (err.param, err.code) == (param, code)


def test_prompt_token_ids() -> None:
    tok = ByteTokenizer()
    assert prompt_token_ids(parse_completion(completion(prompt="hé")), tok) == [104, 195, 169]
    assert prompt_token_ids(parse_completion(completion(prompt=[1, 256])), tok) == [1, 256]
    err = refused(lambda b: prompt_token_ids(parse_completion(b), tok), completion(prompt=[257]))
    assert err.param == "prompt" and "257" in err.message
    err = refused(lambda b: prompt_token_ids(parse_completion(b), tok), completion(prompt=""))
    assert err.param == "prompt"


def test_check_context() -> None:
    assert check_context(10, 5, 16, chat=True) == 5
    assert check_context(10, 6, 16, chat=True) == 6
    assert check_context(10, None, 16, chat=False) == 6
    with pytest.raises(OpenAIError) as info:
        check_context(10, 7, 16, chat=True)
    assert (info.value.status, info.value.code, info.value.param) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    assert "maximum context length is 16 tokens" in info.value.message
    assert "17 tokens (10 in the messages, 7 in the completion)" in info.value.message
    with pytest.raises(OpenAIError) as info:
        check_context(16, None, 16, chat=False)
    assert info.value.param == "prompt" and "resulted in 16 tokens" in info.value.message
