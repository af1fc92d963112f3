"""MIG profiles and time-sliced shares: parsing, speed and memory (core.slices)."""

from __future__ import annotations

import pytest

from evenserve.core.slices import DeviceSlice, MigProfile, Share, parse_slice

GIB = 1024.0**3


def test_mig_profile() -> None:
    s = parse_slice("mig=3g.20gb")
    assert s == DeviceSlice(mig=MigProfile(3, 20))
    assert s.text == "mig=3g.20gb" and s.label == "mig-3g.20gb"
    assert s.compute_fraction == pytest.approx(3 / 7)
    assert s.memory_bytes(80 * GIB) == 20 * GIB  # its own memory, not the GPU's
    media = parse_slice("mig=1g.10gb+me")
    assert media.mig is not None and media.mig.media and media.text == "mig=1g.10gb+me"


def test_share() -> None:
    s = parse_slice("share=1/2")
    assert s == DeviceSlice(share=Share(1, 2))
    assert s.text == "share=1/2" and s.label == "share-1of2"
    assert s.compute_fraction == 1.0  # time slicing: full speed while it runs
    assert s.memory_bytes(24 * GIB) == 12 * GIB
    assert parse_slice("share=3/4").memory_bytes(8.0) == 6.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("mig", "expected mig="),
        ("mig=8g.20gb", "mig='8g.20gb'"),
        ("mig=3g", "mig='3g'"),
        ("mig=3g.0gb", "at least 1 GiB"),
        ("share=0/2", "share='0/2'"),
        ("share=3/2", "1 <= K <= M"),
        ("share=1:2", "expected K/M"),
        ("slice=1/2", "'slice'"),
    ],
)
def test_bad_slices_name_the_bad_part(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as ei:
        parse_slice(text)
    assert needle in str(ei.value)
