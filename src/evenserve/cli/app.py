"""The ``evenserve`` Typer app, the consoles every command prints to, and how a command fails.

Command modules import from here; ``cli.main`` registers their commands on :data:`app` (so no
command module imports ``cli.main``, and importing one registers nothing by side effect).
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="evenserve: serve many models on a shared GPU pool, and simulate it.",
)
# Wide tables stay readable in logs and pipes: without a terminal, do not wrap at 80 columns.
console = Console()
if not console.is_terminal:
    console.width = max(console.width, 200)
err_console = Console(stderr=True)


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with status 2 (bad input, clearly named)."""
    err_console.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)
