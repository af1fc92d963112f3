"""A cluster file read back as a scenario: ``evenserve tune TRACE --cluster F``.

The reverse of ``experiment.cluster.write_arm_cluster`` (scenario -> cluster): from a cluster
file (``cluster.file``) a :class:`LoadedScenario` the simulator runs with a recorded trace
as its workload.

- Devices: one per worker device (``workers.devices[]``), with its models (default: every
  model of the repository), ``memory_gb``, ``instances``, ``interference``, its slice
  (``#mig=`` / ``#share=``) and its ``--slowdown`` / ``--slowdown-phases``; a spare
  (``active: false``) starts off with no models. An ``emulated:PROFILE_SET`` device is
  simulated with that profile set; a real one (``cpu``, ``cuda:N``) with its ``profiles``
  (the set the gateway's least-expected-work reads); without one it is a ConfigError naming
  the device and the field. A static backend (``backends[]``) is a device too: it needs
  ``profiles`` and ``models``.
- Models: each placed model (under placement, every repository model) with its SLO,
  priority, deadline and queue bound from its ``model.yaml`` in ``workers.repo``, its
  profile name (``emulated.profile_name``) and load times (``emulated.load_ms``,
  ``emulated.warm_load_ms``); a model without ``slo_ms`` is a ConfigError naming the model
  and its file.
- One arm, named after the cluster (``live`` when the file names none): the gateway's
  routing, overload refusal (``gateway.overload.enabled``), placement and autoscaling; each
  model's batching from its ``model.yaml`` (``batching_per_model``, with the model's
  ``max_batch_size`` filled in as the worker does); the workers' queue options; and
  ``learn_profiles`` when the workers get ``--learn-profiles``. The simulator has one value
  of these per arm: workers that differ in them are a ConfigError.
- The run lasts the trace's span (``experiment.tune.replay_trace``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evenserve.cluster.file import LoadedCluster, load_cluster
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, ModelOptions, QueueOptions
from evenserve.core.slowdown import parse_slowdown_phases
from evenserve.experiment.tune import replay_trace
from evenserve.runtime.device import parse_device
from evenserve.sim.loader import LoadedScenario, parse_scenario
from evenserve.worker.repository import ModelEntry, load_model

#: The batching of a model.yaml without one (what a worker runs then).
DEFAULT_BATCHING: dict[str, Any] = {"policy": "fixed-window", "max_batch_delay_ms": 0}
#: The arm's name when the cluster file names none.
DEFAULT_ARM = "live"


def _flag(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a worker's extra_args (``--flag V`` or ``--flag=V``)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.partition("=")[2]
    return value


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {text!r}") from None


class _Sources:
    """Profile sets by folder, named uniquely (the folder's name, then NAME-2, ...)."""

    def __init__(self) -> None:
        self.sets: dict[str, str] = {}

    def name_of(self, folder: Path) -> str:
        path = str(folder.resolve())
        for name, p in self.sets.items():
            if p == path:
                return name
        name, n = folder.name or "profiles", 1
        while name in self.sets:
            n += 1
            name = f"{folder.name}-{n}"
        self.sets[name] = path
        return name


def _profile_folder(cluster: LoadedCluster, name: str, where: str) -> Path:
    found = cluster.profile_dir(name)
    if found is None:
        raise ConfigError(f"{where}: profile set {name!r} not found")
    return found


def _one(values: dict[str, Any], what: str) -> Any:
    """The single value every worker gives ``what`` (the simulator's arm has one)."""
    distinct = {repr(v): v for v in values.values()}
    if len(distinct) > 1:
        shown = ", ".join(f"{k}: {v!r}" for k, v in values.items())
        raise ConfigError(
            f"workers.devices: {what} differs between workers ({shown}); the simulator's arm "
            "has one value: give every worker the same"
        )
    return next(iter(distinct.values()), None)


def cluster_scenario(cluster: LoadedCluster, source: str = "cluster") -> LoadedScenario:
    """The cluster as a scenario of one arm (module docstring); its workload is a placeholder
    (nothing arrives, for one second) until :func:`replay_trace` puts a trace in."""
    cfg = cluster.config
    gw = cfg.gateway
    placement = gw.placement_settings()
    sets = _Sources()
    devices: list[dict[str, Any]] = []
    queue: dict[str, Any] = {}
    learn: dict[str, bool] = {}
    util_window: dict[str, float] = {}
    w = cfg.workers
    repo_models = cluster.repo_models() if w is not None else []
    for i, d in enumerate(w.devices if w is not None else []):
        where = f"workers.devices.{i} ({d.name})"
        target = parse_device(d.device)
        if target.kind == "emulated" and target.profile_set is not None:
            folder = _profile_folder(cluster, target.profile_set, f"{where}.device")
        elif d.profiles is not None:
            folder = _profile_folder(cluster, d.profiles, f"{where}.profiles")
        else:
            raise ConfigError(
                f"{where}: device {d.device!r} has no profile set to simulate it with: add "
                f"workers.devices.{i}.profiles: PROFILE_SET_DIR (its measured profiles, "
                "`evenserve profile`), or run it as emulated:PROFILE_SET"
            )
        models = list(d.models) if d.models is not None else list(repo_models)
        dev: dict[str, Any] = {
            "name": d.name,
            "models": models if d.active else [],
            "profile_set": sets.name_of(folder),
            **DeviceOptions.of(d).model_dump(),
        }
        if not d.active:
            dev["active"] = False
        if target.slice is not None:
            dev["slice"] = target.slice.text
        slowdown = _flag(d.extra_args, "--slowdown")
        if slowdown is not None:
            dev["slowdown"] = _number(slowdown, f"{where}.extra_args: --slowdown")
        phases = _flag(d.extra_args, "--slowdown-phases")
        if phases is not None:
            flag = f"{where}.extra_args: --slowdown-phases"
            dev["slowdown_phases"] = [
                {"start_s": s, "end_s": e, "multiplier": m}
                for s, e, m in parse_slowdown_phases(phases, flag)
            ]
        devices.append(dev)
        queue[d.name] = QueueOptions.of(d).model_dump(exclude_none=True)
        learn[d.name] = "--learn-profiles" in d.extra_args
        uw = _flag(d.extra_args, "--utilization-window-s")
        if uw is not None:
            util_window[d.name] = _number(uw, f"{where}.extra_args: --utilization-window-s")
    for i, b in enumerate(cfg.backends):
        where = f"backends.{i} ({b.name})"
        if b.profiles is None:
            raise ConfigError(
                f"{where}: no profile set to simulate it with: add backends.{i}.profiles: "
                "PROFILE_SET_DIR (its measured profiles, `evenserve profile`)"
            )
        if b.models is None:
            raise ConfigError(
                f"{where}: the simulator needs what it hosts: add backends.{i}.models"
            )
        if b.profile_speed != 1.0:
            raise ConfigError(
                f"{where}.profile_speed: the simulator runs a backend at its profiles' speed "
                "(1); a slower one is a worker device with a slice (emulated:SET#mig=...)"
            )
        folder = _profile_folder(cluster, b.profiles, f"{where}.profiles")
        devices.append(
            {"name": b.name, "models": list(b.models), "profile_set": sets.name_of(folder)}
        )
    placed = {m for d in devices for m in d["models"]}
    wanted = sorted(set(repo_models) | placed) if placement is not None else sorted(placed)
    if not wanted:
        raise ConfigError(f"{source}: no models placed on any device")
    entries = {m: _model_entry(cluster, m) for m in wanted}
    model_specs = {m: _model_spec(e) for m, e in entries.items()}
    arm: dict[str, Any] = {
        "routing": gw.routing,
        "batching": DEFAULT_BATCHING,
        "batching_per_model": {m: e.batching_spec() for m, e in entries.items()},
        "overload_refusals": gw.overload.enabled,
        **(_one(queue, "the queue options") or {}),
        "learn_profiles": bool(_one(learn, "--learn-profiles")),
    }
    if placement is not None:
        arm.update(
            placement=placement.policy,
            placement_interval_ms=placement.interval_ms,
            load_wait_ms=placement.load_wait_ms,
            host_memory_gb=placement.host_memory_gb,
            autoscaling=gw.autoscaling,
        )
    signals: dict[str, Any] = {"interval_ms": gw.signals.interval_ms, "window": gw.signals.window}
    uw_s = _one(util_window, "--utilization-window-s")
    if uw_s is not None:
        signals["utilization_window_ms"] = float(uw_s) * 1000.0
    arm_name = cfg.name if "name" in cfg.model_fields_set else DEFAULT_ARM
    raw = {
        "name": cfg.name,
        "seed": gw.seed,
        "duration_s": 1.0,
        "profile_sets": sets.sets,
        "signals": signals,
        "devices": devices,
        "models": model_specs,
        "workload": {"type": "open-loop", "rates_rps": dict.fromkeys(model_specs, 0.0)},
        "arms": {arm_name: arm},
    }
    return parse_scenario(raw, cluster.base_dir, f"{source} (as a scenario)")


def _model_entry(cluster: LoadedCluster, model: str) -> ModelEntry:
    w = cluster.config.workers
    if w is None:
        raise ConfigError(
            f"models.{model}: the simulator reads each model's SLO from its model.yaml: add "
            "workers.repo (a model repository holding it)"
        )
    folder = cluster.resolve(w.repo) / model
    if not folder.is_dir():
        raise ConfigError(
            f"models.{model}: no folder {folder} in workers.repo (its model.yaml gives the "
            "simulator its SLO and batching)"
        )
    return load_model(folder, check_profile=False)


def _model_spec(e: ModelEntry) -> dict[str, Any]:
    cfg = e.config
    if cfg.slo_ms is None:
        raise ConfigError(
            f"models.{e.name}: {e.source}: slo_ms: the simulator needs the model's latency SLO "
            "(add slo_ms: MS)"
        )
    out: dict[str, Any] = cfg.model_dump(include=set(ModelOptions.model_fields))
    if cfg.deadline_ms is None and cfg.queue_timeout_ms is not None:
        out["deadline_ms"] = cfg.queue_timeout_ms
    em = e.emulated_params
    if em is not None:
        if em.profile_name is not None and em.profile_name != e.name:
            out["profile"] = em.profile_name
        if em.load_ms is not None:
            out["load_ms"] = em.load_ms
        if em.warm_load_ms is not None:
            out["warm_load_ms"] = em.warm_load_ms
    return out


def replay_on_cluster(cluster_path: Path, trace: Path) -> LoadedScenario:
    """The cluster file ``cluster_path`` as a scenario (:func:`cluster_scenario`) with the
    JSONL ``trace`` as its workload, for the trace's span."""
    cluster = load_cluster(cluster_path)
    return replay_trace(cluster_scenario(cluster, str(cluster_path)), trace)
