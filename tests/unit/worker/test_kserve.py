"""KServe v2 codec: every malformed or mismatched request is a 400 that names the input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evenserve.runtime.base import TensorSpec
from evenserve.worker.kserve import (
    HEADER_LENGTH,
    ModelSignature,
    ProtocolError,
    RequestedOutput,
    parse_header_length,
    parse_infer_request,
    request_class,
)
from evenserve.worker.kserve_encode import encode_infer_response

SIG = ModelSignature(
    name="m",
    version="1",
    inputs=(TensorSpec("ids", "INT64", (-1,)), TensorSpec("img", "FP32", (2, 3))),
    outputs=(TensorSpec("out", "FP32", (4,)), TensorSpec("aux", "INT32", ())),
    max_batch_size=4,
)


def _json_req(**over: object) -> dict[str, object]:
    req: dict[str, object] = {
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
            {"name": "img", "datatype": "FP32", "shape": [2, 2, 3], "data": [[0.5] * 6] * 2},
        ]
    }
    req.update(over)
    return req


def _parse(obj: object, hl: int | None = None) -> object:
    return parse_infer_request(json.dumps(obj).encode(), hl, SIG)


def _binary_req(ids: np.ndarray, img: np.ndarray, extra: bytes = b"") -> tuple[bytes, int]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "ids",
                    "datatype": "INT64",
                    "shape": list(ids.shape),
                    "parameters": {"binary_data_size": ids.nbytes},
                },
                {
                    "name": "img",
                    "datatype": "FP32",
                    "shape": list(img.shape),
                    "parameters": {"binary_data_size": img.nbytes},
                },
            ],
            "outputs": [{"name": "out", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + ids.tobytes() + img.tobytes() + extra, len(head)


def test_json_request_parses_to_typed_arrays() -> None:
    req = parse_infer_request(json.dumps(_json_req(id="r1")).encode(), None, SIG)
    assert req.id == "r1" and req.items == 2
    assert req.inputs["ids"].dtype == np.int64 and req.inputs["ids"].shape == (2, 3)
    assert req.inputs["img"].dtype == np.float32 and req.inputs["img"].shape == (2, 2, 3)
    assert [o.name for o in req.outputs] == ["out", "aux"]
    assert not any(o.binary for o in req.outputs)


def test_binary_request_parses() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    img = np.ones((2, 2, 3), dtype=np.float32)
    body, hl = _binary_req(ids, img)
    req = parse_infer_request(body, hl, SIG)
    np.testing.assert_array_equal(req.inputs["ids"], ids)
    np.testing.assert_array_equal(req.inputs["img"], img)
    assert req.outputs == [RequestedOutput("out", True)]


def test_parameters_timeout_and_priority() -> None:
    req = parse_infer_request(
        json.dumps(_json_req(parameters={"timeout": 2500, "priority": 0, "x": 1})).encode(),
        None,
        SIG,
    )
    assert req.deadline_in_s == pytest.approx(0.0025)
    assert req.priority == 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r["inputs"].pop(1), "input 'img': missing"),
        (
            lambda r: r["inputs"].append(
                {"name": "zzz", "datatype": "FP32", "shape": [1], "data": [1]}
            ),
            "input 'zzz': unexpected",
        ),
        (lambda r: r["inputs"][1].update(datatype="FP64"), "input 'img': datatype 'FP64'"),
        (lambda r: r["inputs"][1].update(shape=[2, 3, 2]), "input 'img': shape [2, 3, 2]"),
        (lambda r: r["inputs"][1].update(shape=[2, 2]), "input 'img': shape [2, 2] has 2"),
        (
            lambda r: r["inputs"][1].update(shape=[5, 2, 3], data=[0.0] * 30),
            "input 'img': batch dimension 5 must be in 1..4",
        ),
        (
            lambda r: r["inputs"][0].update(shape=[1, 3], data=[1, 2, 3]),
            "input 'img': batch dimension 2 differs",
        ),
        (lambda r: r["inputs"][0].update(data=[1, 2, 3]), "input 'ids': data holds 3 elements"),
        (lambda r: r["inputs"][0].update(data=[1.5] * 6), "input 'ids': data of type float64"),
        (lambda r: r["inputs"][0].update(data=[[1, 2], [3]]), "input 'ids': data is not"),
        (lambda r: r["inputs"][0].update(data="abc"), "input 'ids': data must be a list"),
        (lambda r: r["inputs"][0].pop("data"), "input 'ids': no data"),
        (lambda r: r["inputs"].append(dict(r["inputs"][0])), "input 'ids': given twice"),
        (lambda r: r.update(inputs=[]), "inputs: required"),
        (lambda r: r.update(outputs=[{"name": "nope"}]), "output 'nope': unknown"),
        (
            lambda r: r.update(outputs=[{"name": "out", "parameters": {"classification": 3}}]),
            "classification",
        ),
        (lambda r: r.update(parameters={"timeout": "soon"}), "parameters.timeout"),
        (lambda r: r.update(parameters={"sequence_id": 7}), "sequence batching"),
        (lambda r: r["inputs"][0].update(data=[2**63 + 1] * 6), "input 'ids'"),
    ],
)
def test_bad_json_inputs_are_400_naming_the_input(mutate: object, message: str) -> None:
    req = json.loads(json.dumps(_json_req()))
    mutate(req)  # type: ignore[operator]
    with pytest.raises(ProtocolError) as err:
        _parse(req)
    assert err.value.status == 400
    assert message in str(err.value)


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe", b"", b"null"])
def test_malformed_json_is_400(body: bytes) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_infer_request(body, None, SIG)
    assert err.value.status == 400


def test_malformed_binary_headers_are_400() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    img = np.ones((2, 2, 3), dtype=np.float32)
    body, hl = _binary_req(ids, img)
    for bad_hl, msg in (
        (0, HEADER_LENGTH),
        (len(body) + 1, HEADER_LENGTH),
        (hl - 1, "JSON"),
        (hl + 3, "JSON"),
    ):
        with pytest.raises(ProtocolError, match=msg):
            parse_infer_request(body, bad_hl, SIG)
    with pytest.raises(ProtocolError, match="beyond the declared inputs"):
        parse_infer_request(body + b"xx", hl, SIG)
    with pytest.raises(ProtocolError, match="input 'img': binary data ends"):
        parse_infer_request(body[:-4], hl, SIG)
    head = json.loads(body[:hl])
    head["inputs"][0]["parameters"]["binary_data_size"] = 40
    raw = json.dumps(head).encode()
    with pytest.raises(ProtocolError, match="input 'ids': binary_data_size 40"):
        parse_infer_request(raw + body[hl:], len(raw), SIG)


def test_response_json_and_binary() -> None:
    out = np.arange(8, dtype=np.float32).reshape(2, 4)
    aux = np.array([3, 4], dtype=np.int32)
    body, headers = encode_infer_response(
        SIG,
        "id7",
        {"out": out, "aux": aux},
        [RequestedOutput("out", False), RequestedOutput("aux", False)],
    )
    assert headers == {"content-type": "application/json"}
    doc = json.loads(body)
    assert doc["id"] == "id7" and doc["model_name"] == "m"
    assert doc["outputs"][0] == {
        "name": "out",
        "datatype": "FP32",
        "shape": [2, 4],
        "data": list(range(8)),
    }
    body, headers = encode_infer_response(
        SIG,
        None,
        {"out": out, "aux": aux},
        [RequestedOutput("out", True), RequestedOutput("aux", False)],
    )
    hl = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:hl])
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 32}
    np.testing.assert_array_equal(np.frombuffer(body[hl:], dtype=np.float32).reshape(2, 4), out)
    assert doc["outputs"][1]["data"] == [3, 4]


def _class_body(**params: object) -> bytes:
    return json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}],
            "parameters": params,
        }
    ).encode()


CLASS_SIG = ModelSignature("m", "1", (TensorSpec("x", "FP32", (4,)),), (), 8)


@pytest.mark.parametrize(
    ("params", "headers", "expected"),
    [
        ({}, {}, (None, None)),
        ({"priority": "offline"}, {}, (0, None)),
        ({"priority": 7, "deadline_ms": 250}, {}, (7, 0.25)),
        ({}, {"x-evenserve-priority": "online", "x-evenserve-deadline-ms": "80.5"}, (10, 0.0805)),
        ({}, {"x-evenserve-priority": "3"}, (3, None)),
        # Parameters win over headers; with a timeout and a deadline the earlier holds.
        ({"priority": "offline"}, {"x-evenserve-priority": "online"}, (0, None)),
        ({"deadline_ms": 500}, {"x-evenserve-deadline-ms": "100"}, (None, 0.5)),
        ({"timeout": 100_000, "deadline_ms": 500}, {}, (None, 0.1)),
        ({"timeout": 900_000}, {"x-evenserve-deadline-ms": "200"}, (None, 0.2)),
    ],
)
def test_priority_and_deadline_from_parameters_or_headers(
    params: dict[str, object], headers: dict[str, str], expected: tuple[object, object]
) -> None:
    req = parse_infer_request(_class_body(**params), None, CLASS_SIG)
    prio, deadline_in_s = request_class(req, headers)
    assert prio == expected[0]
    assert (
        deadline_in_s == pytest.approx(expected[1])
        if expected[1] is not None
        else deadline_in_s is None
    )


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"priority": "urgent"}, {}, "parameters.priority"),
        ({"priority": True}, {}, "parameters.priority"),
        ({"priority": 1.5}, {}, "parameters.priority"),
        ({"deadline_ms": 0}, {}, "parameters.deadline_ms"),
        ({"deadline_ms": "soon"}, {}, "parameters.deadline_ms"),
        ({"deadline_ms": False}, {}, "parameters.deadline_ms"),
        ({}, {"x-evenserve-priority": "high"}, "x-evenserve-priority"),
        ({}, {"x-evenserve-deadline-ms": "-5"}, "x-evenserve-deadline-ms"),
        ({}, {"x-evenserve-deadline-ms": "nan"}, "x-evenserve-deadline-ms"),
    ],
)
def test_bad_priority_or_deadline_is_a_400_naming_the_field(
    params: dict[str, object], headers: dict[str, str], field: str
) -> None:
    with pytest.raises(ProtocolError) as err:
        req = parse_infer_request(_class_body(**params), None, CLASS_SIG)
        request_class(req, headers)
    assert err.value.status == 400 and str(err.value).startswith(field)


# -- hostile input: huge numbers, deep nesting (every one a 400 naming the field) -------------
HUGE = "9" * 5000  # over Python's 4300-digit limit for int()


def _raw(text: str, hl: int | None = None) -> ProtocolError:
    with pytest.raises(ProtocolError) as err:
        req = parse_infer_request(text.encode(), hl, SIG)
        request_class(req, {})
    assert err.value.status == 400
    assert len(str(err.value)) < 400  # the huge value is never echoed whole
    return err.value


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (  # a 5000-digit integer in INT64 tensor data
            '{"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 2], '
            f'"data": [1, {HUGE}]}}]}}',
            "input 'ids': data",
        ),
        (  # ... as a shape dimension
            f'{{"inputs": [{{"name": "ids", "datatype": "INT64", "shape": [1, {HUGE}], '
            '"data": [1]}]}',
            "input 'ids': shape",
        ),
        (  # ... as the batch dimension
            f'{{"inputs": [{{"name": "ids", "datatype": "INT64", "shape": [{HUGE}, 1], '
            '"data": [1]}]}',
            "input 'ids': shape",
        ),
    ],
)
def test_huge_integers_in_the_body_name_the_field(body: str, field: str) -> None:
    assert str(_raw(body)).startswith(field)


def _with_params(params: str) -> str:
    head = json.dumps(_json_req())[:-1]  # the request object without its closing brace
    return head + ', "parameters": ' + params + "}"


@pytest.mark.parametrize("key", ["priority", "deadline_ms", "timeout"])
@pytest.mark.parametrize("number", ["1" + "0" * 400, "-1" + "0" * 400, HUGE, "1e400"])
def test_huge_numbers_as_parameters_name_the_parameter(key: str, number: str) -> None:
    assert str(_raw(_with_params(f'{{"{key}": {number}}}'))).startswith(f"parameters.{key}")


def test_a_large_dimension_is_refused_before_any_arithmetic() -> None:
    body = json.dumps(_json_req())
    body = body.replace('"shape": [2, 3]', '"shape": [2, ' + "1" + "0" * 30 + "]")
    assert "dimension 1 of shape is over" in str(_raw(body))


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"x-evenserve-priority": "9" * 400}, "x-evenserve-priority"),
        ({"x-evenserve-priority": "9" * 5000}, "x-evenserve-priority"),
        ({"x-evenserve-priority": str(2**31)}, "x-evenserve-priority"),
        ({"x-evenserve-deadline-ms": "9" * 400}, "x-evenserve-deadline-ms"),
        ({"x-evenserve-deadline-ms": "1e400"}, "x-evenserve-deadline-ms"),
    ],
)
def test_huge_header_values_name_the_header(headers: dict[str, str], field: str) -> None:
    req = parse_infer_request(_class_body(), None, CLASS_SIG)
    with pytest.raises(ProtocolError) as err:
        request_class(req, headers)
    assert err.value.status == 400 and str(err.value).startswith(field)
    assert len(str(err.value)) < 300


@pytest.mark.parametrize("depth", [100, 5_000, 100_000])
@pytest.mark.parametrize("where", ["top", "data", "parameters"])
def test_deep_nesting_is_a_400_before_parsing(depth: int, where: str) -> None:
    deep = "[" * depth + "]" * depth
    body = {
        "top": deep,
        "data": '{"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 1], "data": '
        + deep
        + "}]}",
        "parameters": '{"inputs": [], "parameters": {"x": ' + deep + "}}",
    }[where]
    assert str(_raw(body)) == "body: JSON nested too deep (over 64 levels)"


def test_deep_nesting_in_the_json_part_of_a_binary_request() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    img = np.ones((2, 2, 3), dtype=np.float32)
    body, hl = _binary_req(ids, img)
    head = body[:hl][:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(ProtocolError, match="nested too deep"):
        parse_infer_request(head + body[hl:], len(head), SIG)


def test_binary_tensor_bytes_are_not_scanned_as_json() -> None:
    ids = np.frombuffer(b"[" * 48, dtype=np.int64).reshape(2, 3)  # brackets, as bytes
    img = np.ones((2, 2, 3), dtype=np.float32)
    body, hl = _binary_req(ids, img)
    np.testing.assert_array_equal(parse_infer_request(body, hl, SIG).inputs["ids"], ids)


@pytest.mark.parametrize(
    ("value", "want"), [(None, None), ("0", 0), ("12", 12), (" 7 ", 7), ("9" * 19, 10**19 - 1)]
)
def test_header_length_header(value: str | None, want: int | None) -> None:
    assert parse_header_length(value) == want


@pytest.mark.parametrize("value", ["", "-1", "+1", "1_0", "0x10", "1.0", "١٢", "9" * 20, HUGE])
def test_bad_header_length_header_is_400_naming_it(value: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_header_length(value)
    assert err.value.status == 400 and str(err.value).startswith(HEADER_LENGTH)
    assert len(str(err.value)) < 200


# -- exact integers without a scan of every valid body ------------------------------------------
def test_floats_with_long_fractions_are_read_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor of small floats (20-digit fractions, as Python writes 0.0002016...) is read
    by orjson: json, 5-10x slower, is never asked (it was, for every run of 20 digits)."""
    import evenserve.core.wire as wire_mod

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("json.loads was asked")

    monkeypatch.setattr(wire_mod.json, "loads", refuse)
    req = _json_req()
    req["inputs"][1]["data"] = [0.00020164294983260334] * 12  # type: ignore[index]
    parsed = _parse(req)
    assert parsed.inputs["img"].dtype == np.float32  # type: ignore[attr-defined]
    np.testing.assert_allclose(parsed.inputs["img"], 0.00020164294983260334)  # type: ignore[attr-defined]


