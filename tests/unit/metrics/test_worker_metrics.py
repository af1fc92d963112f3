"""Metric names follow Prometheus conventions; live gauges and NVML figures are exported."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from evenserve.metrics import names
from evenserve.metrics.nvml import NvmlSampler
from evenserve.metrics.worker import DeviceSnapshot, WorkerMetrics


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
