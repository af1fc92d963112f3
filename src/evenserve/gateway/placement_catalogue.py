"""What the placement controller manages, read from the cluster file: its catalogue (every
model, described by the first profile set that has it, with the load times its worker has)
and its devices (every worker device, active or a spare, and every listed evenserve
backend)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from evenserve.cluster.file import LoadedCluster
from evenserve.core.profile import LatencyProfile
from evenserve.core.scenario import default_load_times_s
from evenserve.policy.placement import ModelInfo

GIB = 1024.0**3
#: Memory of a device whose size the cluster file does not give (DeviceOptions' default).
DEFAULT_MEMORY_GB = 24.0


def model_info(
    name: str,
    profile: LatencyProfile | None,
    max_batch_size: int | None = None,
    load_s: float | None = None,
    warm_load_s: float | None = None,
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
        return ModelInfo(name, weights, cold, warm, 0.0, max_batch_size or 1)
    cap = max_batch_size or max(profile.batches, default=1)
    return ModelInfo.from_profile(name, profile, cap, cold, warm)


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
    for m in sorted(names_):
        em = emulated_section(cluster, m)
        pname = em.get("profile_name")
        key = pname if isinstance(pname, str) else m
        prof = next((ps[key] for ps in profile_sets.values() if key in ps), None)
        load_s, warm_s = (_seconds(em.get(k)) for k in ("load_ms", "warm_load_ms"))
        infos[m] = model_info(m, prof, load_s=load_s, warm_load_s=warm_s)
    return infos, devices


def _seconds(ms: Any) -> float | None:
    return None if isinstance(ms, bool) or not isinstance(ms, int | float) else ms / 1e3


def emulated_section(cluster: LoadedCluster, model: str) -> dict[str, Any]:
    """The ``emulated:`` section of a repository model's model.yaml ({} if none): its
    ``profile_name`` (the profile in the device's set, default the model's name) and its
    ``load_ms`` and ``warm_load_ms`` (what the emulated worker sleeps for a cold and a warm
    load), so the controller plans with the weights and the load times the worker has."""
    w = cluster.config.workers
    if w is None:
        return {}
    path = cluster.resolve(w.repo) / model / "model.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    em = raw.get("emulated") if isinstance(raw, dict) else None
    return em if isinstance(em, dict) else {}
