"""Payloads from v2 metadata (binary extension) and from a file; errors name the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evenserve.core.errors import ConfigError
from evenserve.loadgen.payload import (
    HEADER_LENGTH,
    concrete_shape,
    payload_from_file,
    payload_from_metadata,
)

BERT_LIKE = {
    "name": "bert",
    "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [-1, 128]},
    ],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
}


def test_concrete_shape() -> None:
    assert concrete_shape([-1, 3, 224, 224], 1) == [1, 3, 224, 224]
    assert concrete_shape([-1, -1], 64) == [1, 64]
    assert concrete_shape([4], 9) == [4]
    with pytest.raises(ValueError):
        concrete_shape([-1, -2], 1)


def split(body: bytes, n: int) -> tuple[dict[str, object], bytes]:
    return json.loads(body[:n]), body[n:]


def test_binary_bodies_match_declared_shapes_and_dtypes() -> None:
    p = payload_from_metadata("bert", BERT_LIKE, var_dim=32, seed=1)
    n = int(p.headers[HEADER_LENGTH])
    head, raw = split(p.body(), n)
    inputs = head["inputs"]
    assert isinstance(inputs, list)
    assert [i["shape"] for i in inputs] == [[1, 32], [1, 128]]
    sizes = [i["parameters"]["binary_data_size"] for i in inputs]
    assert sizes == [32 * 8, 128 * 8]
    assert len(raw) == sum(sizes)
    ids = np.frombuffer(raw[: sizes[0]], dtype="<i8")
    assert ids.min() >= 0
    assert head["parameters"] == {"binary_data_output": True}
    # A few different random bodies, sent in turn.
    bodies = {p.body() for _ in range(8)}
    assert len(bodies) > 1


def test_parameters_are_added_to_the_header() -> None:
    p = payload_from_metadata("bert", BERT_LIKE)
    body, headers = p.with_parameters({"priority": 0, "timeout": 5000})
    head, raw = split(body, int(headers[HEADER_LENGTH]))
    assert head["parameters"] == {"binary_data_output": True, "priority": 0, "timeout": 5000}
    assert len(raw) == (1 + 128) * 8  # input_ids [1, 1] (var_dim 1) and the mask [1, 128]


RESNET_LIKE = {
    "name": "resnet",
    "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}],
}


def test_json_bodies_carry_the_tensors_as_flat_lists() -> None:
    """``encoding="json"``: what tritonclient sends with binary data off; a ResNet-50 image
    is about 3 MB of text and parses to the declared shape's element count."""
    p = payload_from_metadata("resnet", RESNET_LIKE, encoding="json", seed=3)
    body = p.body()
    assert p.headers == {"Content-Type": "application/json"} and len(body) > 2_500_000
    doc = json.loads(body)
    (t,) = doc["inputs"]
    assert (t["name"], t["datatype"], t["shape"]) == ("pixels", "FP32", [1, 3, 224, 224])
    assert len(t["data"]) == 3 * 224 * 224 and all(0 <= x < 1 for x in t["data"][:100])
    with_params, headers = p.with_parameters({"priority": 0, "timeout": 5000})
    doc2 = json.loads(with_params)
    assert doc2["parameters"] == {"priority": 0, "timeout": 5000}
    assert headers == p.headers and len(doc2["inputs"][0]["data"]) == 3 * 224 * 224
    ids = json.loads(payload_from_metadata("bert", BERT_LIKE, encoding="json").body())
    assert [i["shape"] for i in ids["inputs"]] == [[1, 1], [1, 128]]
    assert all(isinstance(x, int) for x in ids["inputs"][1]["data"])
    with pytest.raises(ConfigError, match="encoding"):
        payload_from_metadata("bert", BERT_LIKE, encoding="xml")


@pytest.mark.parametrize(
    ("meta", "needle"),
    [
        ({"inputs": []}, "no inputs"),
        ({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [-1]}]}, "inputs[0].datatype"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": "4"}]}, "inputs[0].shape"),
        ({"inputs": [{"datatype": "FP32", "shape": [4]}]}, "inputs[0].name"),
    ],
)
def test_bad_metadata_is_a_clear_error(meta: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        payload_from_metadata("m", meta)
    assert needle in str(e.value) and "'m'" in str(e.value)


def test_payload_file(tmp_path: Path) -> None:
    good = tmp_path / "req.json"
    good.write_text(
        json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    )
    p = payload_from_file("m", good)
    assert json.loads(p.body())["inputs"][0]["name"] == "x"
    body, _ = p.with_parameters({"priority": 10})
    assert json.loads(body)["parameters"] == {"priority": 10}
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        payload_from_file("m", bad)
    with pytest.raises(ConfigError, match="file not found"):
        payload_from_file("m", tmp_path / "nope.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="'inputs'"):
        payload_from_file("m", tmp_path / "list.json")
