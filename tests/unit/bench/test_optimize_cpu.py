"""The pure parts of bench/optimize_cpu.py: per-variant figures at batch 8 from a report."""

from __future__ import annotations

import pytest

from tests.unit.bench.bench_module import load

oc = load("optimize_cpu")


def _variant(status: str, b8_ms: float | None) -> dict[str, object]:
    return {
        "status": status,
        "gate": {"top1_agreement": 0.995, "cosine": 0.99, "items": 512},
        "profile": None if b8_ms is None else {"latency_ms": {"1": 10.0, "8": b8_ms}},
        "reasons": [],
    }


def test_rows_give_items_per_second_and_the_ratio_at_batch_8() -> None:
    report = {
        "variants": {
            "fp32": _variant("passed", 800.0),
            "int8-dynamic": _variant("chosen", 320.0),
            "onnxruntime-int8-static": _variant("unsupported", None),
        }
    }
    rows = {r["variant"]: r for r in oc.rows(report)}
    assert rows["fp32"]["items_s_b8"] == pytest.approx(10.0)
    assert rows["int8-dynamic"]["vs_fp32_b8"] == pytest.approx(2.5)
    assert rows["onnxruntime-int8-static"]["vs_fp32_b8"] is None
    assert oc.at_batch(report["variants"]["fp32"], 4) is None
