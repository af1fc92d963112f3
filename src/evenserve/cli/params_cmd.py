"""``evenserve params get | put | rollback``: the versioned parameters of a gateway or worker."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from evenserve.cli.app import console, err_console, fail, read_token_file

#: The variable the token is read from without ``--token-file``.
TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"

params_app = typer.Typer(
    no_args_is_help=True,
    help="Versioned parameters (routing, batching per model, class headroom, learn_profiles) "
    "of a running gateway or worker: show, push, roll back.",
)

TokenFile = Annotated[
    Path | None,
    typer.Option(help=f"File holding the admin bearer token (default: ${TOKEN_ENV})."),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print the server's JSON reply.")]
Url = Annotated[str, typer.Argument(help="The gateway's or worker's base URL.")]


def read_token(path: Path | None) -> str:
    if path is not None:
        return read_token_file(path, "--token-file")
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        fail(f"no admin token: give --token-file FILE or set {TOKEN_ENV}")
    return token


def read_params_file(source: str) -> dict[str, Any]:
    """A params object from a JSON or YAML file, or stdin (``-``)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        fail(f"FILE: cannot read {source}: {exc.strerror}")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        fail(f"FILE: {source}: not valid JSON or YAML: {exc}")
    if not isinstance(raw, dict):
        fail(
            f"FILE: {source}: expected an object with routing, batching_per_model, "
            "class_headroom, learn_profiles"
        )
    return raw


def _show(reply: dict[str, Any], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(reply))
        return
    lines = [f"version {reply.get('version')}"]
    if "previous_version" in reply:
        lines[0] += f" (was {reply['previous_version']})"
    lines.append(yaml.safe_dump({"params": reply.get("params")}, sort_keys=True).rstrip())
    for name, b in sorted((reply.get("backends") or {}).items()):
        if isinstance(b, dict):
            state = "skipped" if "skipped" in b else ("ok" if b.get("ok") else "FAILED")
            more = f" -> version {b['version']}" if "version" in b else ""
            err = f": {b['error']}" if b.get("error") else ""
            lines.append(f"backend {name}: {state}{more}{err}")
    for h in reply.get("history") or []:
        lines.append(
            f"  v{h['version']}  {h['source']:<8}  {h['applied_unix_s']:.0f}  {h.get('note', '')}"
        )
    console.print("\n".join(lines), highlight=False, markup=False)


def _run(call: Any, as_json: bool) -> None:
    from evenserve.httpio.params_client import ParamsAPIError

    try:
        reply = call()
    except ParamsAPIError as exc:
        if as_json and exc.body:
            console.print_json(json.dumps(exc.body))
        err_console.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    _show(reply, as_json)


@params_app.command("get")
def get(url: Url, token_file: TokenFile = None, as_json: JsonOut = False) -> None:
    """Show the current version, its params and the history."""
    from evenserve.httpio.params_client import get_params

    token = read_token(token_file)
    _run(lambda: get_params(url, token), as_json)


@params_app.command("put")
def put(
    url: Url,
    file: Annotated[str, typer.Argument(help="Params (JSON or YAML; partial), or - for stdin.")],
    expected_version: Annotated[
        int | None, typer.Option(help="Refuse (409) unless this is the current version.")
    ] = None,
    note: Annotated[str, typer.Option(help="Why (kept in the history).")] = "",
    token_file: TokenFile = None,
    as_json: JsonOut = False,
) -> None:
    """Push params: keys absent keep their value; a new version on success."""
    from evenserve.httpio.params_client import push_params

    token = read_token(token_file)
    params = read_params_file(file)
    _run(lambda: push_params(url, token, params, expected_version, note), as_json)


@params_app.command("rollback")
def rollback(
    url: Url,
    to: Annotated[int, typer.Option("--to", help="The version to go back to.")],
    expected_version: Annotated[
        int | None, typer.Option(help="Refuse (409) unless this is the current version.")
    ] = None,
    note: Annotated[str, typer.Option(help="Why (kept in the history).")] = "",
    token_file: TokenFile = None,
    as_json: JsonOut = False,
) -> None:
    """Apply an earlier version's params as a new version."""
    from evenserve.httpio.params_client import rollback_params

    token = read_token(token_file)
    _run(lambda: rollback_params(url, token, to, expected_version, note), as_json)
