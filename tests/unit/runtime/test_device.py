from __future__ import annotations

import pytest

from evenserve.core.errors import ConfigError
from evenserve.runtime.device import DeviceTarget, host_memory_bytes, parse_device


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


def test_host_memory() -> None:
    used, total = host_memory_bytes()
    assert 0 < used < total
