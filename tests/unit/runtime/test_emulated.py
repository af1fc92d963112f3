"""The emulated runtime: outputs of the declared shapes, time and memory from its profile."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.profile import LatencyProfile, load_profile
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


@pytest.mark.parametrize("profile_name", ["a10-trt-fp16/resnet50", "t4-framework-fp32/bert-base"])
def test_batch_time_matches_the_profile_at_p50(profile_name: str) -> None:
    prof = load_profile(ROOT / "profiles" / f"{profile_name}.yaml")
    rt = EmulatedRuntime(_ctx(), prof)
    rt.load()
    for batch in prof.batches:
        inputs = {"ids": np.zeros((batch, 8), dtype=np.int64)}
        took = []
        for _ in range(15 if prof.latency_s(batch) < 0.02 else 5):
            t0 = time.perf_counter()
            rt.run(inputs)
            took.append(time.perf_counter() - t0)
        p50 = statistics.median(took)
        # A ratio measured in one run, not a wall-clock assertion: P50 within 5 %.
        assert p50 / prof.latency_s(batch) == pytest.approx(1.0, rel=0.05), (batch, p50)


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
