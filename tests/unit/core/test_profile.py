from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.errors import ProfileError
from evenserve.core.profile import LatencyProfile, dump_profile, load_profile, load_profile_set

PROF = LatencyProfile.from_points(
    "m", {1: 1.0, 4: 2.0, 8: 4.0}, memory_mb={1: 10.0, 4: 40.0, 8: 80.0}, weights_mb=100.0
)


@pytest.mark.parametrize(
    ("batch", "ms"),
    [
        (1, 1.0),  # measured point
        (4, 2.0),
        (8, 4.0),
        (2, 1.0 + 1.0 / 3.0),  # linear between 1 and 4
        (6, 3.0),  # linear between 4 and 8
        (16, 8.0),  # extrapolated along the last segment
    ],
)
def test_latency_interpolation(batch: int, ms: float) -> None:
    assert PROF.latency_s(batch) == pytest.approx(ms / 1000.0)


def test_below_first_point_uses_first_point() -> None:
    p = LatencyProfile.from_points("m", {2: 3.0, 4: 5.0})
    assert p.latency_s(1) == pytest.approx(0.003)


def test_single_point_scales_per_item_beyond() -> None:
    p = LatencyProfile.from_points("m", {4: 8.0})
    assert p.latency_s(8) == pytest.approx(0.016)
    assert p.latency_s(2) == pytest.approx(0.008)


def test_memory_interpolation_and_weights() -> None:
    assert PROF.batch_memory_bytes(6) == pytest.approx(60.0 * 1024 * 1024)
    assert PROF.weights_bytes == pytest.approx(100.0 * 1024 * 1024)


def test_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    dump_profile(PROF, path, notes="roundtrip")
    back = load_profile(path)
    assert back.batches == PROF.batches
    assert back.latency_ms == PROF.latency_ms
    assert back.memory_mb == PROF.memory_mb


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[1, 2]", "expected a mapping"),
        ("model: x\n", "device"),
        (
            "model: x\ndevice: d\nruntime: r\nprecision: p\nsource: s\n"
            "points: [{batch: 0, latency_ms: 1}]\n",
            "points.0.batch",
        ),
        (
            "model: x\ndevice: d\nruntime: r\nprecision: p\nsource: s\n"
            "points: [{batch: 1, latency_ms: -1}]\n",
            "points.0.latency_ms",
        ),
        (
            "model: x\ndevice: d\nruntime: r\nprecision: p\nsource: s\n"
            "points: [{batch: 1, latency_ms: 1}, {batch: 1, latency_ms: 2}]\n",
            "unique",
        ),
        ("model: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert needle in str(err.value)
    assert str(path) in str(err.value)


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "nope.yaml")


def test_shipped_profile_sets_load_with_provenance(profiles_dir: Path) -> None:
    sets = [d for d in profiles_dir.iterdir() if d.is_dir()]
    assert sets, "no profile sets shipped"
    for d in sets:
        for prof in load_profile_set(d).values():
            assert prof.source and prof.device and prof.runtime and prof.precision
            # batch time grows with batch size in every shipped profile
            assert list(prof.latency_ms) == sorted(prof.latency_ms)


def test_published_a10_figures_are_exact(profiles_dir: Path) -> None:
    a10 = load_profile_set(profiles_dir / "a10-trt-fp16")
    assert a10["resnet50"].latency_s(8) == pytest.approx(0.00229)
    assert a10["bert-base"].latency_s(64) == pytest.approx(0.03101)
    assert a10["bert-base"].sequence_length == 128


def test_queue_parts_are_full_batches_then_the_partial_one() -> None:
    p = LatencyProfile.from_points("m", {1: 2.0, 4: 5.0, 8: 9.0})
    assert p.queue_parts_s(20, 8) == (2 * p.latency_s(8), p.latency_s(4))
    assert p.queue_parts_s(16, 8) == (2 * p.latency_s(8), 0.0)
    assert p.queue_parts_s(3, 8) == (0.0, p.latency_s(3))
    assert p.queue_parts_s(0, 8) == (0.0, 0.0)
    assert p.queue_parts_s(3, 0) == (3 * p.latency_s(1), 0.0)  # a cap below 1 counts as 1
    assert p.queue_parts_s(20, 8) is p.queue_parts_s(20, 8)  # cached


def test_a_profile_at_a_slices_speed() -> None:
    from evenserve.core.profile import LatencyProfile

    p = LatencyProfile.from_points("m", {1: 3.0, 8: 12.0}, memory_mb={1: 5.0, 8: 40.0})
    assert p.at_speed(1.0) is p
    q = p.at_speed(3 / 7)
    assert q.latency_s(1) == pytest.approx(0.007) and q.latency_s(8) == pytest.approx(0.028)
    assert q.batch_memory_bytes(8) == p.batch_memory_bytes(8)  # memory is the same
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="speed fraction"):
            p.at_speed(bad)
