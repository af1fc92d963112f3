"""One typed model of the device, queue and model options: the same names, bounds and errors
in scenario files, cluster files, model.yaml and the worker's flags."""

from __future__ import annotations

import inspect
from typing import get_type_hints

import pytest
import typer

from evenserve.cli import worker_cmd
from evenserve.cluster.workers_section import DeviceEntry
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, ModelOptions, QueueOptions
from evenserve.core.scenario import ArmSpec, DeviceSpec, ModelSpec
from evenserve.worker.model_config import ModelConfig


def _worker_flags() -> set[str]:
    """Every flag name ``evenserve worker`` accepts."""
    hints = get_type_hints(worker_cmd.worker, include_extras=True)
    names: set[str] = set()
    for p in inspect.signature(worker_cmd.worker).parameters:
        for meta in getattr(hints[p], "__metadata__", ()):
            if isinstance(meta, typer.models.OptionInfo):
                # In Annotated form typer reads a leading "--name" as the first declaration.
                first = [meta.default] if isinstance(meta.default, str) else []
                decls = [d for d in (*first, *(meta.param_decls or ())) if d.startswith("--")]
                names.update(decls or ["--" + p.replace("_", "-")])
    return names


def test_every_option_is_a_worker_flag_of_the_same_name() -> None:
    flags = _worker_flags()
    for model in (DeviceOptions, QueueOptions):
        for name in model.model_fields:
            assert "--" + name.replace("_", "-") in flags, name


def test_the_files_share_the_fields() -> None:
    for spec, options in [
        (DeviceSpec, DeviceOptions),
        (DeviceEntry, DeviceOptions),
        (ArmSpec, QueueOptions),
        (DeviceEntry, QueueOptions),
        (ModelSpec, ModelOptions),
        (ModelConfig, ModelOptions),
    ]:
        assert set(options.model_fields) <= set(spec.model_fields), (spec, options)
        assert issubclass(spec, options)


def test_flags_written_for_the_launcher() -> None:
    q = QueueOptions(max_queue_per_model=40, starvation_ms=500, ignore_priority=True)
    assert q.flags() == [
        "--max-queue-per-model",
        "40",
        "--starvation-ms",
        "500.0",
        "--ignore-priority",
    ]
    assert QueueOptions().flags() == []
    d = DeviceOptions(instances=2, interference=0.25)
    assert d.flags(only={"instances"}) == ["--instances", "2"]
    # What the launcher writes, the worker reads back to the same options.
    flags = d.flags()
    read = {f[2:].replace("-", "_"): v for f, v in zip(flags[::2], flags[1::2], strict=True)}
    assert DeviceOptions.from_flags(**read) == d
    entry = DeviceEntry(name="gpu0", device="cpu", instances=3, class_headroom=0.5)
    # Only what the file sets: the worker's own defaults hold for the rest.
    assert entry.option_flags() == ["--instances", "3", "--class-headroom", "0.5"]
    assert QueueOptions.of(entry).class_headroom == 0.5


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"starvation_ms": 0}, r"^--starvation-ms: .*greater than 0"),
        ({"class_headroom": 1.5}, r"^--class-headroom: .*less than or equal to 1"),
        ({"max_queue_per_model": 0}, r"^--max-queue-per-model: "),
    ],
)
def test_a_bad_flag_is_named(values: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueOptions.from_flags(**values)


def test_bad_device_flags_are_named() -> None:
    with pytest.raises(ConfigError, match=r"^--instances: "):
        DeviceOptions.from_flags(instances=0)
    with pytest.raises(ConfigError, match=r"^--interference: "):
        DeviceOptions.from_flags(interference=2.0)


def test_a_model_class_by_name_or_number() -> None:
    assert ModelOptions(priority="offline").priority_value == 0
    assert ModelOptions(priority=7).priority_value == 7
    assert ModelOptions().priority_value == 10
    with pytest.raises(ValueError, match="unknown priority class 'batch'"):
        ModelOptions(priority="batch")
    m = ModelOptions(slo_ms=50, deadline_ms=200)
    assert (m.slo_s, m.deadline_s) == (0.05, 0.2)
