"""bench/llm_step_profile.py (the fit, and its --tiny run writing a valid profile) and
bench/llm_real_batching.py (its continuous-batching loop gives the one-at-a-time tokens)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from evenserve.core.llm import load_step_profile
from tests.unit.bench.bench_module import load

pytest.importorskip("torch")
pytest.importorskip("transformers")

profile = load("llm_step_profile")
batching = load("llm_real_batching")


def _points(c: tuple[float, float, float, float], noise: float = 0.0) -> list[object]:
    rng = np.random.default_rng(0)
    pts = []
    for p, d, kv in [(0, 1, 256), (0, 8, 2048), (0, 64, 65536), (0, 128, 262144), (512, 0, 0),
                     (2048, 0, 0), (256, 8, 8192), (128, 0, 0), (0, 32, 8192)]:  # fmt: skip
        t = c[0] + c[1] * p + c[2] * d + c[3] * kv
        pts.append(profile.Point("x", p, d, kv, t * (1 + noise * rng.standard_normal())))
    return pts


def test_the_fit_recovers_known_coefficients() -> None:
    truth = (5e-3, 20e-6, 40e-6, 2e-8)
    coef, rel = profile.fit(_points(truth))
    assert coef == pytest.approx(truth, rel=1e-6)
    assert np.abs(rel).max() < 1e-9


def test_the_fit_never_goes_negative() -> None:
    # a term that costs nothing, with noise, would fit slightly negative by plain least squares
    pts = _points((5e-3, 20e-6, 0.0, 2e-8), noise=0.05)
    a, t = profile.design(pts)
    plain = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)[0]
    assert plain[2] < 0  # the case in point
    coef, rel = profile.fit(pts)
    assert np.all(coef >= 0) and coef[0] > 0 and coef[2] == 0
    assert np.all(np.isfinite(rel))


def test_the_tiny_run_writes_a_valid_step_profile(tmp_path: Path) -> None:
    out = tmp_path / "tiny.yaml"
    result = profile.main(["--tiny", "--threads", "1", "--out", str(out)])
    prof = load_step_profile(out)  # validates against StepProfileFile
    assert prof.source.startswith("measured by bench/llm_step_profile.py on CPU")
    assert "random weights" in prof.source
    coefs = result["coefficients_s"]
    assert set(coefs) == {"c0", "prefill_tokens", "decode_seqs", "kv_tokens"}
    assert all(math.isfinite(v) and v >= 0 for v in coefs.values())
    assert prof.c0_s > 0
    assert prof.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # tiny: 2 layers, 2 KV heads, fp32
    assert result["points"] == len(result["relative_residuals"]) > 4


def test_the_bench_loop_gives_the_one_at_a_time_tokens() -> None:
    from evenserve.runtime.llm.torch_executor import TINY_LLAMA, LlmTorchParams, build_executor

    params = LlmTorchParams(config={**TINY_LLAMA, "initializer_range": 0.2}, seed=1)
    ex = build_executor(Path("."), params)
    prompts = batching.prompts(5, 4, 40, seed=3)
    alone = batching.run_one_at_a_time(ex, prompts, 6)
    together, shape = batching.run_continuous(ex, prompts, 6, max_batch=2, step_tokens=16)
    assert together == alone
    assert ex.active_seqs == 0
    assert 1 < shape["mean_batch"] <= 2
