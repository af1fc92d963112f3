"""Metric names follow Prometheus conventions; live gauges and NVML figures are exported."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from evenserve.metrics import names
from evenserve.metrics.nvml import GpuIdentity, NvmlSampler
from evenserve.metrics.worker import DcgmLabels, DeviceSnapshot, WorkerMetrics
from evenserve.runtime.device import parse_device
from evenserve.worker.device import dcgm_labels


def test_names_carry_units_and_prefixes() -> None:
    all_names = [v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)]
    metric_names = [n for n in all_names if n.startswith("evenserve_")]
    assert len(metric_names) == len(set(metric_names))
    for n in metric_names:
        assert n == n.lower()
        if "time" in n or "latency" in n:
            assert n.endswith("_seconds"), n
        if "memory" in n:
            assert n.endswith("_bytes"), n
    assert names.REQUESTS + "_total" not in metric_names  # the client adds _total itself


def _snapshot() -> DeviceSnapshot:
    return DeviceSnapshot(
        busy_ratio=0.25,
        busy_seconds_total=12.5,
        memory_used_bytes=1e9,
        memory_total_bytes=24e9,
        instances=2,
        queued_by_model={"m": 3},
        in_flight_by_model={"m": 4},
    )


def test_render_exports_histograms_counters_and_live_gauges() -> None:
    m = WorkerMetrics("cuda:0", ["m"], _snapshot)
    m.observe_batch("m", 4, [0.001, 0.002, 0.003, 0.004])
    m.observe_compute("m", 0.010)
    m.observe_request("m", "success", 0.02)
    m.observe_request("m", "rejected_queue_full", None)
    text, content_type = m.render()
    page = text.decode()
    assert content_type.startswith("text/plain")
    assert 'evenserve_worker_batch_size_bucket{le="4.0",model="m"} 1.0' in page
    assert 'evenserve_worker_queue_time_seconds_count{model="m"} 4.0' in page
    assert 'evenserve_worker_requests_total{model="m",outcome="success"} 1.0' in page
    assert 'evenserve_worker_requests_total{model="m",outcome="rejected_queue_full"} 1.0' in page
    assert 'evenserve_worker_requests_total{model="m",outcome="error"} 0.0' in page
    assert 'evenserve_worker_queue_depth{model="m"} 3.0' in page
    assert 'evenserve_worker_in_flight{model="m"} 4.0' in page
    assert 'evenserve_worker_device_busy_ratio{device="cuda:0"} 0.25' in page
    assert 'evenserve_worker_device_busy_seconds_total{device="cuda:0"} 12.5' in page
    assert 'evenserve_worker_device_memory_total_bytes{device="cuda:0"} 2.4e+10' in page
    assert "evenserve_gpu_" not in page  # no NVML here


class _FakeNvml:
    """The few pynvml calls the sampler makes, with fixed figures."""

    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self) -> None:
        self.shut = False

    def nvmlInit(self) -> None:
        return None

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=3 * 2**30, total=24 * 2**30, free=21 * 2**30)

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 1000 if counter == 0 else 2000

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_nvml_figures_beside_the_workers_own() -> None:
    fake = _FakeNvml()
    sampler = NvmlSampler.open(0, module=fake)  # type: ignore[arg-type]
    assert sampler is not None
    m = WorkerMetrics("cuda:0", ["m"], _snapshot, sampler)
    page = m.render()[0].decode()
    assert 'evenserve_gpu_sm_utilization_ratio{gpu="0"} 0.87' in page
    assert 'evenserve_gpu_memory_used_bytes{gpu="0"} 3.221225472e+09' in page
    assert 'evenserve_gpu_pcie_tx_bytes_per_second{gpu="0"} 1.024e+06' in page
    assert 'evenserve_gpu_pcie_rx_bytes_per_second{gpu="0"} 2.048e+06' in page
    assert 'evenserve_worker_device_busy_ratio{device="cuda:0"} 0.25' in page
    sampler.close()
    assert fake.shut


def test_nvml_absent_means_no_sampler() -> None:
    assert NvmlSampler.open(0) is None  # pynvml is not installed here (or no GPU answers)


class _FakeMigNvml(_FakeNvml):
    """pynvml with one GPU (80 GiB) holding one MIG slice (20 GiB); utilization and PCIe
    throughput raise for the slice, as NVML's do for a MIG handle."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.asked.append(f"uuid:{uuid}")
        if uuid != MIG:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return "mig-handle"

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self.asked.append(f"index:{i}")
        return super().nvmlDeviceGetHandleByIndex(i)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        self.asked.append(f"memory:{h}")
        if h == "mig-handle":
            return SimpleNamespace(used=2 * 2**30, total=20 * 2**30, free=18 * 2**30)
        return SimpleNamespace(used=30 * 2**30, total=80 * 2**30, free=50 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        self.asked.append(f"utilization:{h}")
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        self.asked.append(f"pcie:{h}")
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


MIG = "MIG-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"


def test_a_mig_slice_is_sampled_by_uuid_with_its_own_memory() -> None:
    fake = _FakeMigNvml()
    sampler = NvmlSampler.open_mig(MIG, module=fake)  # type: ignore[arg-type]
    assert sampler is not None and sampler.label == MIG
    s = sampler.sample()
    assert s is not None
    # the slice's memory (20 GiB), never the parent GPU's (80 GiB); no utilization read
    assert (s.memory_used_bytes, s.memory_total_bytes) == (2 * 2**30, 20 * 2**30)
    assert s.sm_utilization_ratio is None and s.pcie_tx_bytes_per_second is None
    assert fake.asked == [f"uuid:{MIG}", "memory:mig-handle"]
    m = WorkerMetrics(
        f"cuda:{MIG}", ["m"], _snapshot, sampler, kind="cuda", slice_label="mig-4f2d8c1e"
    )
    page = m.render()[0].decode()
    assert f'evenserve_gpu_memory_total_bytes{{gpu="{MIG}"}} 2.147483648e+10' in page
    assert "evenserve_gpu_sm_utilization_ratio" not in page
    assert "evenserve_gpu_pcie" not in page
    assert (
        f'evenserve_worker_device_info{{UUID="",device="cuda:{MIG}",gpu="",kind="cuda",'
        'modelName="",slice="mig-4f2d8c1e"} 1.0' in page
    )
    assert not any(a.startswith(("utilization", "pcie", "index")) for a in fake.asked)


def test_an_unknown_mig_uuid_means_no_sampler() -> None:
    fake = _FakeMigNvml()
    other = "MIG-00000000-0000-0000-0000-000000000000"
    assert NvmlSampler.open_mig(other, module=fake) is None  # type: ignore[arg-type]


GPU_UUID = "GPU-0c6a3f1e-1b2c-4d5e-8f90-0123456789ab"


class _FakeNamedNvml(_FakeMigNvml):
    """NVML that names its GPUs: GPU 3 (an A100, which holds the MIG slice), its name in
    bytes as older pynvml returns it."""

    def nvmlDeviceGetIndex(self, h: str) -> int:
        return 3

    def nvmlDeviceGetUUID(self, h: str) -> str:
        assert h in ("gpu0", "gpu3"), h
        return GPU_UUID

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: str) -> str:
        assert h == "mig-handle"
        return "gpu3"


