"""What a live run prints beside its figures: its errors, resent requests, scheduling lag."""

from __future__ import annotations

from rich.console import Console

from evenserve.loadgen.spec import LoadResult
from evenserve.loadgen.target import error_lines


def lag_line(result: LoadResult) -> str:
    lag = result.lag_ms
    if not lag.get("count"):
        return "scheduling lag: no sends measured"
    return (
        f"scheduling lag (actual - intended send time) over {lag['count']} sends: "
        f"P50 {lag['p50']:.3f} ms, P99 {lag['p99']:.3f} ms, max {lag['max']:.3f} ms "
        f"(generator thread: {result.priority})"
    )


def print_errors(result: LoadResult, console: Console) -> None:
    """The run's abort reason, errors by kind, and requests resent after a keep-alive race."""
    total = len(result.samples)
    if result.aborted:
        console.print(f"[bold red]{result.aborted}[/]", highlight=False, soft_wrap=True)
    if result.errors:
        console.print("[bold]errors[/]", highlight=False)
        for line in error_lines(result.errors, total):
            console.print("  " + line, highlight=False, soft_wrap=True)
    resent = result.connections.get("resent_stale", 0)
    if resent:
        console.print(
            f"resent: {resent} of {total} requests went out again on a fresh connection: the "
            "server closed the reused keep-alive connection before answering (a keep-alive "
            "race; per request: samples.jsonl 'resent'; run.json 'connections')",
            highlight=False,
            soft_wrap=True,
        )
