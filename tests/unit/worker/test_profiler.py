"""The profiler: synthetic inputs from model.yaml, measurement on a runtime, provenance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from evenserve.core.errors import ConfigError
from evenserve.core.profile import load_profile
from evenserve.runtime.device import parse_device
from evenserve.worker.profiler import build_runtime, measure, synthetic_batch, write_profile
from evenserve.worker.repository import load_repository

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"


def test_synthetic_batches_follow_model_yaml() -> None:
    (bert,) = load_repository(EXAMPLES / "transformers", ["bert-base"], check_profiles=False)
    rng = np.random.default_rng(0)
    b = synthetic_batch(bert, 3, {}, rng)
    assert b["input_ids"].shape == (3, 128) and b["input_ids"].dtype == np.int64
    assert b["input_ids"].min() >= 0 and b["input_ids"].max() < 30522
    assert (b["attention_mask"] == 1).all()
    assert synthetic_batch(bert, 2, {"input_ids": [64], "attention_mask": [64]}, rng)[
        "input_ids"
    ].shape == (2, 64)
    with pytest.raises(ConfigError, match="--input-shape input_ids"):
        synthetic_batch(bert, 1, {"input_ids": [2, 2]}, rng)
    (pair,) = load_repository(EXAMPLES / "tiny", ["tiny-emulated"])
    assert synthetic_batch(pair, 4, {}, rng)["x"].dtype == np.float32


def test_measure_and_write_an_emulated_profile(tmp_path: Path) -> None:
    (entry,) = load_repository(EXAMPLES / "tiny", ["tiny-emulated"])
    dev = parse_device("cpu")
    rt = build_runtime(entry, dev)
    rt.load()
    seen = []
    points = measure(rt, entry, dev, [4, 1], warmup=1, iters=5, progress=seen.append)
    assert [p.batch for p in points] == [1, 4] and len(seen) == 2
    out = tmp_path / "p.yaml"
    prof = write_profile(out, entry, dev, rt, points, warmup=1, iters=5, load_average=(0.5, 0.7))
    assert load_profile(out).batches == (1, 4)
    assert prof.weights_mb == 10
    doc = yaml.safe_load(out.read_text())
    assert "median wall time of 5 runs" in doc["source"]
    assert "load average 0.50 at the start" in doc["notes"]
    with pytest.raises(ConfigError, match="--batch-sizes: 99"):
        measure(rt, entry, dev, [99])
    with pytest.raises(ConfigError, match="--clock cpu: needs"):
        measure(rt, entry, dev, [1], clock="cpu", threads=2)
    with pytest.raises(ConfigError, match="--precision: runtime emulated"):
        build_runtime(entry, dev, precision="fp16")
