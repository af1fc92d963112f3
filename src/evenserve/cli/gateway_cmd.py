"""``evenserve gateway`` and ``evenserve up``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from evenserve.cli.app import err_console, fail
from evenserve.core.errors import EvenserveError


def gateway(
    config: Annotated[Path, typer.Option("--config", "-c", help="Cluster YAML file.")],
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: config).")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "warning",
) -> None:
    """Run the gateway: KServe v2 HTTP API routing to the cluster's backends."""
    from evenserve.gateway.config import load_cluster
    from evenserve.gateway.server import Gateway, serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        cluster = load_cluster(config)
        gw = Gateway(cluster)
    except EvenserveError as exc:
        fail(str(exc))
        return
    g = cluster.config.gateway
    names = ", ".join(gw.registry.names())
    err_console.print(
        f"gateway on http://{host or g.host}:{port or g.port}  routing {g.routing}  "
        f"backends: {names}",
        highlight=False,
    )
    if gw.token_generated:
        err_console.print(f"admin token (generated): {gw.admin_token}", highlight=False)
    serve(gw, host, port)


def up(
    config: Annotated[Path, typer.Argument(help="Cluster YAML file.")],
    log_dir: Annotated[
        Path | None, typer.Option(help="Folder for process logs (default: a temp folder).")
    ] = None,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write URLs, pids and the admin token here when ready.")
    ] = None,
) -> None:
    """Start one worker per device and the gateway; Ctrl-C drains and stops them all."""
    from evenserve.gateway.config import load_cluster
    from evenserve.gateway.launcher import run_up

    try:
        cluster = load_cluster(config)
        code = run_up(cluster, config, log_dir=log_dir, ready_file=ready_file)
    except EvenserveError as exc:
        fail(str(exc))
        return
    raise typer.Exit(code)
