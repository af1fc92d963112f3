"""The pure parts of bench/first_request.py: the ratio of a batch size's first request to its
steady ones, ``--check``'s rule, ``--batch-sizes`` and the request body. Nothing here starts
a process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.worker.repository import load_repository
from tests.unit.bench.bench_module import load

ROOT = Path(__file__).resolve().parents[3]


fr = load("first_request")


def test_ratio_is_first_over_steady_median() -> None:
    row = fr.Row(4, 30.0, [10.0, 12.0, 9.0, 50.0, 11.0])
    assert row.steady_median_ms == 11.0
    assert row.ratio == pytest.approx(30.0 / 11.0)
    figures = row.figures()
    assert figures["batch"] == 4 and figures["ratio"] == pytest.approx(30.0 / 11.0)


def test_check_exits_1_only_above_the_bound() -> None:
    at = fr.Row(1, 20.0, [10.0])  # exactly 2x: not over
    above = fr.Row(2, 20.1, [10.0])
    assert fr.over([at]) == [] and fr.check_status([at]) == 0
    assert fr.over([at, above]) == [above] and fr.check_status([at, above]) == 1
    assert fr.check_status([above], max_ratio=3.0) == 0
    nothing = fr.Row(3, 5.0, [])  # nothing steady to compare with: counted as over
    assert math.isnan(nothing.ratio) and fr.check_status([nothing]) == 1


def test_batch_sizes() -> None:
    assert fr.parse_sizes(None, 4) == [1, 2, 3, 4]
    assert fr.parse_sizes("4,1,2", 8) == [1, 2, 4]
    for bad in ("x", "0,1", "9", ""):
        with pytest.raises(SystemExit, match="--batch-sizes"):
            fr.parse_sizes(bad, 8)


def test_request_body_carries_b_items() -> None:
    (entry,) = load_repository(ROOT / "examples" / "models" / "tiny", ["tiny-bert"])
    body = fr.request_body(entry, 3)
    ids, mask = body["inputs"]
    assert ids["name"] == "input_ids" and ids["datatype"] == "INT64"
    assert ids["shape"] == [3, 16] and len(ids["data"]) == 48
    assert set(mask["data"]) == {1}  # the synthetic range of attention_mask


def test_variant_copy_serves_the_torch_variant_with_the_profile_resolved(tmp_path: Path) -> None:
    repo = fr.variant_copy(
        ROOT / "examples" / "models" / "transformers", "bert-base", "int8-dynamic", tmp_path
    )
    (entry,) = load_repository(repo, ["bert-base"])  # the profile resolves from the copy
    assert entry.variant is not None and entry.variant["name"] == "int8-dynamic"
    assert entry.runtime_params.precision == "int8"  # type: ignore[union-attr]
    assert entry.latency_profile() is not None
    with pytest.raises(ConfigError, match="not one of"):
        fr.variant_copy(
            ROOT / "examples" / "models" / "tiny", "tiny-bert", "onnxruntime", tmp_path / "x"
        )


def test_binary_body_holds_the_same_items_as_raw_bytes() -> None:
    import json

    import numpy as np

    (entry,) = load_repository(ROOT / "examples" / "models" / "tiny", ["tiny-resnet"])
    content, headers = fr.binary_body(entry, 2)
    n = int(headers["Inference-Header-Content-Length"])
    header = json.loads(content[:n])
    (inp,) = header["inputs"]
    assert inp["shape"] == [2, 3, 32, 32]
    assert inp["parameters"]["binary_data_size"] == 2 * 3 * 32 * 32 * 4 == len(content) - n
    as_json = fr.request_body(entry, 2)["inputs"][0]["data"]
    raw = np.frombuffer(content[n:], dtype=np.float32)
    np.testing.assert_array_equal(raw, np.asarray(as_json, dtype=np.float32))
