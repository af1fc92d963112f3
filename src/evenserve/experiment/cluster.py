"""One arm of a scenario compiled into a local emulated cluster, and that cluster run.

For an arm: the scenario's (scaled) profile sets as profile folders; a model repository whose
``model.yaml`` carry the arm's batching as written and the scenario model's
``max_batch_size`` (the worker applies the batch-cap rule, ``sched.setup``, as the simulator
does; the bench gives a scenario model without one its model.yaml's,
:func:`model_cap_overrides`), SLOs, classes, deadlines and queue bound; and a cluster YAML
with one emulated worker per device (memory, instances, interference, the arm's class
options) behind a gateway routing with the arm's policy. :func:`arm_cluster` starts it with
the ``evenserve up`` Launcher, on loopback. A scenario device's ``slowdown`` and
``slowdown_phases`` become its worker's ``--slowdown`` and ``--slowdown-phases`` (phases from
the worker's first batch, which is the load's start: an emulated batch then really takes its
profile's time times the slowdown, as in the simulator); its ``staging_ms_per_item``, the
worker's ``--staging-ms-per-item``; an arm's ``learn_profiles``, every worker's
``--learn-profiles``.

Placement arms: only the devices the arm lists; the gateway's ``placement`` (the arm's
policy with its ``placement_interval_ms``, ``load_wait_ms`` and ``host_memory_gb``) and
``autoscaling``; a device that is not ``active`` is a spare (``active: false``, no models);
every model.yaml's ``emulated.load_ms`` and ``emulated.warm_load_ms`` are the scenario's
(scaled) cold and warm load times, which the worker sleeps and the gateway's controller plans
with. An arm with ``host_memory_gb`` > 0 gets one host pool shared by its workers (the
Launcher makes it and removes it at the end), so warm loads are warm live too. A spare's
start time live is its worker process starting (the scenario's ``start_ms`` is what the
simulator assumes).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from evenserve.cluster.file import parse_cluster
from evenserve.cluster.launcher import Launcher
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, ModelOptions, QueueOptions
from evenserve.core.scenario import ArmSpec, DeviceSpec
from evenserve.core.slowdown import phases_flag
from evenserve.experiment.scaling import model_weights_bytes
from evenserve.sim.loader import LoadedScenario


def free_port(taken: set[int] | None = None) -> int:
    """A free loopback port, not one of ``taken`` (which it joins): the OS may hand the same
    free port out twice in a row, and one cluster's ports must differ."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if taken is None or port not in taken:
            if taken is not None:
                taken.add(port)
            return port


