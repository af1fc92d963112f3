"""Tokenizers for LLMs: the built-in byte-level one, a local ``tokenizer.json``, and the
incremental detokenizer streaming uses.

:class:`ByteTokenizer` needs no file: ids 0-255 are the UTF-8 bytes of the text, then the
special tokens (BOS, EOS, PAD) follow, so ``vocab_size`` is 259. Tests and random-weight
models use it (a model built for it has that vocabulary).

:class:`JsonTokenizer` wraps a local ``tokenizer.json`` (the ``tokenizers`` library, which the
``transformers`` extra brings; imported only when one is loaded). Its EOS token is the one
named (``eos_token``), else the one ``tokenizer_config.json`` beside it names, else the first
added special token with a usual EOS name. Nothing is downloaded: the spec is a file path.

:class:`IncrementalDetokenizer` turns the ids of a generation into text a step at a time. A
token can end in the middle of a UTF-8 character (a byte-level token, or a byte-fallback
piece), and a word-piece tokenizer decodes a token differently after a neighbour (the leading
space of SentencePiece). So, as text-generation-inference and vLLM do, it decodes a window
from one token before the text already sent (``prefix``) to the end and sends what the window
adds after the text of ``prefix..read``; while the decoded window ends in U+FFFD (a character
not finished yet) it sends nothing and waits for the next token. ``flush`` sends the rest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evenserve.core.errors import ConfigError
from evenserve.core.llm import Tokenizer
from evenserve.runtime.base import require

#: What a special-token name usually is for end-of-sequence (the first found wins).
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<eos>", "<|im_end|>")

REPLACEMENT = "\ufffd"


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; BOS, EOS and PAD after them (see the module docstring)."""

    BYTES = 256

    def __init__(self, add_bos: bool = False) -> None:
        self.add_bos = add_bos
        self.bos_token_id: int = self.BYTES
        self.eos_token_id: int | None = self.BYTES + 1
        self.pad_token_id: int = self.BYTES + 2
        self.vocab_size: int = self.BYTES + 3

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if self.add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; special tokens are left out, an unfinished or invalid UTF-8
        sequence decodes as U+FFFD."""
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})"
                )
        return bytes(i for i in ids if i < self.BYTES).decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        return {
            "tokenizer": "byte",
            "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
        }


class JsonTokenizer:
    """A local ``tokenizer.json`` through the ``tokenizers`` library."""

    def __init__(self, path: Path, eos_token: str | None = None) -> None:
        tokenizers = require("tokenizers", "transformers")
        try:
            self._tok: Any = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception types
            raise ConfigError(f"tokenizer {path}: cannot load: {exc}") from None
        self.path = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eos_token: str | None = eos_token or _configured_eos(path.parent) or self._usual_eos()
        self.eos_token_id: int | None = None
        if self.eos_token is not None:
            found = self._tok.token_to_id(self.eos_token)
            if found is None:
                raise ConfigError(f"tokenizer {path}: eos_token {self.eos_token!r} is not in it")
            self.eos_token_id = int(found)

    def _usual_eos(self) -> str | None:
        added = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        return next((name for name in EOS_NAMES if name in added), None)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def describe(self) -> dict[str, Any]:
        return {
            "tokenizer": str(self.path.name),
            "vocab_size": self.vocab_size,
            "eos_token": self.eos_token,
            "eos_token_id": self.eos_token_id,
        }


def _configured_eos(folder: Path) -> str | None:
    """The EOS token ``tokenizer_config.json`` in ``folder`` names, if it is there."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    eos = doc.get("eos_token") if isinstance(doc, dict) else None
    if isinstance(eos, dict):  # an AddedToken written out: {"content": "</s>", ...}
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def load_tokenizer(
    model_dir: Path, spec: str | None, eos_token: str | None = None
) -> ByteTokenizer | JsonTokenizer:
    """The tokenizer ``spec`` names: None or ``byte`` for the built-in byte-level one, else a
    local ``tokenizer.json`` (relative to ``model_dir``; an absolute path stays as it is).
    ``eos_token`` names the EOS token of a file (the byte tokenizer's is fixed)."""
    if spec is None or spec == "byte":
        return ByteTokenizer()
    path = model_dir / spec
    if not path.is_file():
        raise ConfigError(
            f"tokenizer: {spec!r} is not a local file ({path}); give the path of a "
            "tokenizer.json or 'byte' (nothing is downloaded)"
        )
    return JsonTokenizer(path, eos_token)


class IncrementalDetokenizer:
    """Token ids in, a step at a time; the text they add out (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        #: The prompt's last token is the context of the first output token's text.
        self._ids: list[int] = list(prompt_ids[-1:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, ids: Sequence[int]) -> str:
        """The text ``ids`` (this step's new tokens) complete; "" while a character is
        unfinished (it comes with a later push or with ``flush``)."""
        self._ids.extend(ids)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        if len(text) > len(before) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(before) :]
        return ""

    def flush(self) -> str:
        """What is left unsent at the end (an unfinished character decodes as U+FFFD)."""
        before = self._tok.decode(self._ids[self._prefix : self._read])
        text = self._tok.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(before) :]


if TYPE_CHECKING:  # both implement core.llm.Tokenizer (checked statically, never run)

    def _tokenizers(b: ByteTokenizer, j: JsonTokenizer) -> tuple[Tokenizer, Tokenizer]:
        return b, j
