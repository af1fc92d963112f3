"""The emulated runtime: outputs of the declared shapes, time and memory from its profile."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile, load_profile
from evenserve.core.scenario import COLD_LOAD_BYTES_PER_S, COLD_LOAD_FIXED_S
from evenserve.runtime import emulated
from evenserve.runtime.base import RuntimeContext, TensorSpec
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import EmulatedParams, EmulatedRuntime, resolve_profile

ROOT = Path(__file__).resolve().parents[3]


def _ctx(device: str = "cpu", model: str = "resnet50", model_dir: Path = ROOT) -> RuntimeContext:
    return RuntimeContext(
        model=model,
        model_dir=model_dir,
        device=parse_device(device),
        inputs=(TensorSpec("ids", "INT64", (-1,)),),
        outputs=(TensorSpec("logits", "FP32", (3,)), TensorSpec("hidden", "FP16", (-1, 2))),
    )


def test_outputs_follow_the_declared_shapes() -> None:
    rt = EmulatedRuntime(_ctx(), LatencyProfile.from_points("m", {1: 0.1}, weights_mb=2))
    assert rt.resident_bytes() == 0
    rt.load()
    out = rt.run({"ids": np.zeros((4, 7), dtype=np.int64)})
    assert out["logits"].shape == (4, 3) and out["logits"].dtype == np.float32
    assert out["hidden"].shape == (4, 7, 2) and out["hidden"].dtype == np.float16
    assert rt.resident_bytes() == 2 * 1024 * 1024
    assert rt.describe()["runtime"] == "emulated"


def test_fail_value_fails_the_batch_that_holds_it() -> None:
    prof = LatencyProfile.from_points("m", {1: 0.0001})
    rt = EmulatedRuntime(_ctx(), prof, fail_value=-7)
    rt.load()
    assert rt.run({"ids": np.ones((2, 3), dtype=np.int64)})["logits"].shape == (2, 3)
    with pytest.raises(emulated.EmulatedFailure, match="fail_value -7"):
        rt.run({"ids": np.array([[1, 2], [3, -7]], dtype=np.int64)})


class FakeHost:
    """The emulated runtime's view of the host clock (``time.perf_counter`` and
    ``time.sleep``), deterministic: every ``sleep`` ends ``overshoot_s`` late (the host's
    wake-up latency, plus ``stall_s`` once when set), and every clock read takes ``tick_s``
    (so a spin loop advances)."""

    def __init__(self, overshoot_s: float, tick_s: float = 1e-6) -> None:
        self.t = 1000.0
        self.overshoot_s = overshoot_s
        self.tick_s = tick_s
        self.stall_s = 0.0
        self.slept_s = 0.0  # what the runtime asked to sleep, in all

    def perf_counter(self) -> float:
        self.t += self.tick_s
        return self.t

    def sleep(self, duration_s: float) -> None:
        assert duration_s > 0
        self.slept_s += duration_s
        self.t += duration_s + self.overshoot_s + self.stall_s
        self.stall_s = 0.0


def _run_on(host: FakeHost, rt: EmulatedRuntime, batch: int) -> tuple[float, float]:
    """(seconds the batch took on the host clock, seconds of it spent in time.sleep)."""
    t0, slept0 = host.t, host.slept_s
    rt.run({"ids": np.zeros((batch, 8), dtype=np.int64)})
    return host.t - t0, host.slept_s - slept0


@pytest.mark.parametrize("profile_name", ["a10-trt-fp16/resnet50", "t4-framework-fp32/bert-base"])
@pytest.mark.parametrize("overshoot_us", [0.0, 80.0, 300.0, 1500.0])
def test_batch_takes_the_profile_time_whatever_the_hosts_sleep_overshoot(
    monkeypatch: pytest.MonkeyPatch, profile_name: str, overshoot_us: float
) -> None:
    """The sleeper's decision, on a fake host clock: each batch ends at entry + the profile's
    time for its size, never before; once the overshoot is learned, within a few clock reads
    after; and the busy-wait at the end stays near the learned overshoot + the 50 us margin.
    (How accurate this is on a real host is a measurement: bench/emulated_timing.py.)"""
    host = FakeHost(overshoot_us * 1e-6)
    monkeypatch.setattr(emulated, "time", host)
    prof = load_profile(ROOT / "profiles" / f"{profile_name}.yaml")
    rt = EmulatedRuntime(_ctx(), prof)
    rt.load()
    # Learn the host's overshoot (an exponentially weighted mean of the sleeps it sees) on
    # the longest batch: a batch shorter than the overshoot is all spin and teaches nothing.
    longest = prof.batches[-1]
    for _ in range(60):
        took, _ = _run_on(host, rt, longest)
        assert took >= prof.latency_s(longest)
    for batch in prof.batches:
        want = prof.latency_s(batch)
        took, slept = _run_on(host, rt, batch)
        assert want <= took <= want + 5e-6, (batch, took, want)
        if want > 2 * overshoot_us * 1e-6 + 1e-3:  # long enough to sleep most of it
            spun = took - slept - host.overshoot_s
            assert spun <= overshoot_us * 1e-6 * 0.05 + emulated.SPIN_MARGIN_S + 5e-6, spun


def test_one_late_wake_up_does_not_shorten_later_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(100e-6)
    monkeypatch.setattr(emulated, "time", host)
    prof = LatencyProfile.from_points("m", {1: 5.0})
    rt = EmulatedRuntime(_ctx(), prof)
    for _ in range(40):
        _run_on(host, rt, 1)
    host.stall_s = 0.050  # one sleep ends 50 ms late (a busy host)
    late, _ = _run_on(host, rt, 1)
    assert late >= 0.005 + 0.045
    # Later batches still take their profile time: never shorter, and back within a few
    # clock reads once the one outlier (capped at 2 ms in the learned figure) has decayed.
    took = [_run_on(host, rt, 1)[0] for _ in range(60)]
    assert min(took) >= 0.005
    assert took[-1] <= 0.005 + 5e-6


def test_profile_resolution(tmp_path: Path) -> None:
    emu = _ctx("emulated:a10-trt-fp16", "bert-base")
    prof = resolve_profile(emu, None, ROOT / "profiles")
    assert prof.model == "bert-base" and prof.runtime == "tensorrt"
    by_path = _ctx(f"emulated:{ROOT / 'profiles' / 't4-framework-fp32'}", "bert-base")
    assert resolve_profile(by_path, None, None).runtime.startswith("tensorflow")
    renamed = resolve_profile(emu, EmulatedParams(profile_name="resnet50"), ROOT / "profiles")
    assert renamed.model == "resnet50"
    with pytest.raises(ConfigError, match=r"emulated\.profile_name: no profile 'gpt'"):
        resolve_profile(_ctx("emulated:a10-trt-fp16", "gpt"), None, ROOT / "profiles")
    with pytest.raises(ConfigError, match="profile set not found"):
        resolve_profile(_ctx("emulated:nowhere", "m"), None, ROOT / "profiles")
    with pytest.raises(ConfigError, match=r"emulated\.profile: required on device cpu"):
        resolve_profile(_ctx("cpu"), None, None)
    rel = EmulatedParams(profile="profiles/a10-trt-fp16/resnet50.yaml")
    assert resolve_profile(_ctx("cpu"), rel, None).model == "resnet50"


def test_batches_sharing_an_emulated_device_slow_each_other() -> None:
    """Two batches at once on one EmulatedDevice take longer than alone (core.contention).

    Only lower bounds are checked (a sleep never ends early; a busy host only adds). Two
    small batches run together at 0.75 speed each, so the device does at most 1.5 batch-
    seconds of work per second: from the first start to the last end takes at least
    2 x solo / 1.5, whatever the skew between the two threads' starts. Without the shared
    device it would take about one solo time."""
    import threading

    from evenserve.runtime.emulated import EmulatedDevice

    prof = LatencyProfile.from_points("m", {1: 40.0, 64: 640.0})  # batch 1: 0.1 of the peak
    dev = EmulatedDevice()
    rts = [EmulatedRuntime(_ctx(), prof, dev) for _ in range(2)]
    marks: list[tuple[float, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2)

    def one(rt: EmulatedRuntime) -> None:
        barrier.wait()
        start = time.perf_counter()
        rt.run({"ids": np.zeros((1, 2), dtype=np.int64)})
        with lock:
            marks.append((start, time.perf_counter()))

    threads = [threading.Thread(target=one, args=(rt,)) for rt in rts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(marks) == 2
    elapsed = max(e for _, e in marks) - min(s for s, _ in marks)
    assert elapsed >= 2 * 0.040 / 1.5
    # Alone on the device, the same batch takes its profile time again.
    start = time.perf_counter()
    rts[0].run({"ids": np.zeros((1, 2), dtype=np.int64)})
    assert time.perf_counter() - start >= 0.040


def test_a_load_sleeps_its_load_time_and_only_then_holds_its_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    resident_while_sleeping: list[float] = []
    prof = LatencyProfile.from_points("m", {1: 0.1}, weights_mb=1000)

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        resident_while_sleeping.append(rt.resident_bytes())

    monkeypatch.setattr(emulated, "load_sleep", sleep)
    rt = EmulatedRuntime(_ctx(), prof)
    rt.load()
    derived = COLD_LOAD_FIXED_S + 1000 * 1024 * 1024 / COLD_LOAD_BYTES_PER_S
    assert slept == [derived] and resident_while_sleeping == [0.0]
    assert rt.resident_bytes() == prof.weights_bytes
    assert rt.describe()["load_ms"] == round(derived * 1000, 3)
    rt.close()
    EmulatedRuntime(_ctx(), prof, load_ms=0).load()  # load_ms given: it, not the weights
    assert slept == [derived, 0.0]


def test_load_ms_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="load_ms"):
        EmulatedParams(load_ms=-1)
