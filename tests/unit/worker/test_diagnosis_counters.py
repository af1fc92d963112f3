"""The worker's diagnosis counters (design 0012): held, expected and input-staging seconds per
model, the batch cap gauge; and the emulated runtime's input staging, timed as compute_input.
On a FakeClock (the driver) and a fake perf counter (the executor): no wall-clock figures."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evenserve.metrics import names
from evenserve.metrics.worker import DeviceSnapshot, WorkerMetrics
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.worker import executor
from evenserve.worker.repository import load_repository
from evenserve.worker.stats import ModelStats
from evenserve.worker.telemetry import Telemetry

from .fakes import make_driver, profile
from .test_model_control_cli import _repo

FAST = profile("a", {1: 10.0, 4: 16.0, 8: 20.0})


def _hosted(latency: Any) -> Any:
    """What telemetry reads of a hosted model: its profile and its statistics."""
    return SimpleNamespace(profile=latency, stats=ModelStats("a", "1"))


def _snapshot() -> DeviceSnapshot:
    return DeviceSnapshot(
        busy_ratio=0.0,
        busy_seconds_total=0.0,
        memory_used_bytes=None,
        memory_total_bytes=None,
        instances=1,
        cap_by_model={"a": 4},
    )


def _values(m: WorkerMetrics) -> dict[tuple[str, str], float]:
    """(sample name, model label) -> value of every per-model sample."""
    out = {}
    for fam in text_string_to_metric_families(m.render()[0].decode()):
        for s in fam.samples:
            if "model" in s.labels and "le" not in s.labels:
                out[(s.name, s.labels["model"])] = s.value
    return out


def test_the_counters_exist_at_zero_from_the_models_load() -> None:
    v = _values(WorkerMetrics("gpu0", ["a"], _snapshot))
    for n in (names.BATCH_HELD, names.BATCH_EXPECTED, names.COMPUTE_INPUT):
        assert v[(n + "_total", "a")] == 0.0
    assert v[(names.BATCH_CAP, "a")] == 4.0


async def test_a_static_batch_waiting_to_fill_counts_its_held_and_expected_seconds() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 4}}, {"a": FAST})
    metrics = WorkerMetrics("gpu0", ["a"], _snapshot)
    h.driver.observer = Telemetry(metrics, {"a": _hosted(FAST)})
    for i in range(3):
        h.driver.submit("a", i)
    h.timer.advance_to(0.010)
    h.driver.submit("a", 3)  # the fourth fills the batch: the instance sat idle 10 ms
    h.timer.run_until_idle()
    v = _values(metrics)
    assert v[(names.BATCH_HELD + "_total", "a")] == pytest.approx(0.010)
    assert v[(names.BATCH_EXPECTED + "_total", "a")] == pytest.approx(0.016)  # profile(4)
    assert v[(names.COMPUTE_INPUT + "_total", "a")] == 0.0  # nothing staged virtually
    assert v[(names.BATCHES + "_total", "a")] == 1.0


async def test_a_greedy_policy_on_a_busy_device_holds_nothing_and_no_profile_expects_nothing() -> (
    None
):
    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 0}},
        {"a": FAST},
    )
    metrics = WorkerMetrics("gpu0", ["a"], _snapshot)
    h.driver.observer = Telemetry(metrics, {"a": _hosted(None)})  # the model has no profile
    for i in range(6):
        h.driver.submit("a", i)
    h.timer.run_until_idle()
    v = _values(metrics)
    assert v[(names.BATCHES + "_total", "a")] == 3.0  # 1 at once, then 4, then 1
    assert v[(names.BATCH_HELD + "_total", "a")] == 0.0
    assert v[(names.BATCH_EXPECTED + "_total", "a")] == 0.0


def test_compute_input_seconds_add_up() -> None:
    m = WorkerMetrics("gpu0", ["a"], _snapshot)
    m.observe_compute("a", 0.030, 0.010)
    m.observe_compute("a", 0.020, 0.005)
    v = _values(m)
    assert v[(names.COMPUTE_INPUT + "_total", "a")] == pytest.approx(0.015)
    assert v[(names.COMPUTE_TIME + "_sum", "a")] == pytest.approx(0.050)


class _Counter:
    """A perf counter that only moves when told to."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _StagingRuntime:
    """Staging advances the fake counter 2 ms per item; running it 5 ms a batch."""

    def __init__(self, clock: _Counter) -> None:
        self.clock = clock
        self.staged: list[int] = []

    def stage(self, inputs: Mapping[str, Any]) -> None:
        n = int(inputs["x"].shape[0])
        self.staged.append(n)
        self.clock.t += 0.002 * n

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        self.clock.t += 0.005
        return {"y": inputs["x"]}


def test_run_batch_times_a_runtimes_staging_as_compute_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Counter()
    monkeypatch.setattr(executor.time, "perf_counter", clock)
    rt = _StagingRuntime(clock)
    payloads = [{"x": np.zeros((1, 4), dtype=np.float32)} for _ in range(3)]
    res = executor.run_batch(rt, ["x"], payloads)  # type: ignore[arg-type]
    assert rt.staged == [3]  # one assembled group of 3
    assert res.compute_input_s == pytest.approx(0.006)
    assert res.compute_infer_s == pytest.approx(0.005)


class _Sleeper:
    def __init__(self) -> None:
        self.asked: list[float] = []

    def sleep_until(self, end: float) -> None:
        self.asked.append(end)


def test_the_emulated_runtime_stages_per_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (entry,) = load_repository(_repo(tmp_path, ("a",)))
    rt = entry.create_runtime(parse_device("cpu"), cpu_threads=None, profiles_dir=None)
    assert isinstance(rt, EmulatedRuntime)
    sleeper = _Sleeper()
    rt._sleeper = sleeper  # type: ignore[assignment]
    monkeypatch.setattr("evenserve.runtime.emulated.time.perf_counter", lambda: 50.0)
    x = {"x": np.zeros((4, 4), dtype=np.float32)}
    rt.stage(x)
    assert sleeper.asked == []  # no staging asked for: none
    rt.staging_s_per_item = 0.003
    rt.stage(x)
    assert sleeper.asked == [pytest.approx(50.0 + 4 * 0.003)]
