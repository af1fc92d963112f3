"""The correctness gate and the precision check of ``evenserve optimize``: pure figures."""

from __future__ import annotations

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.runtime.device import parse_device
from evenserve.worker.gate import compare
from evenserve.worker.optimize.checks import precision_check, throughput
from evenserve.worker.optimize.selection import VariantResult, choose
from evenserve.worker.optimize.variants import VARIANTS, parse_variants

CPU = parse_device("cpu")


def _logits(n: int = 200, classes: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, classes))


def test_identical_outputs_pass_with_full_agreement() -> None:
    ref = _logits()
    g = compare(ref, ref.copy(), min_top1_agreement=0.99, min_cosine=0.99)
    assert g.passed and g.top1_agreement == 1.0 and g.cosine == pytest.approx(1.0)
    assert g.items == 200 and g.nonfinite_items == 0 and g.reasons == []


def test_small_noise_passes_large_noise_fails_naming_both_figures() -> None:
    ref = _logits()
    rng = np.random.default_rng(1)
    small = compare(
        ref, ref + rng.normal(scale=1e-4, size=ref.shape), min_top1_agreement=0.99, min_cosine=0.99
    )
    assert small.passed
    big = compare(
        ref, ref + rng.normal(scale=2.0, size=ref.shape), min_top1_agreement=0.99, min_cosine=0.99
    )
    assert not big.passed
    assert big.top1_agreement < 0.9 and big.cosine < 0.9
    text = " ".join(big.reasons)
    assert "min_top1_agreement" in text and "min_cosine" in text


def test_top1_counts_flipped_winners_exactly() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    got = ref.copy()
    got[0] = [0.0, 1.0]  # one of four flips
    g = compare(ref, got, min_top1_agreement=0.5, min_cosine=-1.0)
    assert g.top1_agreement == 0.75 and g.passed


def test_nonfinite_items_disagree_and_fail() -> None:
    ref = _logits(10)
    got = ref.copy()
    got[3, 1] = np.nan
    got[7, 0] = np.inf
    g = compare(ref, got, min_top1_agreement=0.0, min_cosine=-1.0)
    assert not g.passed and g.nonfinite_items == 2
    assert g.cosine_min == -1.0
    assert "2 of 10 items have non-finite outputs" in g.reasons[0]


def test_per_position_outputs_agree_per_position() -> None:
    ref = np.random.default_rng(2).normal(size=(4, 6, 3))  # items x tokens x classes
    got = ref.copy()
    got[0, 0] = -got[0, 0]  # one token of 24 flips its winner (almost surely)
    g = compare(ref, got, min_top1_agreement=0.0, min_cosine=-1.0)
    assert g.top1_agreement == pytest.approx(23 / 24)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        compare(np.zeros((3, 2)), np.zeros((3, 4)), min_top1_agreement=0.9, min_cosine=0.9)


def test_precision_check_fp16_asked_but_fp32_ran_fails() -> None:
    evidence = {
        "weights_bytes": {"float32": 4000.0},
        "activation_dtypes": {"float32": 12},
        "quantized_weight_fraction": 0.0,
    }
    check = precision_check(VARIANTS["fp16"], evidence, 1.01, parse_device("cuda:0"))
    assert not check["passed"]
    text = " ".join(check["reasons"])
    assert "float16" in text and "no faster" in text


def test_precision_check_no_faster_is_only_a_note_on_the_cpu() -> None:
    evidence = {
        "weights_bytes": {"bfloat16": 2000.0, "int64": 8.0},
        "activation_dtypes": {"bfloat16": 12},
    }
    check = precision_check(VARIANTS["bf16"], evidence, 1.02, CPU)
    assert check["passed"] and check["notes"] and "no faster" in check["notes"][0]


def test_precision_check_int8_needs_most_matmul_weights_quantized() -> None:
    cnn = {"weights_bytes": {"float32": 100.0, "qint8": 1.0}, "quantized_weight_fraction": 0.05}
    bad = precision_check(VARIANTS["int8-dynamic"], cnn, 0.99, CPU)
    assert not bad["passed"] and "5.0% of the Linear/Conv weights" in bad["reasons"][0]
    bert = {"weights_bytes": {"float32": 10.0, "qint8": 80.0}, "quantized_weight_fraction": 1.0}
    assert precision_check(VARIANTS["int8-dynamic"], bert, 0.55, CPU)["passed"]


def test_precision_check_onnx_graph_verdict() -> None:
    assert precision_check(VARIANTS["onnxruntime-int8"], {"precision": "int8"}, 0.6, CPU)["passed"]
    check = precision_check(VARIANTS["onnxruntime-int8"], {"precision": "fp32"}, 0.6, CPU)
    assert not check["passed"] and "runs fp32" in check["reasons"][0]


def test_throughput_keeps_only_batches_with_room_for_the_slo() -> None:
    lat = {1: 10.0, 8: 40.0, 16: 60.0}
    assert throughput(lat, None) == (pytest.approx(16 * 1000 / 60.0, abs=1e-3), 16)
    # 2 x 60 > 100: batch 16 is out, batch 8 is the best that fits.
    assert throughput(lat, 100.0) == (pytest.approx(200.0), 8)
    assert throughput(lat, 15.0) == (None, None)


def test_choose_takes_the_fastest_usable_variant() -> None:
    fast = VariantResult(VARIANTS["int8-dynamic"], status="rejected", throughput_rps=300.0)
    ok = VariantResult(VARIANTS["onnxruntime"], throughput_rps=200.0)
    ref = VariantResult(VARIANTS["fp32"], throughput_rps=100.0)
    assert choose({"fp32": ref, "int8-dynamic": fast, "onnxruntime": ok}) == "onnxruntime"
    assert choose({"fp32": VariantResult(VARIANTS["fp32"], status="rejected")}) is None


def test_parse_variants_puts_fp32_first_and_names_unknown_ones() -> None:
    assert parse_variants(["int8-dynamic", "fp32", "int8-dynamic"]) == ["fp32", "int8-dynamic"]
    with pytest.raises(ConfigError, match="unknown variant 'int4'"):
        parse_variants(["int4"])
