"""Server-sent events (the ``text/event-stream`` format OpenAI-style servers stream in), cut
from a byte stream that arrives in arbitrary pieces, sans I/O.

An event is its ``data:`` lines joined by newlines, named by its ``event:`` line (default
``message``), ended by a blank line; lines end in LF or CRLF; comment lines (``:``) and other
fields are skipped. A field's value loses one leading space.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    event: str
    data: str


class SseParser:
    """Server-sent events from a byte stream fed in arbitrary pieces (sans I/O)."""

    __slots__ = ("_buf", "_data", "_event")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events that ``chunk`` completes, in order."""
        buf = self._buf + chunk
        out: list[SseEvent] = []
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl].rstrip(b"\r").decode("utf-8", errors="replace")
            start = nl + 1
            if not line:
                if self._data or self._event:
                    out.append(SseEvent(self._event or "message", "\n".join(self._data)))
                self._data, self._event = [], ""
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        self._buf = buf[start:]
        return out
