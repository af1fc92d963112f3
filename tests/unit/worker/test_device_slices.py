"""A worker on a MIG slice or a time-sliced share: its memory cap, speed and device labels in
the load report (emulated), and a real slice's or share's memory (fake NVML, fake torch
figures: no GPU needed)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from evenserve.core.options import DeviceOptions
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.worker import device as device_module
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository

TINY = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny"
GIB = 1024.0**3
MIG = "MIG-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"


def _worker(device: str, profiles_dir: Path | None = None, memory_gb: float = 8) -> Worker:
    return Worker(
        load_repository(TINY, ["tiny-emulated"]),
        WorkerOptions(
            device=parse_device(device),
            run=DeviceOptions(memory_gb=memory_gb),
            profiles_dir=profiles_dir,
        ),
    )


def _profile_set(tmp_path: Path) -> Path:
    """A profile set ``toy`` holding tiny-emulated's profile."""
    d = tmp_path / "toy"
    d.mkdir()
    shutil.copy(TINY / "tiny-emulated" / "profile.yaml", d / "tiny-emulated.yaml")
    return tmp_path


@pytest.mark.parametrize(
    ("device", "total_gib", "kind_slice"),
    [
        ("emulated:toy", 8, None),
        ("emulated:toy#share=1/2", 4, "share-1of2"),
        ("emulated:toy#share=3/4", 6, "share-3of4"),
        ("emulated:toy#mig=3g.20gb", 20, "mig-3g.20gb"),
    ],
)
async def test_emulated_slices_report_their_own_memory_cap(
    tmp_path: Path, device: str, total_gib: float, kind_slice: str | None
) -> None:
    w = _worker(device, _profile_set(tmp_path))
    w.load()
    await w.start()
    try:
        report = w.plane.load_report()
        assert report.memory_total_bytes == total_gib * GIB
        assert report.device == device
        assert report.device_kind == "emulated" and report.device_slice == kind_slice
        # the scheduler's memory account has the same cap
        assert w.driver.sched.memory.used_total()[1] == total_gib * GIB
        page = w.metrics.render()[0].decode()
        assert f'slice="{kind_slice or ""}"' in page
        assert f'evenserve_worker_device_memory_total_bytes{{device="{device}"}}' in page
    finally:
        await w.stop()


def test_an_emulated_mig_slice_runs_at_its_compute_fraction(tmp_path: Path) -> None:
    base = _profile_set(tmp_path)
    whole = _worker("emulated:toy", base)
    mig = _worker("emulated:toy#mig=3g.20gb", base)
    share = _worker("emulated:toy#share=1/2", base)
    for n in (1, 8):
        full = whole.models["tiny-emulated"].profile
        assert full is not None
        t = full.latency_s(n)
        sliced = mig.models["tiny-emulated"].profile
        assert sliced is not None and sliced.latency_s(n) == pytest.approx(t * 7 / 3)
        rt = mig.models["tiny-emulated"].runtime
        assert isinstance(rt, EmulatedRuntime)
        assert rt.profile.latency_s(n) == pytest.approx(t * 7 / 3)  # what it sleeps
        shared = share.models["tiny-emulated"].profile
        assert shared is not None and shared.latency_s(n) == pytest.approx(t)  # full speed


class _FakeMigNvml:
    """pynvml with one MIG slice of 20 GiB on an 80 GiB GPU."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def nvmlInit(self) -> None:
        return None

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.asked.append(f"uuid:{uuid}")
        return "mig"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self.asked.append(f"index:{i}")
        return "gpu"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        self.asked.append(f"memory:{h}")
        gib = 2**30
        if h == "mig":
            return SimpleNamespace(used=5 * gib, total=20 * gib, free=15 * gib)
        return SimpleNamespace(used=50 * gib, total=80 * gib, free=30 * gib)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        self.asked.append(f"utilization:{h}")
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlShutdown(self) -> None:
        return None


def test_a_mig_worker_reads_the_slices_memory_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeMigNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    def no_torch(index: int) -> tuple[float, float]:
        raise AssertionError("a MIG slice's memory must come from NVML, not torch")

    monkeypatch.setattr(device_module, "cuda_memory_bytes", no_torch)
    w = _worker(f"cuda:{MIG}")
    assert w.device.nvml is not None and w.device.nvml.mig_uuid == MIG
    assert w.device.memory_bytes() == (5 * GIB, 20 * GIB)  # the slice's, not the GPU's 80 GiB
    assert fake.asked == [f"uuid:{MIG}", "memory:mig"]
    page = w.metrics.render()[0].decode()
    assert f'evenserve_gpu_memory_total_bytes{{gpu="{MIG}"}} 2.147483648e+10' in page
    assert "evenserve_gpu_sm_utilization_ratio" not in page
    assert not any(a.startswith(("utilization", "index")) for a in fake.asked)
    # the worker's own busy time is the slice's utilization
    assert "evenserve_worker_device_busy_ratio" in page


def test_a_share_worker_counts_its_own_memory_against_its_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    seen: list[int] = []

    def gpu(index: int) -> tuple[float, float]:
        seen.append(index)
        return 20 * GIB, 24 * GIB  # every process on the GPU

    monkeypatch.setattr(device_module, "cuda_memory_bytes", gpu)
    monkeypatch.setattr(device_module, "cuda_process_memory_bytes", lambda index: 3 * GIB)
    w = _worker("cuda:1#share=1/2")
    assert w.device.memory_bytes() == (3 * GIB, 12 * GIB)
    assert seen == [1]
    whole = _worker("cuda:1")
    assert whole.device.memory_bytes() == (20 * GIB, 24 * GIB)
