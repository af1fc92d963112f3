"""The Triton mapping on Triton's real /metrics text (fixtures: see tests/fixtures/triton)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.cluster.backend_spec import BackendSignals
from evenserve.cluster.prometheus_mapping import PrometheusMapping
from evenserve.gateway.prometheus_signals import (
    PrometheusParseError,
    parse_samples,
    sample_from_text,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "triton"


def triton() -> PrometheusMapping:
    m = BackendSignals.model_validate({"source": "prometheus", "mapping": "triton"}).mapping
    assert m is not None
    return m


def test_triton_gpu_server_text() -> None:
    text = (FIXTURES / "metrics_kura_gpu.txt").read_text()
    s = sample_from_text(text, triton(), received_at_s=12.5)
    assert s is not None
    assert s.timestamp_s == 12.5
    assert s.queue_depth == 0.0
    assert s.queued_by_model == {"identity_long": 0.0, "preprocessor": 0.0}
    assert s.utilization == 0.0
    assert s.memory_used_bytes == pytest.approx(617611264.0)
    assert s.memory_total_bytes == pytest.approx(16101933056.0)
    assert s.memory_free_bytes == pytest.approx(16101933056.0 - 617611264.0)


def test_triton_cpu_server_text_has_queue_but_unknown_gpu() -> None:
    text = (FIXTURES / "metrics_openshift_cpu.txt").read_text()
    s = sample_from_text(text, triton(), received_at_s=1.0)
    assert s is not None
    assert s.queue_depth == 0.0
    assert set(s.queued_by_model) == {"densenet_onnx", "cc_fraud_detect_model"}
    # No nv_gpu_* on a CPU-only Triton: unknown, never "idle".
    assert s.utilization is None
    assert s.memory_used_bytes is None and s.memory_free_bytes is None


def test_pending_counts_sum_and_split_by_model() -> None:
    text = (FIXTURES / "metrics_openshift_cpu.txt").read_text()
    text = text.replace(
        'nv_inference_pending_request_count{model="densenet_onnx",version="1"} 0',
        'nv_inference_pending_request_count{model="densenet_onnx",version="1"} 4',
    ).replace(
        'nv_inference_pending_request_count{model="cc_fraud_detect_model",version="1"} 0',
        'nv_inference_pending_request_count{model="cc_fraud_detect_model",version="1"} 2',
    )
    s = sample_from_text(text, triton(), received_at_s=0.0)
    assert s is not None
    assert s.queue_depth == 6.0
    assert s.queued_by_model == {"densenet_onnx": 4.0, "cc_fraud_detect_model": 2.0}


def test_custom_mapping_with_label_filter_and_scale() -> None:
    text = (FIXTURES / "metrics_openshift_cpu.txt").read_text()
    mapping = PrometheusMapping.model_validate(
        {
            "queue_depth": {
                "metric": "nv_inference_pending_request_count",
                "labels": {"model": "densenet_onnx"},
            },
            "utilization": {"metric": "nv_cpu_utilization", "aggregate": "max"},
            "memory_used_bytes": {"metric": "nv_cpu_memory_used_bytes"},
            "memory_total_bytes": {"metric": "nv_cpu_memory_total_bytes"},
        }
    )
    s = sample_from_text(text, mapping, received_at_s=0.0)
    assert s is not None
    assert s.queued_by_model == {"densenet_onnx": 0.0}
    assert s.utilization == pytest.approx(0.02255639097744361)
    assert s.memory_total_bytes == 16861294592.0
    assert s.memory_used_bytes == 4000546816.0


def test_text_without_queue_metric_gives_no_sample() -> None:
    assert sample_from_text("# HELP x y\nx 1\n", triton(), received_at_s=0.0) is None
    assert sample_from_text("", triton(), received_at_s=0.0) is None


def test_parser_skips_longer_names_and_reads_escapes() -> None:
    text = 'm_count{a="1"} 5\nm{a="x\\"y",b="2"} 3 1700000000\nm 4\n'
    got = parse_samples(text, ["m"])
    assert got == {"m": [({"a": 'x"y', "b": "2"}, 3.0), ({}, 4.0)]}


@pytest.mark.parametrize(
    "line",
    ['m{a="1" 3', "m{a=1} 3", "m notanumber", "m", 'm{a="1'],
)
def test_parser_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(PrometheusParseError):
        parse_samples(line + "\n", ["m"])
