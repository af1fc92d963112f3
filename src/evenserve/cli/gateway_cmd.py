"""``evenserve gateway`` and ``evenserve up``.

The admin token is never printed: a configured one is named by where it is configured, a
generated one by the file it was written to (mode 0600, in a folder of its own).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from evenserve.cli.app import err_console, fail
from evenserve.core.errors import ConfigError, EvenserveError


def gateway(
    config: Annotated[Path, typer.Option("--config", "-c", help="Cluster YAML file.")],
    host: Annotated[str | None, typer.Option(help="Listen address (default: config).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Listen port (default: config; 0: any free port).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "warning",
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="Where a generated admin token is written, mode 0600 (default: a new private "
            "temporary folder). Not used when the cluster file or its variable gives one."
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Write the request log here: one JSON line per answered inference request, "
            "a replayable trace plus outcomes (overrides gateway.record.path)."
        ),
    ] = None,
    record_max_mb: Annotated[
        float | None,
        typer.Option(help="Rotate the request log past this size, MiB (default 64)."),
    ] = None,
    record_keep: Annotated[
        int | None, typer.Option(help="Rotated request logs kept: PATH.1 ... (default 4).")
    ] = None,
    record_window: Annotated[
        int | None,
        typer.Option(help="Records kept in memory for GET /admin/log (default 200000)."),
    ] = None,
    worker_addresses: Annotated[
        Path | None,
        typer.Option(
            help='JSON {"worker": "host:port"}: where workers listen, over the cluster file '
            "(`evenserve up --ray` writes it once its actors report)."
        ),
    ] = None,
) -> None:
    """Run the gateway: KServe v2 HTTP API routing to the cluster's backends."""
    from evenserve.cluster.admin_token import write_private
    from evenserve.cluster.file import load_cluster
    from evenserve.gateway.listen import listening_socket, serve
    from evenserve.gateway.server import Gateway

    if port is not None and not 0 <= port <= 65535:
        fail(f"--port: must be in 0..65535 (got {port})")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        cluster = load_cluster(config)
        if worker_addresses is not None:
            cluster = cluster.with_worker_addresses(read_addresses(worker_addresses))
        token = cluster.resolve_admin_token()
        rec = cluster.record_settings(record, record_max_mb, record_keep, record_window)
        gw = Gateway(cluster, admin_token=token.value, host=host, record=rec)
    except EvenserveError as exc:
        fail(str(exc))
        return
    g = cluster.config.gateway
    if g.grpc_port is not None:
        try:
            import evenserve.gateway.grpc_front  # noqa: F401
        except ImportError as exc:
            fail(
                f"gateway.grpc_port: gRPC needs grpcio and tritonclient[grpc] ({exc.name} is not "
                "installed): pip install 'evenserve[grpc]'"
            )
    names = ", ".join(gw.registry.names())
    port_from = "--port" if port is not None else f"{config}: gateway.port"
    port = port if port is not None else g.port
    try:
        sock = listening_socket(gw.host, port, g.reuse_port)
    except OSError as exc:
        fail(f"{port_from}: cannot listen on {gw.host}:{port}: {exc.strerror or exc}")
    port = sock.getsockname()[1]
    grpc_at = "" if g.grpc_port is None else f" and grpc://{gw.host}:{g.grpc_port}"
    err_console.print(
        f"gateway on http://{gw.host}:{port}{grpc_at}  routing {g.routing}  backends: {names}",
        highlight=False,
    )
    if token.generated:
        where = token_file or Path(tempfile.mkdtemp(prefix="evenserve-gateway-")) / "admin-token"
        try:
            write_private(where, token.value + "\n")
        except OSError as exc:
            fail(f"--token-file: cannot write {where}: {exc.strerror}")
        err_console.print(
            f"admin token (generated) written to {where} (mode 0600)", highlight=False
        )
    else:
        err_console.print(f"admin token: the one of {token.source}", highlight=False)
    if rec is not None and rec.path is not None:
        try:
            rec.path.parent.mkdir(parents=True, exist_ok=True)
            rec.path.open("ab").close()
        except OSError as exc:
            fail(f"--record: cannot open {rec.path}: {exc.strerror}")
    if rec is not None:
        kept = "memory only" if rec.path is None else str(rec.path)
        err_console.print(f"request log: {kept} (window {rec.window} records)", highlight=False)
    try:
        serve(gw, sock=sock)
    except EvenserveError as exc:  # the gRPC port cannot be bound
        fail(str(exc))


def read_addresses(path: Path) -> dict[str, str]:
    """``--worker-addresses``: a JSON object of worker name to ``host:port``."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--worker-addresses: cannot read {path}: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ConfigError(f'--worker-addresses: {path}: expected {{"worker": "host:port"}}')
    return {str(k): v for k, v in raw.items()}


def up(
    config: Annotated[Path, typer.Argument(help="Cluster YAML file.")],
    log_dir: Annotated[
        Path | None, typer.Option(help="Folder for process logs (default: a temp folder).")
    ] = None,
    ready_file: Annotated[
        Path | None,
        typer.Option(help="Write URLs, pids and the admin token here when ready (mode 0600)."),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run each worker as a Ray actor: `auto` (the running Ray cluster, else a new "
            "local one) or a Ray address. Needs the ray extra (pip install 'evenserve\\[ray]').",
        ),
    ] = None,
) -> None:
    """Start one worker per device and the gateway; Ctrl-C drains and stops them all.

    With gateway.placement, workers run --model-control explicit (their models
    loaded at startup) and the gateway loads and unloads models on them.
    A device with active: false is a spare: started only when gateway.autoscaling
    turns it on (via the gateway's /admin/scale), stopped again after draining.
    With --ray, each worker runs as a Ray actor (GPU workers ask Ray for their GPU;
    a device's ray_node pins it), restarted by Ray if it dies."""
    from evenserve.cluster.file import load_cluster
    from evenserve.cluster.launcher import run_up

    try:
        cluster = load_cluster(config)
        code = run_up(cluster, config, log_dir=log_dir, ready_file=ready_file, ray_address=ray)
    except EvenserveError as exc:
        fail(str(exc))
        return
    raise typer.Exit(code)