def test_integers_beyond_64_bits_are_judged_exactly() -> None:
    """orjson reads 2**64 + 1 as a float; the request is read again exactly before it is
    judged, so the message is the exact one (out of range), and a UINT64 value at the top of
    its range stays exact."""
    body = json.dumps(_json_req()).replace("[1, 2, 3, 4, 5, 6]", f"[1, 2, 3, 4, 5, {2**64 + 1}]")
    assert str(_raw(body)) == "input 'ids': a value is out of range for INT64"
    sig = ModelSignature("u", "1", (TensorSpec("x", "UINT64", (1,)),), SIG.outputs, 4)
    top = 2**64 - 1
    doc = {"inputs": [{"name": "x", "datatype": "UINT64", "shape": [1, 1], "data": [top]}]}
    assert int(parse_infer_request(json.dumps(doc).encode(), None, sig).inputs["x"][0, 0]) == top


def test_a_long_integer_where_an_integer_belongs_is_read_exactly() -> None:
    """A 24-digit timeout (microseconds) is an integer to json and a float to orjson: the
    fast read fails validation, the exact read accepts it, as before orjson."""
    body = _with_params('{"timeout": ' + "1" + "0" * 23 + "}").encode()
    req = parse_infer_request(body, None, SIG)
    assert req.deadline_in_s == 1e23 / 1e6
