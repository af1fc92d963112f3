"""The shared-device model: speeds, occupancies and end times of concurrent batches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.core.contention import (
    DEFAULT_INTERFERENCE,
    SharedDevice,
    occupancy,
    shared_speed,
)
from evenserve.core.profile import LatencyProfile

# T4, PyTorch ResNet-50 fp32 (profiles/t4-framework-fp32): ms per batch.
T4_RESNET = LatencyProfile.from_points(
    "resnet50", {1: 10.7, 2: 11.26, 4: 12.73, 8: 22.41, 16: 39.77, 32: 77.62, 64: 152.73}
)


def test_occupancy_is_throughput_over_peak() -> None:
    peak = 64 / 152.73
    assert occupancy(T4_RESNET, 1) == pytest.approx((1 / 10.7) / peak)
    assert occupancy(T4_RESNET, 8) == pytest.approx((8 / 22.41) / peak)
    assert occupancy(T4_RESNET, 64) == pytest.approx(1.0)
    assert 0.2 < occupancy(T4_RESNET, 1) < 0.25


@pytest.mark.parametrize(
    ("occ", "interference", "speed"),
    [
        ([0.5], DEFAULT_INTERFERENCE, 1.0),  # alone: the profile's time
        ([0.2, 0.2], DEFAULT_INTERFERENCE, 0.75),  # two small batches: 1.5x together
        ([0.2, 0.2, 0.2], DEFAULT_INTERFERENCE, 0.6),
        ([0.85, 0.85], DEFAULT_INTERFERENCE, 1 / 1.7),  # two big ones: never above the peak
        ([0.3, 0.3], 0.0, 1.0),  # perfect overlap while under the peak
        ([0.3, 0.3], 1.0, 0.5),  # pure time slicing
    ],
)
def test_shared_speed(occ: list[float], interference: float, speed: float) -> None:
    assert shared_speed(occ, interference) == pytest.approx(speed)


@given(
    batches=st.lists(st.sampled_from(T4_RESNET.batches), min_size=1, max_size=6),
    interference=st.floats(0, 1),
)
def test_concurrent_batches_never_beat_the_peak(batches: list[int], interference: float) -> None:
    peak = max(b / T4_RESNET.latency_s(b) for b in T4_RESNET.batches)
    v = shared_speed([occupancy(T4_RESNET, b) for b in batches], interference)
    throughput = sum(b / T4_RESNET.latency_s(b) * v for b in batches)
    assert throughput <= peak * (1 + 1e-9)
    assert 0 < v <= 1


def test_shared_device_timeline() -> None:
    dev = SharedDevice(DEFAULT_INTERFERENCE)
    dev.start("a", 0.0, 0.010, 0.2)
    assert dev.end_of("a") == pytest.approx(0.010)  # alone: exactly its solo time
    dev.start("b", 0.004, 0.010, 0.2)  # both run at 0.75 from t=4 ms
    assert dev.speed == pytest.approx(0.75)
    assert dev.end_of("a") == pytest.approx(0.004 + 0.006 / 0.75)
    nxt = dev.next_end()
    assert nxt is not None and nxt[0] == "a"
    t_a = nxt[1]
    dev.finish("a", t_a)
    # b did 0.75 x (t_a - 4 ms) of its work; the rest goes at full speed
    done_b = 0.75 * (t_a - 0.004)
    assert dev.end_of("b") == pytest.approx(t_a + 0.010 - done_b)
    dev.finish("b", dev.end_of("b"))
    assert len(dev) == 0 and dev.next_end() is None


def test_shared_device_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="interference"):
        SharedDevice(1.5)
    dev = SharedDevice()
    dev.start(1, 0.0, 1.0, 0.5)
    with pytest.raises(KeyError):
        dev.start(1, 0.0, 1.0, 0.5)
