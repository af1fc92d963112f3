"""Load a scenario file: YAML -> typed Scenario, policies and profiles checked, one clear error.

``--set key=value`` overrides address the YAML by dotted path (``workload.users=50``,
``arms.optimized.batching.max_batch_delay_ms=30``); values are parsed as YAML scalars.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile, load_profile_set
from evenserve.core.scenario import CENTRAL_QUEUE, DeviceSpec, Scenario
from evenserve.core.validation import read_yaml, validate_document
from evenserve.policy.batching import BATCHING
from evenserve.policy.routing import ROUTING

GIB = 1024.0**3


@dataclass
class LoadedScenario:
    scenario: Scenario
    base_dir: Path
    profile_sets: dict[str, dict[str, LatencyProfile]]

    def profiles_for(self, device: DeviceSpec) -> dict[str, LatencyProfile]:
        """Model name -> profile for the models placed on ``device``."""
        return {m: self.profile_of(device, m) for m in device.models}

    def profile_of(self, device: DeviceSpec, model: str) -> LatencyProfile:
        """The profile of ``model`` on ``device`` (any model: placement may load it there);
        a MIG slice runs it at its compute fraction (core.slices)."""
        ps = self.profile_sets[self.scenario.profile_set_of(device)]
        return ps[self.scenario.models[model].profile or model].at_speed(device.compute_fraction)

    def resolve(self, relative: str) -> Path:
        return self.base_dir / relative  # an absolute path stays as it is


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, _, value = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set {item!r}: empty key")
        node: Any = raw
        for i, p in enumerate(parts[:-1]):
            if isinstance(node, list):
                try:
                    node = node[int(p)]
                except (ValueError, IndexError):
                    raise ConfigError(f"--set {key}: no list item {p!r}") from None
                continue
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} is not a mapping")
            nxt = node.get(p)
            if nxt is None or isinstance(nxt, str):
                # A new mapping; a bare policy name gains parameters: {policy: static, ...}.
                nxt = node[p] = {} if nxt is None else {"policy": nxt}
            node = nxt
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        if isinstance(node, list):
            try:
                node[int(parts[-1])] = parsed
            except (ValueError, IndexError):
                raise ConfigError(f"--set {key}: no list item {parts[-1]!r}") from None
        else:
            node[parts[-1]] = parsed
    return raw


def parse_scenario(raw: Any, base_dir: Path, source: str = "scenario") -> LoadedScenario:
    sc = validate_document(Scenario, raw, source)
    for arm, spec in sc.arms.items():
        if spec.routing != CENTRAL_QUEUE:
            ROUTING.parse(spec.routing, f"{source}: arms.{arm}.routing")
        BATCHING.parse(spec.batching, f"{source}: arms.{arm}.batching")
        for m, b in spec.batching_per_model.items():
            BATCHING.parse(b, f"{source}: arms.{arm}.batching_per_model.{m}")
        if spec.placement is not None or spec.autoscaling is not None:
            # Imported here: a scenario without placement does not load the placement
            # policies (startup is part of every simulator run's cost).
            from evenserve.policy.placement import AUTOSCALING, PLACEMENT
        if spec.placement is not None:
            if spec.routing == CENTRAL_QUEUE:
                raise ConfigError(f"{source}: arms.{arm}.placement: not with central-queue")
            PLACEMENT.parse(spec.placement, f"{source}: arms.{arm}.placement")
        if spec.autoscaling is not None:
            AUTOSCALING.parse(spec.autoscaling, f"{source}: arms.{arm}.autoscaling")
    sets: dict[str, dict[str, LatencyProfile]] = {}
    for name, rel in sc.profile_sets.items():
        try:
            sets[name] = load_profile_set(base_dir / rel)
        except ConfigError as exc:
            raise ConfigError(f"{source}: profile_sets.{name}: {exc}") from exc
    for d in sc.expanded_devices():
        ps_name = sc.profile_set_of(d)
        for m in d.models:
            prof = sc.models[m].profile or m
            if prof not in sets[ps_name]:
                raise ConfigError(
                    f"{source}: models.{m}.profile: no profile {prof!r} in profile set "
                    f"{ps_name!r} ({sc.profile_sets[ps_name]}), needed by device {d.name!r}"
                )
    _check_placement_arms(sc, sets, source)
    return LoadedScenario(scenario=sc, base_dir=base_dir, profile_sets=sets)


def _check_placement_arms(
    sc: Scenario, sets: dict[str, dict[str, LatencyProfile]], source: str
) -> None:
    """Under placement every model may be loaded on every device of the arm (it needs a
    profile in each one's set), and the initial placement fits each device's memory."""
    index = {d.name: i for i, d in enumerate(sc.expanded_devices())}
    for arm, spec in sc.arms.items():
        if spec.placement is None:
            continue
        for d in sc.arm_devices(arm):
            ps_name = sc.profile_set_of(d)
            for m, ms in sc.models.items():
                prof = ms.profile or m
                if prof not in sets[ps_name]:
                    raise ConfigError(
                        f"{source}: models.{m}.profile: no profile {prof!r} in profile set "
                        f"{ps_name!r}, needed by arms.{arm} (placement) on device {d.name!r}"
                    )
            used = sum(sets[ps_name][sc.models[m].profile or m].weights_bytes for m in d.models)
            if used > d.memory_total_bytes:
                raise ConfigError(
                    f"{source}: devices[{index[d.name]}].models: weights {used / GIB:.2f} GiB "
                    f"over the {d.memory_total_bytes / GIB:.2f} GiB of {d.name!r} "
                    f"(arms.{arm} places them)"
                )


def with_level(loaded: LoadedScenario, level: str | None) -> LoadedScenario:
    """The loaded scenario at a named load level (unchanged when ``level`` is None)."""
    if level is None:
        return loaded
    try:
        sc = loaded.scenario.at_level(level)
    except ValueError as exc:
        raise ConfigError(f"--level: {exc}") from None
    return LoadedScenario(scenario=sc, base_dir=loaded.base_dir, profile_sets=loaded.profile_sets)


def load_scenario(path: Path | str, overrides: Iterable[str] = ()) -> LoadedScenario:
    path = Path(path)
    raw = read_yaml(path, f"scenario file not found: {path}")
    if isinstance(raw, dict):
        raw = apply_overrides(raw, overrides)
    return parse_scenario(raw, path.parent, str(path))
