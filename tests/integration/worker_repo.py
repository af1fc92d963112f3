"""A small emulated model repository for worker integration and e2e tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PROFILE = {
    "model": "test",
    "device": "test device (synthetic)",
    "runtime": "emulated",
    "precision": "fp32",
    "source": "Synthetic figures for tests (not a measurement).",
    "weights_mb": 10,
    "points": [
        {"batch": 1, "latency_ms": 4.0, "memory_mb": 1},
        {"batch": 4, "latency_ms": 5.0, "memory_mb": 4},
        {"batch": 16, "latency_ms": 9.0, "memory_mb": 16},
    ],
}

MODELS: dict[str, dict[str, Any]] = {
    # One FP32 vector in, one out; dynamic batching with a 2 ms window.
    "em": {
        "runtime": "emulated",
        "max_batch_size": 16,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
        "batching": {"policy": "fixed-window", "max_batch_delay_ms": 2},
        "emulated": {"profile": "profile.yaml"},
    },
    # Two variable-length INT64 inputs (a BERT-like signature).
    "pair": {
        "runtime": "emulated",
        "max_batch_size": 8,
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [-1]},
            {"name": "mask", "datatype": "INT64", "shape": [-1]},
        ],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [2]}],
        "emulated": {"profile": "profile.yaml"},
    },
    # Waits for a full batch of 4 that never comes: for queue-full and deadline tests.
    "waits": {
        "runtime": "emulated",
        "max_batch_size": 4,
        "max_queue_size": 2,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
        "batching": {"policy": "static", "batch_size": 4},
        "emulated": {"profile": "profile.yaml"},
    },
}


def write_repo(root: Path, models: dict[str, dict[str, Any]] | None = None) -> Path:
    repo = root / "repo"
    for name, cfg in (models or MODELS).items():
        d = repo / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "model.yaml").write_text(yaml.safe_dump(cfg))
        (d / "profile.yaml").write_text(yaml.safe_dump({**PROFILE, "model": name}))
    return repo


def metric_samples(text: str, name: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample of one metric in a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
