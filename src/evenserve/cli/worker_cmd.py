"""``evenserve worker`` (serve a model repository on one device) and ``evenserve profile``."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from evenserve.cli.app import console, err_console, fail, parse_batch_sizes, read_token_file
from evenserve.cli.flags import flags_of, with_flags
from evenserve.core.errors import EvenserveError
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.worker.settings import WorkerSettings

#: The variable a worker reads its admin token from (the launcher sets it; never a flag).
ADMIN_TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"


def _parse_shapes(items: list[str] | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = [int(d) for d in dims.replace("x", ",").split(",") if d]
        except ValueError:
            fail(f"--input-shape {item!r}: expected NAME=D1,D2,... (e.g. input_ids=128)")
    return out


def worker_admin_token(path: Path | None) -> str | None:
    """The worker's admin token: the file's first line, else ``$EVENSERVE_ADMIN_TOKEN``,
    else None (the admin API is off). Never printed."""
    if path is not None:
        return read_token_file(path, "--admin-token-file")
    return os.environ.get(ADMIN_TOKEN_ENV) or None


#: The order ``evenserve worker --help`` lists the flags in (every flag once).
FLAG_ORDER = (
    "repo",
    "device",
    "name",
    "port",
    "host",
    "instances",
    "max_queue_per_model",
    "max_body_bytes",
    "batching",
    "models",
    "model_control",
    "load_model",
    "repository_poll_secs",
    "load_wait_ms",
    "profiles_dir",
    "memory_gb",
    "utilization_window_s",
    "cpu_threads",
    "drain_timeout_s",
    "starvation_ms",
    "class_headroom",
    "ignore_priority",
    "interference",
    "host_pool",
    "host_pool_gb",
    "learn_profiles",
    "slowdown",
    "slowdown_phases",
    "slowdown_origin_unix",
    "staging_ms_per_item",
    "warmup",
    "port_file",
    "grpc_port",
    "record",
    "record_max_mb",
    "record_keep",
    "log_level",
    "admin_token_file",
)
#: What the worker's flag adds to a device or queue option's description.
NOTES = {
    "max_queue_per_model": "429; model.yaml may set its own",
    "memory_gb": "24: an A10",
    "class_headroom": "arrival rate x profile",
    "interference": "with --instances > 1",
}
#: The flags' other names.
ALIASES = {"max_queue_per_model": ("--max-queue",)}


@with_flags(flags_of(WorkerSettings, FLAG_ORDER, NOTES, ALIASES))
def worker(**flags: Any) -> None:
    """Serve a model repository on one device over the KServe v2 protocol."""
    from evenserve.runtime.device import select_visible_device
    from evenserve.worker.app import Worker
    from evenserve.worker.repository import load_llm_repository, load_repository, model_folders
    from evenserve.worker.server import make_server

    try:
        settings = WorkerSettings.from_flags(**flags)
    except EvenserveError as exc:
        fail(str(exc))
    if settings.grpc_port:
        try:
            import evenserve.worker.grpc_api  # noqa: F401
        except ImportError as exc:
            fail(
                f"--grpc-port: gRPC needs grpcio and tritonclient[grpc] ({exc.name} is not "
                "installed): pip install 'evenserve[grpc]'"
            )
    repo, model_control = settings.repo, settings.model_control
    try:
        options = settings.to_options(worker_admin_token(settings.admin_token_file))
        dev = options.device
        # A MIG slice: the only CUDA device this process sees, chosen before CUDA starts.
        select_visible_device(dev)
        only = settings.only_models
        if model_control == "explicit":
            # The startup set: --load-model and --models (none: serve nothing until a load).
            load_model = settings.load_model or []
            startup = sorted({*load_model, *(only or [])})
            folders = {d.name for d in model_folders(repo)}
            missing = [m for m in startup if m not in folders]
            if missing:
                flag = "--load-model" if missing[0] in load_model else "--models"
                fail(f"{flag}: no model folder {missing[0]!r} in {repo}")
            entries = load_repository(repo, startup) if startup else []
        elif model_control == "poll":
            entries = load_repository(repo) if model_folders(repo) else []
        else:
            entries = load_repository(repo, only)
        # LLM folders (kind: llm): with model control none, served from the start; with
        # explicit, those of the startup set awake, and those placement may wake (emulated,
        # with a placement: section) on disk until loaded (design 0022); poll: not served.
        llm_awake: set[str] | None = None
        if model_control == "none":
            llm_entries = load_llm_repository(repo, only)
        else:
            every = load_llm_repository(repo)
            if model_control == "explicit":
                llm_awake = {e.name for e in every if e.name in startup}
                llm_entries = [
                    e
                    for e in every
                    if e.name in llm_awake
                    or (e.config.runtime == "emulated" and e.config.placement is not None)
                ]
            else:
                llm_entries = []
            left = [e.name for e in every if e not in llm_entries]
            if left:
                err_console.print(
                    f"warning: {', '.join(left)}: LLM folders (kind: llm) are served with "
                    f"--model-control none, or explicit when loaded at the start or placed "
                    f"(runtime: emulated with a placement: section); with {model_control} "
                    "these are not served",
                    highlight=False,
                )
        service = Worker(entries, options, llm_entries=llm_entries, llm_awake=llm_awake)
        emulated = any(isinstance(m.runtime, EmulatedRuntime) for m in service.models.values())
        if options.slowdown is not None and not emulated:
            flag = "--slowdown" if settings.slowdown != 1.0 else "--slowdown-phases"
            fail(f"{flag}: only emulated models can be slowed, and none is served here")
        if settings.staging_ms_per_item > 0 and not emulated:
            fail("--staging-ms-per-item: only emulated models stage slowly, and none is served")
        err_console.print(
            f"evenserve worker: loading {', '.join(service.models) or 'no models'} on "
            f"{dev.name} (model control: {model_control}) ...",
            highlight=False,
        )
        service.load()
    except EvenserveError as exc:
        fail(str(exc))
        return
    host, port, grpc_port = settings.host, settings.port, settings.grpc_port
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        fail(f"--port: cannot bind {host}:{port}: {exc}")
    bound = sock.getsockname()[1]
    for name, hosted in service.models.items():
        desc, batching_label = hosted.description, hosted.batching_spec
        err_console.print(
            f"  {name}: {desc.get('runtime')} | batching {batching_label}", highlight=False
        )
    err_console.print(
        f"evenserve worker: device {dev.name}, {settings.run.instances} instance(s), "
        f"listening on http://{host}:{bound}"
        + (f" and grpc://{host}:{grpc_port}" if grpc_port else ""),
        highlight=False,
    )
    if settings.port_file is not None:
        settings.port_file.write_text(f"{bound}\n")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    recorder = None
    record = settings.record
    if record is not None:
        from evenserve.core.requestlog import MIB, Recorder, RecordSettings

        size = max(1, int(settings.record_max_mb * MIB))
        recorder = Recorder(RecordSettings(record, size, settings.record_keep, window=0))
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.open("ab").close()
        except OSError as exc:
            fail(f"--record: cannot open {record}: {exc.strerror}")
        err_console.print(f"evenserve worker: request log {record}", highlight=False)
    try:
        make_server(
            service, sock, grpc_host=host, grpc_port=grpc_port or None, recorder=recorder
        ).run()
    except EvenserveError as exc:  # the gRPC port cannot be bound
        fail(str(exc))


def profile(
    repo: Annotated[Path, typer.Option(help="Model repository.")],
    model: Annotated[str, typer.Option(help="Model folder name in the repository.")],
    out: Annotated[Path, typer.Option(help="Profile YAML to write.")],
    device: Annotated[
        str, typer.Option(help="cpu or cuda:N (emulated: checks a profile).")
    ] = "cpu",
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,2,4,8,16",
    warmup: Annotated[int, typer.Option(help="Unmeasured runs per batch size.")] = 3,
    iters: Annotated[int, typer.Option(help="Measured runs per batch size.")] = 10,
    input_shape: Annotated[
        list[str] | None,
        typer.Option(help="Per-item shape of a variable input: NAME=D1,D2 (repeatable)."),
    ] = None,
    sequence_length: Annotated[
        int | None, typer.Option(help="Sequence length to record in the profile.")
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            help="Override the model's precision (fp32, fp16, bf16; int8: dynamic "
            "quantization, CPU). A folder's variant.yaml (evenserve optimize) is profiled "
            "as served."
        ),
    ] = None,
    cpu_threads: Annotated[int | None, typer.Option(help="Threads of CPU runtimes.")] = None,
    name: Annotated[
        str | None, typer.Option(help="Model name in the profile (default: the folder's).")
    ] = None,
    profiles_dir: Annotated[Path, typer.Option(help="Profile sets (emulated devices).")] = Path(
        "profiles"
    ),
    clock: Annotated[
        str,
        typer.Option(
            help="wall, or cpu: CPU time of the computing thread (needs --cpu-threads 1; "
            "for a host shared with other jobs)."
        ),
    ] = "wall",
) -> None:
    """Measure a model at a list of batch sizes and write a profile YAML."""
    from evenserve.runtime.device import parse_device, select_visible_device
    from evenserve.worker.profiler import build_runtime, measure, write_profile
    from evenserve.worker.repository import load_repository

    sizes = parse_batch_sizes(batch_sizes)
    shapes = _parse_shapes(input_shape)
    if clock not in ("wall", "cpu"):
        fail(f"--clock: {clock!r} is not wall or cpu")
    clock_kind: Literal["wall", "cpu"] = "cpu" if clock == "cpu" else "wall"
    try:
        dev = parse_device(device)
        select_visible_device(dev)  # a MIG slice, before CUDA starts
        (entry,) = load_repository(repo, [model], check_profiles=False)
        runtime = build_runtime(
            entry, dev, precision=precision, cpu_threads=cpu_threads, profiles_dir=profiles_dir
        )
        err_console.print(f"loading {model} on {dev.name} ...", highlight=False)
        runtime.load()

        def show(p: Any) -> None:
            mem = "n/a" if p.memory_mb is None else f"{p.memory_mb:.1f} MB"
            console.print(
                f"  batch {p.batch:4d}: median {p.median_ms:9.2f} ms  "
                f"(p10 {p.p10_ms:.2f}, p90 {p.p90_ms:.2f}; wall {p.wall_median_ms:.2f}, "
                f"cpu {p.cpu_median_ms:.2f})  memory {mem}",
                highlight=False,
            )

        load_start = os.getloadavg()[0]
        points = measure(
            runtime,
            entry,
            dev,
            sizes,
            warmup=warmup,
            iters=iters,
            input_shapes=shapes,
            progress=show,
            clock=clock_kind,
            threads=cpu_threads,
        )
        prof = write_profile(
            out,
            entry,
            dev,
            runtime,
            points,
            warmup=warmup,
            iters=iters,
            input_shapes=shapes,
            sequence_length=sequence_length,
            profile_name=name,
            load_average=(load_start, os.getloadavg()[0]),
            clock=clock_kind,
        )
        runtime.close()
    except EvenserveError as exc:
        fail(str(exc))
        return
    console.print(f"wrote {out} ({prof.model}, {prof.runtime}, {prof.precision}, {prof.device})")
