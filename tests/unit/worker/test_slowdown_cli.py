"""``evenserve worker --learn-profiles / --slowdown / --slowdown-phases``: what the worker
is told, an emulated batch really slowed, and errors naming the flag."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer

from evenserve.cli.worker_cmd import worker
from evenserve.core.slowdown import SlowdownSchedule
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import EmulatedRuntime, EmulatedSlowdown
from evenserve.worker.app import Worker
from evenserve.worker.repository import load_repository

from .test_model_control_cli import _repo


def test_the_flags_reach_the_worker(tmp_path: Path, served: list[Worker]) -> None:
    repo = _repo(tmp_path)
    worker(repo=repo, port=0)  # plain
    worker(
        repo=repo,
        port=0,
        learn_profiles=True,
        slowdown=1.5,
        slowdown_phases="1:2:3",
    )
    plain, slowed = served
    assert not plain.options.learn_profiles and plain.options.slowdown is None
    assert slowed.options.learn_profiles
    assert slowed.options.slowdown == SlowdownSchedule(1.5, ((1.0, 2.0, 3.0),))
    rt = slowed.models["a"].runtime
    assert isinstance(rt, EmulatedRuntime) and rt.slowdown is not None
    assert rt.slowdown is slowed.models["b"].runtime.slowdown  # one origin for every model


def test_an_emulated_batch_takes_its_profile_times_the_slowdown(tmp_path: Path) -> None:
    repo = _repo(tmp_path, ("a",))
    (entry,) = load_repository(repo)
    rt = entry.create_runtime(parse_device("cpu"), cpu_threads=None, profiles_dir=None)
    assert isinstance(rt, EmulatedRuntime)
    rt.slowdown = EmulatedSlowdown(SlowdownSchedule(10.0))
    x = {"x": np.zeros((4, 4), dtype=np.float32)}
    t0 = time.perf_counter()
    rt.run(x)
    # A lower bound the mechanism guarantees (never before its time): 10 x 2 ms.
    assert time.perf_counter() - t0 >= 0.020


def test_staging_reaches_every_emulated_model(tmp_path: Path, served: list[Worker]) -> None:
    repo = _repo(tmp_path)
    worker(repo=repo, port=0, staging_ms_per_item=2.5)
    (w,) = served
    assert w.options.staging_s_per_item == 0.0025
    for rt in (m.runtime for m in w.models.values()):
        assert isinstance(rt, EmulatedRuntime) and rt.staging_s_per_item == 0.0025


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"staging_ms_per_item": -1}, "--staging-ms-per-item: must be a number >= 0"),
        ({"slowdown": 0}, "--slowdown: must be a number > 0"),
        ({"slowdown_phases": "1:2"}, "--slowdown-phases: phase 1"),
        ({"slowdown_phases": "3:1:2"}, "--slowdown-phases: phase 1 ('3:1:2'): END_S"),
        ({"slowdown_origin_unix": 5.0}, "--slowdown-origin-unix: needs --slowdown-phases"),
    ],
)
def test_bad_flags_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict[str, Any], message: str
) -> None:
    repo = _repo(tmp_path)
    with pytest.raises(typer.Exit):
        worker(repo=repo, port=0, **kw)
    assert message in capsys.readouterr().err
