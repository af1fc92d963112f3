"""The worker's warm-up (``worker.warmup``, ``--warmup``): which batch sizes run, twice each
and in order; emulated models skipped; a failing batch names the model and the size; the
load info; and neither a starting worker nor a model-control load is ready before its
warm-up is done. Fake runtimes and a fake timer: no wall-clock assertions."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
import yaml

from evenserve.cli.worker_cmd import worker
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions
from evenserve.runtime.base import Array
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.models.loading import build
from evenserve.worker.models.registry import LOADING, READY
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import ModelEntry, load_model, load_repository
from evenserve.worker.warmup import (
    VARIABLE_DIM,
    other_lengths,
    parse_warmup,
    warm_up_model,
    warmup_batch,
    warmup_sizes,
)
from tests.unit.worker.fakes import PROFILE

TINY = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny"

MODEL = {
    "runtime": "emulated",
    "max_batch_size": 4,
    "inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [-1], "example_shape": [5]},
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},  # no example_shape: 8
    ],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
    "emulated": {"profile": "profile.yaml"},
}


def _repo(tmp_path: Path, names: tuple[str, ...] = ("m",)) -> Path:
    for n in names:
        d = tmp_path / "repo" / n
        d.mkdir(parents=True)
        (d / "model.yaml").write_text(yaml.safe_dump(MODEL))
        (d / "profile.yaml").write_text(yaml.safe_dump({**PROFILE, "model": n}))
    return tmp_path / "repo"


def _entry(tmp_path: Path) -> ModelEntry:
    return load_model(_repo(tmp_path) / "m")


class FakeRuntime:
    """A real-looking runtime: records the batch size of every run; ``fail_at`` raises on
    that size; ``gate`` (set: go on) holds every run until it is set, ``running`` set once
    the first run started."""

    def __init__(self, fail_at: int | None = None, gate: threading.Event | None = None) -> None:
        self.calls: list[int] = []
        self.threads: list[str] = []
        self.shapes: list[dict[str, tuple[int, ...]]] = []
        self.fail_at = fail_at
        self.gate = gate
        self.running = threading.Event()
        self.loaded = False

    def load(self) -> None:
        self.loaded = True

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        b = int(next(iter(inputs.values())).shape[0])
        self.running.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never released the warm-up"
        self.calls.append(b)
        self.threads.append(threading.current_thread().name)
        self.shapes.append({k: v.shape for k, v in inputs.items()})
        if b == self.fail_at:
            raise RuntimeError("out of memory")
        return {"y": np.zeros((b, 2), dtype=np.float32)}

    def resident_bytes(self) -> float:
        return 0.0

    def batch_memory_bytes(self, batch: int) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"runtime": "fake"}

    def close(self) -> None:
        self.loaded = False


def _ticks() -> Any:
    """A timer going up 1 ms a call."""
    counter = itertools.count()
    return lambda: next(counter) / 1000.0


# -- which sizes --------------------------------------------------------------------------
def test_parse_warmup() -> None:
    assert parse_warmup("all") == "all"
    assert parse_warmup(" First ") == "first"
    assert parse_warmup("none") == "none"
    assert parse_warmup("8,1,2,4,2") == (1, 2, 4, 8)
    for bad in ("some", "1,x", "", ",", "0,2", "-1"):
        with pytest.raises(ValueError):
            parse_warmup(bad)


def test_warmup_sizes() -> None:
    assert warmup_sizes("all", 4) == [1, 2, 3, 4]
    assert warmup_sizes("first", 4) == [1]
    assert warmup_sizes("none", 4) == []
    assert warmup_sizes((1, 2, 4, 8, 16), 6) == [1, 2, 4]  # clipped to max_batch_size


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [("all", [1, 2, 3, 4]), ("first", [1]), ("none", []), ((2, 4, 8), [2, 4])],
)
def test_runs_the_sizes_in_order_twice_each(tmp_path: Path, spec: Any, sizes: list[int]) -> None:
    rt = FakeRuntime()
    report = warm_up_model(_entry(tmp_path), rt, spec, timer=_ticks())
    # then the smallest size again at other variable lengths (ids and x vary), twice
    assert rt.calls == [b for b in sizes for _ in range(2)] + sizes[:1] * 2
    assert report.batch_sizes == sizes
    assert list(report.first_ms) == sizes and list(report.second_ms) == sizes
    info = report.info()
    assert info["warmup_batch_sizes"] == sizes
    assert set(info) == {
        "warmup_batch_sizes",
        "warmup_seconds",
        "warmup_first_ms",
        "warmup_second_ms",
        "warmup_variable",
    }
    if not sizes:
        assert report.worst_ratio() is None and info["warmup_first_ms"] == {}
        assert info["warmup_variable"] is None
    else:
        assert info["warmup_variable"]["batch"] == sizes[0]
        assert info["warmup_variable"]["shapes"] == {"ids": [2], "x": [4, 3]}


def test_batches_follow_model_yaml(tmp_path: Path) -> None:
    rt = FakeRuntime()
    warm_up_model(_entry(tmp_path), rt, (3,))
    # example_shape for ids; the variable dim of x without one is 8
    assert rt.shapes[:2] == [{"ids": (3, 5), "x": (3, VARIABLE_DIM, 3)}] * 2
    # and at other variable lengths: half of each (a compiled model turns them dynamic)
    assert rt.shapes[2:] == [{"ids": (3, 2), "x": (3, VARIABLE_DIM // 2, 3)}] * 2
    assert other_lengths(load_repository(TINY, ["tiny-resnet"], check_profiles=False)[0]) is None
    (entry,) = load_repository(TINY, ["tiny-bert"], check_profiles=False)
    batch = warmup_batch(entry, 2, np.random.default_rng(0))
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"].dtype == np.int64
    assert batch["attention_mask"].min() == 1 and batch["input_ids"].max() < 100  # synthetic


def test_worst_ratio(tmp_path: Path) -> None:
    from evenserve.worker.warmup import WarmupReport

    r = WarmupReport([1, 2], 1.0, {1: 30.0, 2: 4.0}, {1: 3.0, 2: 2.0})
    assert r.worst_ratio() == (1, 10.0)


def test_emulated_runtimes_are_skipped(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    rt = entry.create_runtime(parse_device("cpu"), cpu_threads=None, profiles_dir=None)
    calls: list[int] = []
    rt.run = lambda inputs: calls.append(1) or {}  # type: ignore[method-assign]
    report = warm_up_model(entry, rt, "all")
    assert calls == [] and report.batch_sizes == [] and report.info()["warmup_seconds"] == 0.0


def test_a_failing_batch_names_model_and_size(tmp_path: Path) -> None:
    rt = FakeRuntime(fail_at=3)
    with pytest.raises(ConfigError, match=r"model 'm': warm-up batch of size 3 failed: "):
        warm_up_model(_entry(tmp_path), rt, "all")
    assert rt.calls == [1, 1, 2, 2, 3]


# -- the service --------------------------------------------------------------------------
def _service(tmp_path: Path, rt: FakeRuntime, warmup: Any = "all") -> Worker:
    repo = _repo(tmp_path)
    service = Worker(
        load_repository(repo, ["m"]),
        WorkerOptions(device=parse_device("cpu"), profiles_dir=None, warmup=warmup),
    )
    service.models["m"].runtime = rt  # a runtime that really runs batches
    return service


async def test_load_info_carries_the_warmup(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeRuntime(), warmup=(1, 2, 8))
    service.load()
    info = service.models["m"].load_info
    assert info["warmup_batch_sizes"] == [1, 2]
    assert set(info["warmup_first_ms"]) == {1, 2} and set(info["warmup_second_ms"]) == {1, 2}
    assert info["warmup_seconds"] >= 0 and info["load_source"] == "disk"
    assert service.models["m"].description["warmup_batch_sizes"] == [1, 2]
    assert service.models["m"].stats.load is not None
    assert service.models["m"].stats.load["warmup_batch_sizes"] == [1, 2]


async def test_warmup_runs_on_each_device_thread(tmp_path: Path) -> None:
    """A first call on a new thread costs extra: the warm-up runs where batches will."""
    rt = FakeRuntime()
    service = Worker(
        load_repository(_repo(tmp_path), ["m"]),
        WorkerOptions(
            device=parse_device("cpu"),
            profiles_dir=None,
            warmup=(1, 2),
            run=DeviceOptions(instances=3),
        ),
    )
    service.models["m"].runtime = rt
    service.load()
    assert rt.calls == [1, 1, 2, 2, 1, 1] * 3
    assert len(set(rt.threads)) == 3
    assert all(t.startswith("evenserve-device") for t in rt.threads)
    await service.start()
    try:
        assert service.device.executor is not None
        pool_threads = set(
            service.device.executor.on_each_thread(lambda: threading.current_thread().name)
        )
        assert pool_threads == set(rt.threads)
    finally:
        service.begin_drain()
        await service.stop()


def test_a_failing_warmup_fails_the_load(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeRuntime(fail_at=2))
    with pytest.raises(ConfigError, match=r"model.yaml: model 'm': warm-up batch of size 2"):
        service.load()


async def test_worker_not_ready_before_warmup_ends(tmp_path: Path) -> None:
    gate = threading.Event()
    rt = FakeRuntime(gate=gate)
    service = _service(tmp_path, rt)
    loading = asyncio.ensure_future(asyncio.to_thread(service.load))
    try:
        assert await asyncio.to_thread(rt.running.wait, 30)
        assert rt.loaded and not service.ready
        assert service.models.state("m").state == LOADING
        assert not service.models.model_ready("m")
        assert service.models["m"].load_info is None
    finally:
        gate.set()
        await loading
    assert rt.calls == [1, 1, 2, 2, 3, 3, 4, 4, 1, 1]
    await service.start()
    try:
        assert service.ready and service.models.model_ready("m")
    finally:
        service.begin_drain()
        await service.stop()


async def test_model_control_load_not_ready_before_warmup_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path)
    service = Worker(
        [],
        WorkerOptions(
            device=parse_device("cpu"),
            profiles_dir=None,
            model_control="explicit",
            repository=repo,
            warmup="first",
        ),
    )
    gate = threading.Event()
    rt = FakeRuntime(gate=gate)
    monkeypatch.setattr(
        "evenserve.worker.models.control.build",
        lambda *a: dataclasses.replace(build(*a), runtime=rt),
    )
    service.load()
    await service.start()
    try:
        loading = asyncio.ensure_future(service.control.load_model("m"))
        try:
            assert await asyncio.to_thread(rt.running.wait, 30)
            assert service.models.state("m").state == LOADING and not service.models.model_ready(
                "m"
            )
        finally:
            gate.set()
        info = await loading
        assert service.models.state("m").state == READY and service.models.model_ready("m")
        assert rt.calls == [1, 1, 1, 1]
        assert info["warmup_batch_sizes"] == [1]
        assert service.models["m"].load_info["warmup_batch_sizes"] == [1]
    finally:
        service.begin_drain()
        await service.stop()


# -- the CLI ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["some", "1,two", "0"])
def test_cli_rejects_a_bad_warmup(
    tmp_path: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as exc:
        worker(repo=_repo(tmp_path), warmup=bad, port=0)
    assert exc.value.exit_code == 2
    assert "--warmup" in capsys.readouterr().err


def test_cli_passes_the_warmup(tmp_path: Path, served: list[Worker]) -> None:
    worker(repo=_repo(tmp_path), warmup="1,2,16", port=0, profiles_dir=tmp_path)
    assert served[0].options.warmup == (1, 2, 16)
    # an emulated model: not warmed up
    assert served[0].models["m"].load_info["warmup_batch_sizes"] == []
