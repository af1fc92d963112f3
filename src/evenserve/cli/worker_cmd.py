"""``evenserve worker`` (serve a model repository on one device) and ``evenserve profile``."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml
from pydantic import BaseModel

from evenserve.cli.app import console, err_console, fail, parse_batch_sizes, read_token_file
from evenserve.core.contention import DEFAULT_INTERFERENCE
from evenserve.core.errors import EvenserveError
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.slowdown import SlowdownSchedule, parse_slowdown_phases
from evenserve.runtime.emulated import EmulatedRuntime

MIB = 1024 * 1024
#: The variable a worker reads its admin token from (the launcher sets it; never a flag).
ADMIN_TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"


def _parse_batching(text: str | None) -> Any:
    if text is None:
        return None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        fail(f"--batching: not valid YAML: {exc}")
    if not isinstance(spec, str | dict):
        fail(
            "--batching: expected a policy name or a mapping like '{policy: static, batch_size: 8}'"
        )
    return spec


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


def _help(model: type[BaseModel], name: str, more: str = "") -> str:
    """A flag's help: the option's description, as the scenario and cluster files give it."""
    text = model.model_fields[name].description or ""
    return text[:1].upper() + text[1:] + (f" ({more})" if more else "") + "."


def worker(
    repo: Annotated[Path, typer.Option(help="Model repository: one folder per model.")],
    device: Annotated[
        str,
        typer.Option(
            help="cpu; cuda:N; cuda:N#share=K/M (K of M time-sliced shares of GPU N: memory "
            "cap total x K/M, busy time its own batches); cuda:MIG-<uuid> (one MIG slice, "
            "also MIG-GPU-<uuid>/<gi>/<ci>: the worker sets CUDA_VISIBLE_DEVICES to it and "
            "sees it as cuda:0, memory from NVML for the slice); emulated:PROFILE_SET (a "
            "folder or a name), with #mig=<G>g.<M>gb (M GiB, latency x 7/G) or #share=K/M "
            "(memory x K/M)."
        ),
    ] = "cpu",
    name: Annotated[
        str | None,
        typer.Option(
            help="The device's name (e.g. gpu0): the device label of the metrics and the load "
            "report (default: the --device string)."
        ),
    ] = None,
    port: Annotated[int, typer.Option(help="Port (0: any free port, see --port-file).")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    instances: Annotated[int, typer.Option(help=_help(DeviceOptions, "instances"))] = 1,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue-per-model",
            "--max-queue",
            help=_help(QueueOptions, "max_queue_per_model", "429; model.yaml may set its own"),
        ),
    ] = 1024,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 above).")] = 64
    * MIB,
    batching: Annotated[
        str | None,
        typer.Option(
            help="Batching policy for every model, YAML: '{policy: static, batch_size: 8}'."
        ),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            help="Serve only these models (comma-separated); with --model-control explicit, "
            "the models loaded at startup (as --load-model)."
        ),
    ] = None,
    model_control: Annotated[
        str,
        typer.Option(
            help="none: serve the models found at startup for the worker's life; explicit: "
            "POST /v2/repository/models/M/load and /unload (and gRPC) load and unload models, "
            "only --load-model/--models load at startup; poll: load every folder, then rescan "
            "the repository every --repository-poll-secs (new folders load, removed ones "
            "unload, a changed model.yaml reloads)."
        ),
    ] = "none",
    load_model: Annotated[
        list[str] | None,
        typer.Option(
            help="With --model-control explicit: load this model at startup (repeatable)."
        ),
    ] = None,
    repository_poll_secs: Annotated[
        float,
        typer.Option(help="With --model-control poll: seconds between rescans of the repository."),
    ] = 5.0,
    load_wait_ms: Annotated[
        float,
        typer.Option(
            help="An inference request for a model being loaded (LOADING) waits this long for "
            "the load to end, then runs (its response has x-evenserve-load-wait-ms); past it, "
            "503 with Retry-After. A failed load answers its waiting requests 503 with its "
            "error. 0: refuse at once."
        ),
    ] = 10000.0,
    profiles_dir: Annotated[
        Path, typer.Option(help="Where emulated:NAME looks for profile sets.")
    ] = Path("profiles"),
    memory_gb: Annotated[
        float, typer.Option(help=_help(DeviceOptions, "memory_gb", "24: an A10"))
    ] = 24.0,
    utilization_window_s: Annotated[
        float, typer.Option(help="Window of the busy fraction in the load report, seconds.")
    ] = 1.0,
    cpu_threads: Annotated[
        int | None, typer.Option(help="Threads of CPU runtimes (default: the framework's).")
    ] = None,
    drain_timeout_s: Annotated[
        float, typer.Option(help="On shutdown, how long queued work may take to finish.")
    ] = 30.0,
    starvation_ms: Annotated[
        float | None, typer.Option(help=_help(QueueOptions, "starvation_ms"))
    ] = None,
    class_headroom: Annotated[
        float | None,
        typer.Option(help=_help(QueueOptions, "class_headroom", "arrival rate x profile")),
    ] = None,
    ignore_priority: Annotated[
        bool, typer.Option(help=_help(QueueOptions, "ignore_priority"))
    ] = False,
    interference: Annotated[
        float,
        typer.Option(help=_help(DeviceOptions, "interference", "with --instances > 1")),
    ] = DEFAULT_INTERFERENCE,
    host_pool: Annotated[
        Path | None,
        typer.Option(
            help="The host's warm pool: a directory (tmpfs, e.g. under /dev/shm, so it is host "
            "memory) shared by the workers of this host, created if missing. A cold load "
            "(from the repository) writes the model's entry there, an unload keeps it, and a "
            "load that finds it is warm (emulated: emulated.warm_load_ms, default weights / "
            "12 GB/s + 5 ms); least recently used entries are deleted beyond --host-pool-gb. "
            "Needs --host-pool-gb."
        ),
    ] = None,
    host_pool_gb: Annotated[
        float | None,
        typer.Option(help="Capacity of --host-pool in GiB (needs --host-pool)."),
    ] = None,
    learn_profiles: Annotated[
        bool,
        typer.Option(
            help="Profiles that learn: each model's latency profile here follows its measured "
            "batch times (smoothed), so batching, estimates and admission track a device that "
            "slows down or speeds up; the load report carries them to the gateway, whose "
            "profiles for this worker follow."
        ),
    ] = False,
    slowdown: Annotated[
        float,
        typer.Option(
            help="Emulated devices: every batch takes this many times its profile's time "
            "(the profile, and so the worker's estimates, still say 1x)."
        ),
    ] = 1.0,
    slowdown_phases: Annotated[
        str | None,
        typer.Option(
            help="Emulated devices: START_S:END_S:MULT,... stretches (seconds from the origin) "
            "where --slowdown is multiplied by MULT; the origin is the worker's first batch "
            "unless --slowdown-origin-unix says."
        ),
    ] = None,
    slowdown_origin_unix: Annotated[
        float | None,
        typer.Option(help="Origin of --slowdown-phases, wall-clock Unix seconds."),
    ] = None,
    staging_ms_per_item: Annotated[
        float,
        typer.Option(
            help="Emulated devices: every batch first stages its inputs for this many ms per "
            "item (counted as its compute_input phase), on top of its profile's time."
        ),
    ] = 0.0,
    warmup: Annotated[
        str,
        typer.Option(
            help="Batch sizes each model runs (twice: cold, then warm) after it loads and "
            "before it is ready (startup, model-control and warm-pool loads alike), so no "
            "first request of a batch size pays its first-call cost: all (1..max_batch_size), "
            "first (batch 1), none, or a list like 1,2,4,8 (sizes above a model's "
            "max_batch_size are left out). Emulated models are never warmed up. The times "
            "are in the model's load info (model config and statistics)."
        ),
    ] = "all",
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once listening.")
    ] = None,
    grpc_port: Annotated[
        int,
        typer.Option(
            help="Also serve KServe v2 over gRPC on this port (0: no gRPC; needs the grpc extra)."
        ),
    ] = 0,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Write the request log here: one JSON line per answered inference request, "
            "a replayable trace plus outcomes."
        ),
    ] = None,
    record_max_mb: Annotated[
        float, typer.Option(help="Rotate the request log past this size, MiB.")
    ] = 64.0,
    record_keep: Annotated[int, typer.Option(help="Rotated request logs kept: PATH.1 ...")] = 4,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "warning",
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the admin API's bearer token (/admin/params); default: the "
            "variable EVENSERVE_ADMIN_TOKEN; neither: the admin API is off."
        ),
    ] = None,
) -> None:
    """Serve a model repository on one device over the KServe v2 protocol."""
    from evenserve.runtime.device import parse_device, select_visible_device
    from evenserve.worker.app import Worker
    from evenserve.worker.options import WorkerOptions
    from evenserve.worker.repository import load_repository, model_folders
    from evenserve.worker.server import make_server
    from evenserve.worker.warmup import WarmupSpec, parse_warmup

    if max_body_bytes < 1:
        fail("--max-body-bytes: must be >= 1")
    if not 0 <= port <= 65535:
        fail(f"--port: must be in 0..65535 (got {port})")
    if not 0 <= grpc_port <= 65535:
        fail(f"--grpc-port: must be in 0..65535 (got {grpc_port})")
    if grpc_port:
        try:
            import evenserve.worker.grpc_api  # noqa: F401
        except ImportError as exc:
            fail(
                f"--grpc-port: gRPC needs grpcio and tritonclient[grpc] ({exc.name} is not "
                "installed): pip install 'evenserve[grpc]'"
            )
    if utilization_window_s <= 0:
        fail("--utilization-window-s: must be > 0")
    if model_control not in ("none", "explicit", "poll"):
        fail(f"--model-control: {model_control!r} is not none, explicit or poll")
    if load_model and model_control != "explicit":
        fail("--load-model: needs --model-control explicit")
    if models and model_control == "poll":
        fail("--models: not with --model-control poll (the poll serves every model folder)")
    if repository_poll_secs <= 0:
        fail("--repository-poll-secs: must be > 0")
    if not load_wait_ms >= 0:
        fail("--load-wait-ms: must be >= 0")
    if not record_max_mb > 0:
        fail("--record-max-mb: must be > 0")
    if record_keep < 0:
        fail("--record-keep: must be >= 0")
    if host_pool_gb is not None and host_pool is None:
        fail("--host-pool-gb: needs --host-pool DIR (the pool's directory)")
    if host_pool is not None:
        if host_pool_gb is None:
            fail("--host-pool: needs --host-pool-gb (the pool's capacity in GiB)")
        elif not host_pool_gb > 0:
            fail("--host-pool-gb: must be > 0")
    if not (slowdown > 0 and slowdown < float("inf")):
        fail("--slowdown: must be a number > 0")
    if not (staging_ms_per_item >= 0 and staging_ms_per_item < float("inf")):
        fail("--staging-ms-per-item: must be a number >= 0")
    if slowdown_origin_unix is not None and slowdown_phases is None:
        fail("--slowdown-origin-unix: needs --slowdown-phases")
    warmup_spec: WarmupSpec = "all"
    try:
        warmup_spec = parse_warmup(warmup)
    except ValueError as exc:
        fail(f"--warmup: {exc}")
    try:
        phases = parse_slowdown_phases(slowdown_phases) if slowdown_phases else ()
        schedule = SlowdownSchedule(slowdown, phases)
        run = DeviceOptions.from_flags(
            instances=instances, interference=interference, memory_gb=memory_gb
        )
        queue = QueueOptions.from_flags(
            max_queue_per_model=max_queue,
            starvation_ms=starvation_ms,
            class_headroom=class_headroom,
            ignore_priority=ignore_priority,
        )
        dev = parse_device(device)
        # A MIG slice: the only CUDA device this process sees, chosen before CUDA starts.
        select_visible_device(dev)
        only = [m.strip() for m in models.split(",") if m.strip()] if models else None
        if model_control == "explicit":
            # The startup set: --load-model and --models (none: serve nothing until a load).
            startup = sorted({*(load_model or []), *(only or [])})
            folders = {d.name for d in model_folders(repo)}
            missing = [m for m in startup if m not in folders]
            if missing:
                flag = "--load-model" if missing[0] in (load_model or []) else "--models"
                fail(f"{flag}: no model folder {missing[0]!r} in {repo}")
            entries = load_repository(repo, startup) if startup else []
        elif model_control == "poll":
            entries = load_repository(repo) if model_folders(repo) else []
        else:
            entries = load_repository(repo, only)
        options = WorkerOptions(
            device=dev,
            name=name,
            run=run,
            queue=queue,
            max_body_bytes=max_body_bytes,
            batching_override=_parse_batching(batching),
            profiles_dir=profiles_dir,
            utilization_window_s=utilization_window_s,
            cpu_threads=cpu_threads,
            drain_timeout_s=drain_timeout_s,
            model_control="explicit"
            if model_control == "explicit"
            else "poll"
            if model_control == "poll"
            else "none",
            repository=repo,
            repository_poll_s=repository_poll_secs,
            load_wait_s=load_wait_ms / 1000.0,
            host_pool=host_pool,
            host_pool_bytes=(host_pool_gb or 0.0) * 1024.0**3,
            learn_profiles=learn_profiles,
            slowdown=None if schedule.constant else schedule,
            slowdown_origin_unix_s=slowdown_origin_unix,
            staging_s_per_item=staging_ms_per_item / 1000.0,
            warmup=warmup_spec,
            admin_token=worker_admin_token(admin_token_file),
        )
        service = Worker(entries, options)
        if not schedule.constant and not any(
            isinstance(m.runtime, EmulatedRuntime) for m in service.models.values()
        ):
            flag = "--slowdown" if slowdown != 1.0 else "--slowdown-phases"
            fail(f"{flag}: only emulated models can be slowed, and none is served here")
        if staging_ms_per_item > 0 and not any(
            isinstance(m.runtime, EmulatedRuntime) for m in service.models.values()
        ):
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
        f"evenserve worker: device {dev.name}, {instances} instance(s), "
        f"listening on http://{host}:{bound}"
        + (f" and grpc://{host}:{grpc_port}" if grpc_port else ""),
        highlight=False,
    )
    if port_file is not None:
        port_file.write_text(f"{bound}\n")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    recorder = None
    if record is not None:
        from evenserve.core.requestlog import MIB, Recorder, RecordSettings

        recorder = Recorder(
            RecordSettings(record, max(1, int(record_max_mb * MIB)), record_keep, window=0)
        )
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
