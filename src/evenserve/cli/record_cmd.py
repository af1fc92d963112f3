"""``evenserve record``: pull a running gateway's request log into one replayable trace.

The admin token is read from a file or the environment, never from the command line, and is
never printed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from evenserve.cli.app import err_console, fail

#: Where the token comes from without --token-file (the gateway's default variable).
TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"


def record(
    url: Annotated[str, typer.Argument(help="The gateway, e.g. http://127.0.0.1:8000.")],
    out: Annotated[Path, typer.Option(help="The trace (JSONL) to write.")],
    duration: Annotated[float, typer.Option(help="Seconds to pull for.")],
    token_file: Annotated[
        Path | None,
        typer.Option(help=f"File holding the gateway's admin token (default: ${TOKEN_ENV})."),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between pulls.")] = 1.0,
) -> None:
    """Pull GET /admin/log every --interval seconds for --duration seconds and write one
    trace (deduplicated by the records' seq) that replays as a trace workload."""
    from evenserve.experiment.record import PullError, pull_log

    if not duration >= 0:
        fail("--duration: must be >= 0")
    if not interval > 0:
        fail("--interval: must be > 0")
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            fail(f"--token-file: cannot read {token_file}: {exc.strerror}")
            return
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        fail(f"--token-file: no admin token (give --token-file or set ${TOKEN_ENV})")
    try:
        res = pull_log(url, token, out, duration, interval_s=interval)
    except PullError as exc:
        fail(str(exc))
        return
    err_console.print(
        f"wrote {res.records} records to {res.out} ({res.pulls} pulls, {res.failed_pulls} failed)",
        highlight=False,
    )
