"""The live progress line: elapsed, requests, errors, in flight, live P50/P99.

Refreshed once a second from the generator's own loop (no refresh thread: a thread rendering
under the GIL would delay sends). The line is short, so a refresh costs well under a
millisecond.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.text import Text

from evenserve.loadgen.spec import LiveStats


def render(stats: LiveStats, title: str = "") -> Text:
    p50, p99 = stats.percentiles()
    lat = "-" if p50 is None or p99 is None else f"P50 {p50:.1f} ms  P99 {p99:.1f} ms"
    elapsed = min(stats.elapsed_s, stats.duration_s) if not stats.draining else stats.elapsed_s
    state = "draining" if stats.draining else f"{elapsed:5.1f}/{stats.duration_s:g} s"
    rate = stats.ok / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
    t = Text()
    if title:
        t.append(f"{title}  ", style="bold")
    t.append(f"{state}  sent {stats.sent}  ok {stats.ok} ({rate:.0f}/s)  ")
    t.append(f"errors {stats.failed}", style="red" if stats.failed else "")
    if stats.failures:
        t.append(" (" + ", ".join(f"{k} {v}" for k, v in stats.failures.items()) + ")")
    t.append(f"  in flight {stats.in_flight}  {lat} (last {len(stats.recent_ms)} answers)")
    return t


@contextmanager
def live_progress(
    console: Console, title: str = "", enabled: bool = True
) -> Iterator[Callable[[LiveStats], None]]:
    """A progress callback for the generator, shown live on ``console`` while in use."""
    if not enabled:
        yield lambda _stats: None
        return
    if not console.is_terminal:
        # Logs and pipes: one plain line every 10 s instead of a redrawn one.
        last = [-10.0]
        drained = [False]

        def log(stats: LiveStats) -> None:
            if stats.draining:
                if drained[0] and stats.in_flight:
                    return
                drained[0] = True
            elif stats.elapsed_s - last[0] < 10.0:
                return
            last[0] = stats.elapsed_s
            console.print(render(stats, title), highlight=False, soft_wrap=True)

        yield log
        return
    with Live(Text(title), console=console, auto_refresh=False, transient=False) as live:

        def show(stats: LiveStats) -> None:
            live.update(render(stats, title), refresh=True)

        yield show