def test_identity_is_what_dcgm_exporter_labels_a_gpu_with() -> None:
    fake = _FakeNamedNvml()
    whole = NvmlSampler.open(0, module=fake)  # type: ignore[arg-type]
    mig = NvmlSampler.open_mig(MIG, module=fake)  # type: ignore[arg-type]
    assert whole is not None and mig is not None
    # NVML's own index wins over the one asked for; a slice is named by its parent GPU
    assert whole.identity() == GpuIdentity(3, GPU_UUID, "NVIDIA A100-SXM4-80GB")
    assert mig.identity() == GpuIdentity(3, GPU_UUID, "NVIDIA A100-SXM4-80GB")
    # an NVML that names nothing: the index asked for, nothing else; a slice gets nothing
    plain = NvmlSampler.open(1, module=_FakeNvml())  # type: ignore[arg-type]
    assert plain is not None and plain.identity() == GpuIdentity(1, None, None)
    bare_mig = NvmlSampler.open_mig(MIG, module=_FakeMigNvml())  # type: ignore[arg-type]
    assert bare_mig is not None and bare_mig.identity() == GpuIdentity(None, None, None)


def test_the_device_info_carriesdcgm_labels() -> None:
    fake = _FakeNamedNvml()
    sampler = NvmlSampler.open(0, module=fake)  # type: ignore[arg-type]
    cuda = parse_device("cuda:0")
    m = WorkerMetrics(
        "cuda:0", ["m"], _snapshot, sampler, kind="cuda", dcgm=dcgm_labels(cuda, sampler)
    )
    page = m.render()[0].decode()
    assert (
        f'evenserve_worker_device_info{{UUID="{GPU_UUID}",device="cuda:0",gpu="3",kind="cuda",'
        'modelName="NVIDIA A100-SXM4-80GB",slice=""} 1.0' in page
    )
    assert names.DCGM_LABELS == ("gpu", "UUID", "modelName")


def test_dcgm_labels_without_nvml() -> None:
    assert dcgm_labels(parse_device("cuda:2"), None) == DcgmLabels(gpu="2")
    assert dcgm_labels(parse_device(f"cuda:{MIG}"), None) == DcgmLabels()
    assert dcgm_labels(parse_device("cpu"), None) == DcgmLabels(model_name="cpu")
    em = parse_device("emulated:a10-trt-fp16#mig=3g.20gb")
    assert dcgm_labels(em, None) == DcgmLabels(model_name="emulated:a10-trt-fp16#mig=3g.20gb")
