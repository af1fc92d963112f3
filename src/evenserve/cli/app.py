"""The ``evenserve`` Typer app, the consoles every command prints to, and how a command fails.

Command modules import from here; ``cli.main`` registers their commands on :data:`app` (so no
command module imports ``cli.main``, and importing one registers nothing by side effect).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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


def _print_version(value: bool) -> None:
    if value:
        from evenserve import __version__

        console.print(f"evenserve {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """evenserve: serve many models on a shared GPU pool, and simulate it."""


def write_json(path: Path, obj: Any) -> None:
    """``--json PATH``: the object as indented JSON in the file (its folder made), or on
    stdout when PATH is ``-``."""
    text = json.dumps(obj, indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def parse_batch_sizes(text: str) -> list[int]:
    """``--batch-sizes 1,2,4,8``: distinct, ascending; a clear error otherwise."""
    try:
        sizes = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        fail(f"--batch-sizes: expected integers like 1,2,4,8 (got {text!r})")
    if not sizes:
        fail("--batch-sizes: give at least one")
    return sizes


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` on stderr and exit with status 2 (bad input, clearly named)."""
    # The message is text, not markup: "pip install 'evenserve[torch]'" keeps its [torch].
    err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def read_token_file(path: Path, option: str) -> str:
    """An admin token from a file (its text, stripped); a clear error naming ``option`` when
    it cannot be read or is empty. The token itself is never printed."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        fail(f"{option}: cannot read {path}: {exc.strerror}")
    if not token:
        fail(f"{option}: {path} is empty")
    return token


def counted_progress(unit: str, quiet: bool) -> Progress:
    """A progress bar on stderr counting ``unit`` (``3/6 arms``), gone when done; off when
    the output is JSON on stdout (``quiet``)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} " + unit),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
        transient=True,
    )
