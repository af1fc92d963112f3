"""Stop strings on streamed text: cut the answer where the first one completed begins.

The engine stops on its end-of-sequence token and on ``max_tokens``; a request's ``stop``
strings are matched here, on the text as it is decoded step by step. A stop string may span
steps ("Hel" then "lo"), so the matcher holds back the longest tail of the text that could
still become one (a proper prefix of a stop string) and sends the rest. The generation stops
at the first stop string to be completed (the one that ends first; of two that end
together, the longer): the text before it is sent, the stop string and all after it are
dropped (as OpenAI and vLLM, whose default leaves the stop string out), and the generation
ends with ``finish_reason`` ``stop``. So the answer is the same however the text is split
into steps (vLLM's check, stop by stop in the request's order, is not). At the end of a
generation that met no stop string, ``flush`` gives back the held tail.

Work per step is bounded: the held tail is shorter than the longest stop string.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed decoded text step by step; ``feed`` gives what is safe to send now."""

    __slots__ = ("_held", "_stops", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        self._stops = tuple(stops)
        self._held = ""
        #: A stop string was found: the text ends here, ``feed`` gives nothing more.
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that may be sent after ``text`` arrived (maybe ""); on a stop string, the
        text before it and ``stopped`` becomes True."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        first: tuple[int, int] | None = None  # (end, start) of the first stop completed
        for s in self._stops:
            at = buf.find(s)
            if at >= 0 and (first is None or (at + len(s), at) < first):
                first = (at + len(s), at)
        if first is not None:
            self.stopped = True
            self._held = ""
            return buf[: first[1]]
        keep = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held tail, at the end of a generation that met no stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
