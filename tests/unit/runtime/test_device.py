from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.slices import DeviceSlice, MigProfile, Share
from evenserve.runtime.device import (
    DeviceTarget,
    host_memory_bytes,
    parse_device,
    select_visible_device,
)

MIG = "MIG-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"
LEGACY = "MIG-GPU-6f1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8/3/0"


def test_parse_device() -> None:
    assert parse_device("cpu") == DeviceTarget("cpu")
    assert parse_device("cuda:3") == DeviceTarget("cuda", index=3)
    assert parse_device("cuda:3").torch_device == "cuda:3"
    emu = parse_device("emulated:a10-trt-fp16")
    assert emu.profile_set == "a10-trt-fp16" and emu.name == "emulated:a10-trt-fp16"
    assert emu.torch_device == "cpu"
    for bad in ("gpu", "cuda", "cuda:x", "emulated:", "CPU0"):
        with pytest.raises(ConfigError, match="--device"):
            parse_device(bad)


def test_parse_mig_slices() -> None:
    d = parse_device(f"cuda:{MIG}")
    assert d == DeviceTarget("cuda", mig_uuid=MIG)
    assert d.name == f"cuda:{MIG}" and parse_device(d.name) == d
    assert d.torch_device == "cuda:0" and d.cuda_index == 0  # its worker sees only it
    assert d.slice_label == "mig-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"
    assert d.visible_devices() == MIG
    legacy = parse_device(f"cuda:{LEGACY}")
    assert legacy.mig_uuid == LEGACY and legacy.torch_device == "cuda:0"


def test_parse_shares_and_emulated_slices() -> None:
    share = parse_device("cuda:1#share=1/2")
    assert share == DeviceTarget("cuda", index=1, slice=DeviceSlice(share=Share(1, 2)))
    assert share.name == "cuda:1#share=1/2" and share.torch_device == "cuda:1"
    assert share.slice_label == "share-1of2" and share.visible_devices() is None
    assert share.memory_cap_bytes(24.0) == 12.0 and share.compute_fraction == 1.0
    mig = parse_device("emulated:a10-trt-fp16#mig=3g.20gb")
    assert mig.kind == "emulated" and mig.profile_set == "a10-trt-fp16"
    assert mig.slice == DeviceSlice(mig=MigProfile(3, 20))
    assert mig.name == "emulated:a10-trt-fp16#mig=3g.20gb" and parse_device(mig.name) == mig
    assert mig.compute_fraction == pytest.approx(3 / 7)
    assert mig.memory_cap_bytes(80 * 2.0**30) == 20 * 2.0**30
    assert mig.slice_label == "mig-3g.20gb"
    half = parse_device("emulated:toy#share=1/2")
    assert half.memory_cap_bytes(8.0) == 4.0 and half.slice_label == "share-1of2"
    assert parse_device("cpu").slice_label is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("cpu#share=1/2", "cpu has no slices"),
        ("cuda:0#mig=3g.20gb", "named by its UUID"),
        ("cuda:MIG-1234", "'MIG-1234' is not a MIG device UUID"),
        (f"cuda:{MIG}#share=1/2", "cannot be shared"),
        ("cuda:gpu0", "'gpu0' after cuda:"),
        ("cuda:0#share=2/1", "share='2/1'"),
        ("emulated:toy#mig=9g.20gb", "mig='9g.20gb'"),
        ("emulated:toy#half", "expected mig="),
        ("emulated:toy#speed=1/2", "'speed'"),
        ("emulated:#share=1/2", "needs a PROFILE_SET"),
        ("tpu:0", "'tpu:0' is not a device kind"),
    ],
)
def test_bad_devices_name_the_bad_part(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_device(text)
    msg = str(ei.value)
    assert msg.startswith("--device") and needle in msg, msg


def test_a_mig_worker_selects_its_slice_before_cuda_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "0,1"}
    # torch imported but CUDA not initialised: still in time (and nothing initialises it)
    calls: list[str] = []
    fake_torch = SimpleNamespace(
        cuda=SimpleNamespace(is_initialized=lambda: calls.append("asked") or False)
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert select_visible_device(parse_device(f"cuda:{MIG}"), env)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG and calls == ["asked"]
    # other devices leave it alone
    other: dict[str, str] = {}
    assert not select_visible_device(parse_device("cuda:1#share=1/2"), other)
    assert not select_visible_device(parse_device("emulated:toy#mig=3g.20gb"), other)
    assert other == {}


def test_too_late_to_select_a_mig_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(ConfigError, match="already initialised"):
        select_visible_device(parse_device(f"cuda:{MIG}"), {})
    # already set to the slice: nothing to change, no error
    env = {"CUDA_VISIBLE_DEVICES": MIG}
    assert select_visible_device(parse_device(f"cuda:{MIG}"), env)


def test_host_memory() -> None:
    used, total = host_memory_bytes()
    assert 0 < used < total
