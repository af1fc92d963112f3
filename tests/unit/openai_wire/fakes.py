"""Fakes of the OpenAI wire layer's tests: a byte tokenizer and scripted engine events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence

from evenserve.worker.openai import GenEvent


class ByteTokenizer:
    """One token per UTF-8 byte; 256 is the end of sequence."""

    eos_token_id: int | None = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class ScriptedEvents:
    """An engine's events from a script; records whether the driver closed it early, and
    raises ``fail`` after the script when given."""

    def __init__(self, events: Iterable[GenEvent], fail: BaseException | None = None) -> None:
        self._events = list(events)
        self._fail = fail
        self.read = 0
        self.closed = False

    def __aiter__(self) -> AsyncIterator[GenEvent]:
        return self

    async def __anext__(self) -> GenEvent:
        if self.closed:
            raise StopAsyncIteration
        if self.read < len(self._events):
            self.read += 1
            return self._events[self.read - 1]
        if self._fail is not None:
            raise self._fail
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


def steps(*texts: str, finish: str = "stop") -> list[GenEvent]:
    """One event per text, one token each, the last finishing with ``finish``."""
    out = [GenEvent(t, 1) for t in texts[:-1]]
    out.append(GenEvent(texts[-1], 1, finish))  # type: ignore[arg-type]
    return out


async def gather(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [c async for c in chunks]
