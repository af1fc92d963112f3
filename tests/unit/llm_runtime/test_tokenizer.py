"""Tokenizers: the byte-level one, a local tokenizer.json, and incremental detokenizing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.llm import Tokenizer
from evenserve.runtime.base import RuntimeMissingError
from evenserve.runtime.llm.tokenizer import (
    ByteTokenizer,
    IncrementalDetokenizer,
    JsonTokenizer,
    load_tokenizer,
)

TEXT = "héllo wörld € 😀 ok"


def test_byte_tokenizer_round_trips_utf8_and_leaves_specials_out() -> None:
    tok = ByteTokenizer()
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert tok.vocab_size == 259 and tok.eos_token_id == 257
    assert tok.decode([*ids, tok.eos_token_id, tok.pad_token_id]) == TEXT
    assert ByteTokenizer(add_bos=True).encode("a") == [256, 97]


def test_byte_tokenizer_refuses_ids_outside_its_vocabulary() -> None:
    with pytest.raises(ValueError, match="259 is outside"):
        ByteTokenizer().decode([65, 259])


def _stream(tok: Tokenizer, ids: list[int], prompt: list[int] | None = None) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt or [])
    return [detok.push([i]) for i in ids] + [detok.flush()]


def test_detokenizer_never_sends_half_a_character() -> None:
    tok = ByteTokenizer()
    pieces = _stream(tok, tok.encode(TEXT), tok.encode("prompt: "))
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)
    # 'é' is two bytes: the first sends nothing, the second sends the character
    assert pieces[1:3] == ["", "é"]
    # the emoji is four bytes: three empty pieces, then the emoji
    start = len("héllo wörld € ".encode())
    assert pieces[start : start + 4] == ["", "", "", "😀"]


def test_detokenizer_sends_several_tokens_of_one_step_together_and_skips_eos() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("€uro")
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids[:2]) == ""  # two of the euro sign's three bytes
    assert detok.push(ids[2:4]) == "€u"
    assert detok.push([257]) == ""  # EOS has no text
    assert detok.push(ids[4:]) == "ro"
    assert detok.flush() == ""


def test_flush_sends_an_unfinished_character_as_a_replacement() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    assert detok.push([ord("a")]) == "a"
    assert detok.push(list("€".encode())[:2]) == ""
    assert detok.flush() == "\ufffd"


def test_load_tokenizer_byte_by_default_and_refuses_a_missing_file(tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(tmp_path, None), ByteTokenizer)
    assert isinstance(load_tokenizer(tmp_path, "byte"), ByteTokenizer)
    with pytest.raises(ConfigError, match=r"'meta-llama/Llama-2-7b' is not a local file"):
        load_tokenizer(tmp_path, "meta-llama/Llama-2-7b")


def test_a_missing_tokenizers_library_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(RuntimeMissingError, match=r"evenserve\[transformers\]"):
        load_tokenizer(tmp_path, "tokenizer.json")


def _trained(folder: Path) -> Path:
    """A small byte-level BPE tokenizer.json trained here (nothing downloaded)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT, "hello world", "the world is round"] * 20, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def test_tokenizer_json_round_trips_and_finds_its_eos(tmp_path: Path) -> None:
    _trained(tmp_path)
    tok = load_tokenizer(tmp_path, "tokenizer.json")
    assert isinstance(tok, JsonTokenizer)
    assert tok.eos_token == "</s>" and tok.eos_token_id == 1
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.decode([*ids, tok.eos_token_id]) == TEXT  # special tokens skipped
    assert tok.vocab_size <= 300


def test_tokenizer_json_eos_from_its_config_or_named(tmp_path: Path) -> None:
    _trained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    assert load_tokenizer(tmp_path, "tokenizer.json").eos_token_id == 2
    assert load_tokenizer(tmp_path, "tokenizer.json", eos_token="<s>").eos_token_id == 0
    with pytest.raises(ConfigError, match=r"eos_token '<\|eot_id\|>' is not in it"):
        load_tokenizer(tmp_path, "tokenizer.json", eos_token="<|eot_id|>")


def test_tokenizer_json_streams_the_same_text(tmp_path: Path) -> None:
    _trained(tmp_path)
    tok = load_tokenizer(tmp_path, "tokenizer.json")
    ids = tok.encode(TEXT)
    pieces = _stream(tok, ids, tok.encode("say: "))
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_a_broken_tokenizer_json_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load"):
        load_tokenizer(tmp_path, "tokenizer.json")


def test_the_llm_runtime_modules_import_without_the_frameworks() -> None:
    import subprocess

    code = (
        "import sys, evenserve.runtime.llm.tokenizer, evenserve.runtime.llm.torch_executor; "
        "bad = {'torch', 'transformers', 'tokenizers'} & set(sys.modules); "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