def write_profile_sets(loaded: LoadedScenario, workdir: Path) -> dict[str, Path]:
    """Each profile set as ``workdir/profiles/SET/MODEL.yaml``; set name -> folder."""
    out: dict[str, Path] = {}
    for name, profs in loaded.profile_sets.items():
        d = workdir / "profiles" / name
        d.mkdir(parents=True, exist_ok=True)
        for m, p in profs.items():
            raw = p.to_file_model().model_dump(exclude_none=True)
            (d / f"{m}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        out[name] = d.resolve()
    return out


def model_cap_overrides(loaded: LoadedScenario, repo: Path) -> list[str]:
    """``--set`` overrides that give each scenario model without a ``max_batch_size`` the one
    of its ``model.yaml`` in ``repo``: the live workers batch under it (the batch-cap rule,
    ``sched.setup``), and with them the simulator does too."""
    out: list[str] = []
    for m, spec in loaded.scenario.models.items():
        src = repo / m / "model.yaml"
        if spec.max_batch_size is not None or not src.is_file():
            continue  # a missing model.yaml: write_arm_cluster names it
        raw = yaml.safe_load(src.read_text())
        if isinstance(raw, dict) and isinstance(raw.get("max_batch_size"), int):
            out.append(f"models.{m}.max_batch_size={raw['max_batch_size']}")
    return out


def slowdown_args(d: DeviceSpec) -> list[str]:
    """The worker flags of a scenario device's slowdown and input staging (none for one as
    fast as its profiles): its phases count from the worker's first batch, the load's
    start."""
    out: list[str] = []
    if d.staging_ms_per_item:
        out += ["--staging-ms-per-item", repr(d.staging_ms_per_item)]
    if d.slowdown != 1.0:
        out += ["--slowdown", repr(d.slowdown)]
    if d.slowdown_phases:
        phases = [(p.start_s, p.end_s, p.multiplier) for p in d.slowdown_phases]
        out += ["--slowdown-phases", phases_flag(phases)]
    return out


def write_arm_cluster(
    loaded: LoadedScenario,
    arm: str,
    source_repo: Path,
    workdir: Path,
    profile_dirs: dict[str, Path],
    seed: int,
) -> Path:
    """Repository and cluster YAML of one arm; returns the cluster file.

    Each model's inputs and outputs come from ``source_repo/MODEL/model.yaml`` (an emulated
    model); ``profile_dirs`` are :func:`write_profile_sets`' folders; ports are free loopback
    ports picked now.
    """
    sc = loaded.scenario
    spec = sc.arms[arm]
    repo = workdir / "repo"
    for m, mspec in sc.models.items():
        src = source_repo / m / "model.yaml"
        if not src.is_file():
            raise ConfigError(
                f"models.{m}: no {src} (the live bench takes each model's inputs and outputs "
                "from --repo; add the model there)"
            )
        raw = yaml.safe_load(src.read_text())
        if not isinstance(raw, dict) or raw.get("runtime") != "emulated":
            raise ConfigError(f"{src}: runtime: the live bench runs emulated models only")
        raw.pop("profile", None)
        raw["emulated"] = {"profile_name": mspec.profile or m}
        if spec.placement is not None:
            cold_s, warm_s = mspec.load_times_s(model_weights_bytes(loaded, m))
            raw["emulated"]["load_ms"] = round(cold_s * 1000.0, 3)
            raw["emulated"]["warm_load_ms"] = round(warm_s * 1000.0, 3)
        # The arm's batching as written: the worker applies the batch-cap rule to it with
        # the model's max_batch_size, as the simulator does with the scenario model's.
        raw["batching"] = spec.batching_per_model.get(m, spec.batching)
        if mspec.max_batch_size is not None:
            raw["max_batch_size"] = mspec.max_batch_size
        raw.pop("queue_timeout_ms", None)
        raw.update(mspec.model_dump(include=set(ModelOptions.model_fields)))
        (repo / m).mkdir(parents=True, exist_ok=True)
        (repo / m / "model.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    util_window_s = sc.signals.utilization_window_ms / 1000.0
    ports: set[int] = set()
    devices = []
    for d in sc.arm_devices(arm):
        placed: dict[str, Any] = {"models": list(d.models)}
        if spec.placement is not None and not d.active:
            placed = {"active": False}  # a spare: off, no models, until scaled up
        devices.append(
            {
                "name": d.name,
                "device": f"emulated:{profile_dirs[sc.profile_set_of(d)]}",
                **placed,
                "port": free_port(ports),
                # The scenario's device and arm options, as the worker's own.
                **DeviceOptions.of(d).model_dump(),
                **QueueOptions.of(spec).model_dump(exclude_none=True),
                "extra_args": [
                    "--utilization-window-s", f"{util_window_s:g}",
                    "--log-level", "warning",
                    *slowdown_args(d),
                    *(["--learn-profiles"] if spec.learn_profiles else []),
                ],
            }
        )  # fmt: skip
    cluster = {
        "name": f"bench-{sc.name}-{arm}",
        "gateway": {
            "host": "127.0.0.1",
            "port": free_port(ports),
            "routing": spec.routing,
            "seed": seed,
            "signals": {"interval_ms": sc.signals.interval_ms, "window": sc.signals.window},
            # The gateway refuses work as the simulator's arm does (off unless it says so).
            "overload": {"enabled": spec.overload_refusals},
            **placement_section(spec),
        },
        "workers": {
            "repo": str(repo.resolve()),
            "devices": devices,
            "ready_timeout_s": 60,
            "drain_timeout_s": 3,
            "restart": False,
        },
    }
    path = workdir / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


def write_payloads(loaded: LoadedScenario, source_repo: Path, workdir: Path) -> dict[str, Path]:
    """A KServe v2 JSON request per model (batch 1, from its ``source_repo`` model.yaml
    inputs: each synthetic range's low value, else zeros), as ``workdir/payloads/MODEL.json``.
    A placement arm sends these: a model that starts cold has no metadata to build one from
    until it is loaded."""
    out: dict[str, Path] = {}
    d = workdir / "payloads"
    d.mkdir(parents=True, exist_ok=True)
    for m in loaded.scenario.models:
        raw = yaml.safe_load((source_repo / m / "model.yaml").read_text())
        inputs = []
        for spec in raw.get("inputs") or []:
            shape = [1, *(1 if int(x) < 0 else int(x) for x in spec["shape"])]
            n = 1
            for x in shape:
                n *= x
            low = (spec.get("synthetic") or {}).get("low", 0)
            value: Any = bool(low) if spec["datatype"] == "BOOL" else low
            inputs.append(
                {
                    "name": spec["name"],
                    "datatype": spec["datatype"],
                    "shape": shape,
                    "data": [value] * n,
                }
            )
        path = d / f"{m}.json"
        path.write_text(json.dumps({"inputs": inputs}))
        out[m] = path.resolve()
    return out


def placement_section(spec: ArmSpec) -> dict[str, Any]:
    """The gateway's ``placement`` and ``autoscaling`` keys for an arm (none without)."""
    if spec.placement is None:
        return {}
    policy = spec.placement
    raw = {"policy": policy} if isinstance(policy, str) else dict(policy)
    raw.update(
        interval_ms=spec.placement_interval_ms,
        load_wait_ms=spec.load_wait_ms,
        host_memory_gb=spec.host_memory_gb,
    )
    out: dict[str, Any] = {"placement": raw}
    if spec.autoscaling is not None:
        out["autoscaling"] = spec.autoscaling
    return out


@contextlib.contextmanager
def arm_cluster(
    cluster_path: Path,
    log_dir: Path,
    say: Callable[[str], None] = print,
    ray_address: str | None = None,
) -> Iterator[Launcher]:
    """The cluster of ``cluster_path`` running (process logs in ``log_dir``); stopped after.
    ``ray_address`` (``auto`` or a Ray address): its workers as Ray actors (``up --ray``)."""
    with cluster_path.open() as f:
        raw = yaml.safe_load(f)
    cluster = parse_cluster(raw, cluster_path.parent, str(cluster_path))
    log_dir.mkdir(parents=True, exist_ok=True)
    placement = None
    if ray_address is not None:
        from evenserve.cluster.ray_workers import RayPlacement, import_ray

        import_ray()
        placement = RayPlacement(ray_address)
    la = Launcher(cluster, cluster_path, log_dir, say=say, ray=placement)
    la.plan()
    channel: threading.Thread | None = None
    try:
        la.start()
        if cluster.config.gateway.autoscaling is not None:
            # The scale channel (spares started and stopped on the gateway's decisions),
            # as `evenserve up` runs it, beside the load.
            channel = threading.Thread(target=la.supervise, name="scale-channel", daemon=True)
            channel.start()
        yield la
    finally:
        la.request_stop()
        if channel is not None:
            channel.join(timeout=5.0)
        la.stop()
