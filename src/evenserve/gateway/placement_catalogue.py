"""What the placement controller manages, read from the cluster file: its catalogue (every
model, described by the first profile set that has it, with the load times its worker has)
and its devices (every worker device, active or a spare, and every listed evenserve
backend).

An LLM folder (``kind: llm``) with a ``placement:`` section is in the catalogue as its engine
(``policy.placement.engine.engine_info``, the object the simulator builds from the same
fields: weights and KV cache on a device, weights in host memory asleep, a wake of
``warm_load_ms``, a load from disk of ``cold_load_ms``), with its step profile: the folder's
``step_profile`` file, else the first worker device's profile set that has one of its name;
its ``max_model_len``, ``engine.max_num_seqs`` and ``ttft_ms`` (its SLO) as the worker reads
them. An LLM folder without one is served awake where it is started and not placed.

A classic model's batch time and size are the profile's at the batch size the worker runs it
at: its model.yaml's ``batching`` (default fixed-window) under its ``max_batch_size`` by the
batch-cap rule (``sched.setup``), as the worker and the simulator apply it; its SLO is its
``slo_ms``. (Before, the profile's largest batch stood in: 64 where the model ran at 8, so
the controller's capacity of a model was not the simulator's.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from evenserve.cluster.file import LoadedCluster
from evenserve.core.errors import ConfigError
from evenserve.core.llm import StepProfile, load_step_profile, load_step_profiles
from evenserve.core.profile import LatencyProfile
from evenserve.core.scenario import default_load_times_s
from evenserve.core.validation import validate_document
from evenserve.policy.placement import ModelInfo
from evenserve.policy.placement.engine import EnginePlacement, engine_info
from evenserve.runtime.device import parse_device
from evenserve.sched.setup import batching_setup

GIB = 1024.0**3
#: Memory of a device whose size the cluster file does not give (DeviceOptions' default).
DEFAULT_MEMORY_GB = 24.0


def model_info(
    name: str,
    profile: LatencyProfile | None,
    max_batch_size: int | None = None,
    load_s: float | None = None,
    warm_load_s: float | None = None,
    slo_s: float | None = None,
) -> ModelInfo:
    """A catalogue entry: weights from the profile (0 without one), cold and warm load times
    with the scenario's defaults (``core.scenario.default_load_times_s``; ``load_s`` and
    ``warm_load_s``, the model's own, replace them), batch time and size from the profile at
    the batching cap (default: the profile's largest batch)."""
    weights = profile.weights_bytes if profile is not None else 0.0
    cold, warm = default_load_times_s(weights)
    if load_s is not None:
        cold = load_s
    if warm_load_s is not None:
        warm = warm_load_s
    if profile is None:
        return ModelInfo(name, weights, cold, warm, 0.0, max_batch_size or 1, slo_s)
    cap = max_batch_size or max(profile.batches, default=1)
    return ModelInfo.from_profile(name, profile, cap, cold, warm, slo_s)


def run_batch_size(raw: Mapping[str, Any]) -> int | None:
    """The largest batch a model runs at, from its model.yaml (the module docstring); None
    where the file does not say or its batching does not build (the worker refuses it)."""
    mbs = raw.get("max_batch_size")
    cap = mbs if isinstance(mbs, int) and not isinstance(mbs, bool) and mbs >= 1 else None
    spec = raw.get("batching")
    try:
        return batching_setup(
            spec if spec is not None else {"policy": "fixed-window"}, cap, "batching"
        ).policy.max_batch_size
    except (ConfigError, ValueError, TypeError):
        return cap


@dataclass(frozen=True)
class DeviceSetup:
    """One device the controller manages (a worker device or an evenserve backend)."""

    name: str
    memory_bytes: float
    models: tuple[str, ...]
    active: bool = True


def cluster_setup(
    cluster: LoadedCluster, profile_sets: Mapping[str, Mapping[str, LatencyProfile]]
) -> tuple[dict[str, ModelInfo], list[DeviceSetup]]:
    """The catalogue and devices of a cluster file: every worker device (its ``memory_gb``,
    its configured models, active or a spare) and every listed evenserve backend (24 GiB);
    the catalogue is the repository's models and every configured one, each described by
    the first profile set that has it."""
    devices: list[DeviceSetup] = []
    names_: set[str] = set()
    w = cluster.config.workers
    if w is not None:
        repo = cluster.repo_models()
        names_.update(repo)
        for d in w.devices:
            models = tuple(d.models if d.models is not None else repo)
            names_.update(models)
            devices.append(
                DeviceSetup(d.name, d.memory_gb * GIB, models if d.active else (), d.active)
            )
    for b in cluster.config.backends:
        if b.signals.source != "evenserve":
            continue
        models = tuple(b.models or ())
        names_.update(models)
        devices.append(DeviceSetup(b.name, DEFAULT_MEMORY_GB * GIB, models))
    infos: dict[str, ModelInfo] = {}
    step_dirs = _step_profile_dirs(cluster)
    for m in sorted(names_):
        llm = llm_section(cluster, m)
        if llm is not None:
            w = cluster.config.workers
            assert w is not None
            engine = llm_model_info(m, llm, cluster.resolve(w.repo) / m, step_dirs)
            if engine is not None:
                infos[m] = engine
            continue
        raw = repo_model(cluster, m)
        section = raw.get("emulated")
        em: dict[str, Any] = section if isinstance(section, dict) else {}
        pname = em.get("profile_name")
        key = pname if isinstance(pname, str) else m
        prof = next((ps[key] for ps in profile_sets.values() if key in ps), None)
        load_s, warm_s = (_seconds(em.get(k)) for k in ("load_ms", "warm_load_ms"))
        infos[m] = model_info(
            m, prof, run_batch_size(raw), load_s, warm_s, _seconds(raw.get("slo_ms"))
        )
    return infos, devices


def _step_profile_dirs(cluster: LoadedCluster) -> list[Path]:
    """The profile sets of the worker devices (``emulated:SET``), in their order."""
    w = cluster.config.workers
    out: list[Path] = []
    for d in w.devices if w is not None else ():
        try:
            target = parse_device(d.device)
        except ConfigError:
            continue
        if target.kind == "emulated" and target.profile_set is not None:
            where = cluster.profile_dir(target.profile_set)
            if where is not None and where not in out:
                out.append(where)
    return out


def llm_section(cluster: LoadedCluster, model: str) -> dict[str, Any] | None:
    """A repository model's model.yaml when it is an LLM folder (``kind: llm``), else None."""
    w = cluster.config.workers
    if w is None:
        return None
    raw = _read(cluster.resolve(w.repo) / model / "model.yaml")
    return raw if raw.get("kind") == "llm" else None


def llm_model_info(
    name: str, raw: Mapping[str, Any], folder: Path, step_dirs: Sequence[Path]
) -> ModelInfo | None:
    """An LLM folder's engine as placement sees it (the module docstring); None without a
    ``placement:`` section. ConfigError naming the file and the field."""
    source = folder / "model.yaml"
    section = raw.get("placement")
    if section is None:
        return None
    spec = validate_document(EnginePlacement, section, f"{source}: placement")
    profile = _llm_step_profile(name, raw, folder, step_dirs)
    if profile is None:
        raise ConfigError(
            f"{source}: step_profile: placement needs the engine's step profile (a file, or "
            f"a kind: llm-step profile named {name!r} in a worker device's profile set)"
        )
    max_len = raw.get("max_model_len")
    if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0:
        profile = replace(profile, max_model_len=max_len)
    engine = raw.get("engine") if isinstance(raw.get("engine"), dict) else {}
    seqs = engine.get("max_num_seqs", 64) if isinstance(engine, dict) else 64
    ttft = raw.get("ttft_ms")
    slo = ttft / 1e3 if isinstance(ttft, int | float) and not isinstance(ttft, bool) else None
    try:
        return engine_info(name, profile, spec, int(seqs), slo)
    except ValueError as exc:
        raise ConfigError(f"{source}: placement.{exc}") from exc


def _llm_step_profile(
    name: str, raw: Mapping[str, Any], folder: Path, step_dirs: Sequence[Path]
) -> StepProfile | None:
    own = raw.get("step_profile")
    if isinstance(own, str):
        return load_step_profile((folder / own).resolve())
    for d in step_dirs:
        found = load_step_profiles(d).get(name)
        if found is not None:
            return found
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _seconds(ms: Any) -> float | None:
    return None if isinstance(ms, bool) or not isinstance(ms, int | float) else ms / 1e3


def repo_model(cluster: LoadedCluster, model: str) -> dict[str, Any]:
    """A repository model's model.yaml ({} if none or unreadable). Its ``emulated:`` section
    gives the ``profile_name`` (the profile in the device's set, default the model's name)
    and the ``load_ms`` and ``warm_load_ms`` (what the emulated worker sleeps for a cold and a
    warm load), so the controller plans with the weights and the load times the worker has;
    its ``max_batch_size``, ``batching`` and ``slo_ms`` the batch it runs at and its SLO."""
    w = cluster.config.workers
    if w is None:
        return {}
    return _read(cluster.resolve(w.repo) / model / "model.yaml")
