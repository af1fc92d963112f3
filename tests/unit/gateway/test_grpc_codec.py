"""The gateway's gRPC codec (``gateway.grpc_codec``): ModelInfer as a KServe v2 HTTP request
with the binary tensor extension, the HTTP answer as a ModelInferResponse, and every request
it cannot translate refused naming the field."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES
from evenserve.gateway import grpc_answer as acodec
from evenserve.gateway import grpc_codec as codec
from evenserve.runtime.base import TensorSpec
from evenserve.worker import kserve
from evenserve.worker.grpc_codec import CONTENTS_FIELD as WORKER_CONTENTS_FIELD
from evenserve.worker.kserve import ModelSignature


def split(http: codec.HttpInfer) -> tuple[dict[str, Any], bytes]:
    """The forwarded body's JSON header and its binary part."""
    return json.loads(http.body[: http.header_length]), http.body[http.header_length :]


def request(model: str = "m", **kw: Any) -> Any:
    return service_pb2.ModelInferRequest(model_name=model, **kw)


def lengths(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def test_the_worker_and_the_codec_read_contents_from_one_table() -> None:
    assert WORKER_CONTENTS_FIELD is CONTENTS_FIELD


def test_raw_inputs_go_as_they_came_after_a_json_header() -> None:
    req = request("resnet50", model_version="2", id="r1")
    a = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    b = np.array([[7, 8]], dtype=np.int64)
    req.inputs.add(name="input", datatype="FP32", shape=list(a.shape))
    req.inputs.add(name="mask", datatype="INT64", shape=list(b.shape))
    req.raw_input_contents.extend([a.tobytes(), b.tobytes()])
    http = codec.to_http(req)
    head, binary = split(http)
    assert http.path == "/v2/models/resnet50/versions/2/infer"
    assert http.raw_outputs is True
    assert binary == a.tobytes() + b.tobytes()
    assert head == {
        "id": "r1",
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [1, 3, 4],
             "parameters": {"binary_data_size": 48}},
            {"name": "mask", "datatype": "INT64", "shape": [1, 2],
             "parameters": {"binary_data_size": 16}},
        ],
        "parameters": {"binary_data_output": True},
    }  # fmt: skip


# One value per datatype's typed field: (datatype, values, what the raw bytes hold).
TYPED = [
    ("BOOL", [True, False, True], np.array([1, 0, 1], dtype=np.uint8)),
    ("INT8", [-128, 0, 127], np.array([-128, 0, 127], dtype="<i1")),
    ("INT16", [-32768, 5, 32767], np.array([-32768, 5, 32767], dtype="<i2")),
    ("INT32", [-(2**31), 1, 2**31 - 1], np.array([-(2**31), 1, 2**31 - 1], dtype="<i4")),
    ("INT64", [-(2**63), 2, 2**63 - 1], np.array([-(2**63), 2, 2**63 - 1], dtype="<i8")),
    ("UINT8", [0, 9, 255], np.array([0, 9, 255], dtype="<u1")),
    ("UINT16", [0, 9, 65535], np.array([0, 9, 65535], dtype="<u2")),
    ("UINT32", [0, 9, 2**32 - 1], np.array([0, 9, 2**32 - 1], dtype="<u4")),
    ("UINT64", [0, 9, 2**64 - 1], np.array([0, 9, 2**64 - 1], dtype="<u8")),
    ("FP32", [0.5, -1.25, 3.0], np.array([0.5, -1.25, 3.0], dtype="<f4")),
    ("FP64", [0.1, -2.5, 1e300], np.array([0.1, -2.5, 1e300], dtype="<f8")),
]


@pytest.mark.parametrize(("datatype", "values", "raw"), TYPED, ids=[t[0] for t in TYPED])
def test_typed_contents_become_raw_little_endian_bytes(
    datatype: str, values: list[Any], raw: np.ndarray
) -> None:
    req = request()
    t = req.inputs.add(name="x", datatype=datatype, shape=[1, 3])
    getattr(t.contents, CONTENTS_FIELD[datatype]).extend(values)
    head, binary = split(codec.to_http(req))
    assert binary == raw.tobytes()
    assert head["inputs"][0]["parameters"] == {"binary_data_size": raw.nbytes}


def test_bytes_tensors_get_the_extensions_length_prefixes() -> None:
    req = request()
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 3])
    t.contents.bytes_contents.extend([b"ab", b"", "é".encode()])
    _, binary = split(codec.to_http(req))
    assert binary == lengths([b"ab", b"", "é".encode()])


def test_parameters_go_as_json_values_and_outputs_are_asked_binary() -> None:
    req = request()
    req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    p = req.parameters
    p["priority"].string_param = "online"
    p["timeout"].int64_param = 5000
    p["deadline_ms"].double_param = 12.5
    p["flag"].bool_param = True
    p["huge"].uint64_param = 2**64 - 1
    p["nan"].double_param = math.nan
    p["inf"].double_param = -math.inf
    p["unset"].Clear()  # present, no value: null, as the worker's gRPC front reads it
    o = req.outputs.add(name="y")
    o.parameters["classification"].int64_param = 2
    req.inputs[0].parameters["custom"].string_param = "kept"
    head, _ = split(codec.to_http(req))
    assert head["parameters"] == {
        "priority": "online", "timeout": 5000, "deadline_ms": 12.5, "flag": True,
        "huge": 2**64 - 1, "nan": "nan", "inf": "-inf", "unset": None,
        "binary_data_output": True,
    }  # fmt: skip
    assert head["outputs"] == [
        {"name": "y", "parameters": {"classification": 2, "binary_data": True}}
    ]
    assert head["inputs"][0]["parameters"] == {"custom": "kept", "binary_data_size": 4}


@pytest.mark.parametrize(
    ("setup", "raw_outputs"),
    [
        (lambda r: None, True),
        (lambda r: r.parameters["binary_data_output"].__setattr__("bool_param", False), False),
        (lambda r: r.outputs.add(name="y").parameters["binary_data"].__setattr__(
            "bool_param", False), False),
        (lambda r: r.outputs.add(name="y"), True),
    ],
)  # fmt: skip
def test_whether_the_client_wants_raw_outputs(setup: Any, raw_outputs: bool) -> None:
    req = request()
    req.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    setup(req)
    http = codec.to_http(req)
    assert http.raw_outputs is raw_outputs
    head, _ = split(http)
    assert head["parameters"]["binary_data_output"] is True
    assert all(o["parameters"]["binary_data"] is True for o in head.get("outputs", []))


def test_names_are_percent_encoded_in_the_path() -> None:
    assert codec.infer_path("a b/c", "") == "/v2/models/a%20b%2Fc/infer"
    assert codec.infer_path("m", "1") == "/v2/models/m/versions/1/infer"
    assert codec.model_path("a\r\nb", "", "config") == "/v2/models/a%0D%0Ab/config"
    assert codec.model_path("m", "2", "") == "/v2/models/m/versions/2"


def _typed(datatype: str, shape: list[int], **contents: list[Any]) -> Any:
    req = request()
    t = req.inputs.add(name="x", datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(t.contents, field).extend(values)
    return req


def _raw(n_raw: int, n_inputs: int = 1, contents: bool = False) -> Any:
    req = request()
    for i in range(n_inputs):
        t = req.inputs.add(name=f"x{i}", datatype="FP32", shape=[1, 1])
        if contents:
            t.contents.fp32_contents.append(1.0)
    req.raw_input_contents.extend([bytes(4)] * n_raw)
    return req


def _outputs(*flags: Any, default: Any = None) -> Any:
    req = _typed("FP32", [1], fp32_contents=[1.0])
    if default is not None:
        req.parameters["binary_data_output"].string_param = default
    for i, flag in enumerate(flags):
        o = req.outputs.add(name=f"y{i}")
        if flag is not None:
            if isinstance(flag, bool):
                o.parameters["binary_data"].bool_param = flag
            else:
                o.parameters["binary_data"].string_param = flag
    return req


BAD = [
    (_typed("FP32", [1, 4], int_contents=[1, 2, 3, 4]),
     "input 'x': int_contents given for datatype FP32 (use fp32_contents)"),
    (_typed("FP32", [1, 4], fp32_contents=[1.0, 2.0]),
     "input 'x': contents hold 2 elements, shape [1, 4] needs 4"),
    (_typed("FP32", [1, -4], fp32_contents=[1.0]), "input 'x': shape [1, -4] has a negative"),
    (_typed("FP16", [1], fp32_contents=[1.0]),
     "input 'x': 'FP16' has no typed contents; use raw_input_contents"),
    (_typed("NOPE", [1], fp32_contents=[1.0]), "input 'x': 'NOPE' has no typed contents"),
    (_typed("INT8", [1, 2], int_contents=[1, 128]), "input 'x': a value is out of range for INT8"),
    (_typed("UINT16", [1], uint_contents=[70000]),
     "input 'x': a value is out of range for UINT16"),
    (_raw(2), "raw_input_contents: 2 given for 1 inputs"),
    (_raw(1, 2), "raw_input_contents: 1 given for 2 inputs"),
    (_raw(1, contents=True), "input 'x0': both contents and raw_input_contents given"),
    (_outputs(default="yes"), "parameters.binary_data_output: must be a boolean"),
    (_outputs("yes"), "output 'y0': binary_data must be a boolean"),
    (_outputs(True, False), "outputs: raw_output_contents are used for every output or for none"),
    (_outputs(None, False), "outputs: raw_output_contents are used for every output or for none"),
]  # fmt: skip


@pytest.mark.parametrize(("req", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_what_cannot_be_translated_is_refused_naming_the_field(req: Any, message: str) -> None:
    with pytest.raises(codec.CodecError) as err:
        codec.to_http(req)
    assert message in str(err.value)


def test_bytes_that_are_not_a_request_are_refused() -> None:
    with pytest.raises(codec.CodecError, match="the request is not a ModelInferRequest"):
        codec.parse_request(b"\x0a\x05ab")


# -- the answer ------------------------------------------------------------------------------
def answer(outputs: list[tuple[str, str, list[int], bytes]], **head: Any) -> tuple[bytes, str]:
    """A binary-extension answer body and its header length."""
    meta = {**head, "outputs": [
        {"name": n, "datatype": dt, "shape": shape, "parameters": {"binary_data_size": len(b)}}
        for n, dt, shape, b in outputs
    ]}  # fmt: skip
    h = json.dumps(meta).encode()
    return h + b"".join(b for *_, b in outputs), str(len(h))


def test_a_binary_answer_becomes_raw_output_contents() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    z = np.array([[1], [0]], dtype=np.int64)
    body, n = answer(
        [("y", "FP32", [2, 3], y.tobytes()), ("z", "INT64", [2, 1], z.tobytes())],
        model_name="m", model_version="3", id="r9",
        parameters={"flag": True, "count": 3, "big": 2**63 + 5, "ratio": 0.5, "text": "t",
                    "nested": {"dropped": 1}, "none": None},
    )  # fmt: skip
    resp = service_pb2.ModelInferResponse.FromString(acodec.to_grpc(body, n, True))
    assert (resp.model_name, resp.model_version, resp.id) == ("m", "3", "r9")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("y", "FP32", [2, 3]),
        ("z", "INT64", [2, 1]),
    ]
    assert list(resp.raw_output_contents) == [y.tobytes(), z.tobytes()]
    assert all(not o.parameters for o in resp.outputs)  # binary_data_size is HTTP's
    p = resp.parameters
    assert p["flag"].bool_param is True and p["count"].int64_param == 3
    assert p["big"].uint64_param == 2**63 + 5 and p["ratio"].double_param == 0.5
    assert p["text"].string_param == "t" and set(p) == {"flag", "count", "big", "ratio", "text"}
    # The same body as memoryview (a relayed answer's bytes after its head).
    assert acodec.to_grpc(memoryview(b"HEAD" + body)[4:], n, True) == acodec.to_grpc(body, n, True)


@pytest.mark.parametrize(("datatype", "values", "raw"), TYPED, ids=[t[0] for t in TYPED])
def test_typed_outputs_when_the_client_asks_for_them(
    datatype: str, values: list[Any], raw: np.ndarray
) -> None:
    body, n = answer([("y", datatype, [1, 3], raw.tobytes())])
    resp = service_pb2.ModelInferResponse.FromString(acodec.to_grpc(body, n, False))
    assert not resp.raw_output_contents
    got = list(getattr(resp.outputs[0].contents, CONTENTS_FIELD[datatype]))
    assert got == pytest.approx(values) if datatype.startswith("FP") else got == values


def test_typed_bytes_outputs_and_fp16_which_has_none() -> None:
    body, n = answer([("s", "BYTES", [1, 2], lengths([b"hi", b""]))])
    resp = service_pb2.ModelInferResponse.FromString(acodec.to_grpc(body, n, False))
    assert list(resp.outputs[0].contents.bytes_contents) == [b"hi", b""]
    half = np.ones(2, dtype="<f2")
    body, n = answer([("h", "FP16", [1, 2], half.tobytes())])
    assert service_pb2.ModelInferResponse.FromString(
        acodec.to_grpc(body, n, True)
    ).raw_output_contents == [half.tobytes()]
    with pytest.raises(codec.CodecError, match="output 'h': 'FP16' has no typed contents"):
        acodec.to_grpc(body, n, False)


def test_json_data_outputs_are_made_raw() -> None:
    """A backend that answers JSON data (it ignored binary_data) is still translated."""
    body = json.dumps(
        {
            "model_name": "m",
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [[1.5, -2.0]]},
                {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["ab"]},
            ],
        }
    ).encode()
    resp = service_pb2.ModelInferResponse.FromString(acodec.to_grpc(body, None, True))
    assert list(resp.raw_output_contents) == [
        np.array([1.5, -2.0], dtype="<f4").tobytes(),
        lengths([b"ab"]),
    ]


CUT = (
    b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "parameters": '
    b'{"binary_data_size": 8}}]}'
)


@pytest.mark.parametrize(
    ("body", "n", "message"),
    [
        (b"not json", None, "its JSON is not valid"),
        (b"[]", None, "its JSON is not an object"),
        (b'{"outputs": 3}', None, "outputs: not a list"),
        (b'{"model_name": 3, "outputs": []}', None, "model_name: not a string"),
        (b'{"outputs": [3]}', None, "outputs[0]: not an object"),
        (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": "x", "data": []}]}', None,
         "output 'y': shape is not a list of integers"),
        (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}', None,
         "output 'y': neither data nor binary_data_size"),
        (b'{"outputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": ["a"]}]}',
         None, "output 'y': data does not fit FP32"),
        (b'{"outputs": [{"name": "y", "datatype": "BF16", "shape": [1], "data": [1]}]}',
         None, "output 'y': 'BF16' given as JSON data"),
        (CUT + b"abcd", str(len(CUT)), "its 8 bytes run past the body's end"),
        (b'{"outputs": []}xyz', "15", "3 bytes beyond its outputs"),
        (b'{"outputs": []}', "99", "is not within its body's 15 bytes"),
        (b'{"outputs": []}', "abc", "is not within"),
        (b'{"outputs": [], "parameters": [1]}', None, "parameters: not an object"),
    ],
)  # fmt: skip
def test_an_answer_that_is_not_an_inference_response_is_a_bad_answer(
    body: bytes, n: str | None, message: str
) -> None:
    with pytest.raises(acodec.BadAnswer) as err:
        acodec.to_grpc(body, n, True)
    assert message in str(err.value)


def test_cut_bytes_elements_and_misaligned_typed_outputs_are_bad_answers() -> None:
    body, n = answer([("s", "BYTES", [1], struct.pack("<I", 9) + b"ab")])
    with pytest.raises(acodec.BadAnswer, match="runs past"):
        acodec.to_grpc(body, n, False)
    body, n = answer([("y", "FP32", [1], b"abc")])
    with pytest.raises(acodec.BadAnswer, match="3 bytes are no FP32 tensor"):
        acodec.to_grpc(body, n, False)


def test_error_messages() -> None:
    assert acodec.error_message(b'{"error": "queue-full: model m"}', 429) == "queue-full: model m"
    assert acodec.error_message(b"<html>oops</html>", 502) == "HTTP status 502: <html>oops</html>"
    assert acodec.error_message(b"", 500) == "HTTP status 500"
    assert acodec.error_message(b'{"error": {"x": 1}}', 500).startswith("HTTP status 500: {")
    assert len(acodec.error_message(b"x" * 10_000, 500)) < 600


def test_parameter_values() -> None:
    p = service_pb2.InferParameter()
    assert codec.parameter_value(p) is None
    p.double_param = math.inf
    assert codec.parameter_value(p) == "inf"
    p.double_param = 2.0
    assert codec.parameter_value(p) == 2.0


# -- the worker reads what the codec writes ----------------------------------------------------
SIG = ModelSignature(
    "m",
    "1",
    (TensorSpec("a", "FP32", (-1,)), TensorSpec("b", "INT64", (2,)), TensorSpec("c", "BOOL", ())),
    (TensorSpec("y", "FP32", (2,)),),
    max_batch_size=8,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 8),
    width=st.integers(1, 5),
    typed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    priority=st.integers(-(2**31), 2**31 - 1),
)
def test_the_worker_parses_the_translation_into_the_same_tensors(
    rows: int, width: int, typed: bool, seed: int, priority: int
) -> None:
    """Random tensors sent raw or typed: the worker's HTTP parser (the binary extension)
    reads back exactly the arrays, the class and the outputs asked for."""
    rng = np.random.default_rng(seed)
    arrays = {
        "a": rng.standard_normal((rows, width)).astype(np.float32),
        "b": rng.integers(-(2**62), 2**62, size=(rows, 2)),
        "c": rng.integers(0, 2, size=(rows,)).astype(bool),
    }
    req = request(id="r")
    for name, arr in arrays.items():
        dt = {"a": "FP32", "b": "INT64", "c": "BOOL"}[name]
        t = req.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
        if typed:
            getattr(t.contents, CONTENTS_FIELD[dt]).extend(arr.reshape(-1).tolist())
        else:
            req.raw_input_contents.append(arr.astype(DATATYPES[dt].newbyteorder("<")).tobytes())
    req.parameters["priority"].int64_param = priority
    req.outputs.add(name="y")
    http = codec.to_http(req)
    parsed = kserve.parse_infer_request(http.body, http.header_length, SIG)
    assert parsed.id == "r" and parsed.items == rows and parsed.priority == priority
    for name, arr in arrays.items():
        assert np.array_equal(parsed.inputs[name], arr)
    assert [(o.name, o.binary) for o in parsed.outputs] == [("y", True)]


# -- raw contents read as slices of the request's bytes ---------------------------------------
def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (sizes under 128)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


@settings(max_examples=80, deadline=None)
@given(
    inputs=st.lists(st.binary(max_size=40), max_size=5),
    name=st.text(max_size=20),
    unknown=st.binary(max_size=8),
    typed=st.booleans(),
)
def test_raw_contents_are_slices_and_the_rest_parses_as_the_whole(
    inputs: list[bytes], name: str, unknown: bytes, typed: bool
) -> None:
    req = request(name, id="i")
    for i, blob in enumerate(inputs):
        t = req.inputs.add(name=f"x{i}", datatype="UINT8", shape=[1, len(blob)])
        if typed:
            t.contents.uint_contents.extend(blob)
        else:
            req.raw_input_contents.append(blob)
    req.parameters["p"].int64_param = 3
    # An unknown field between the raw contents, and field 7 before model_name.
    raw = bytes(req.SerializeToString()) + _field(15, unknown) + _field(7, b"tail")
    raw = _field(7, b"head") + raw
    whole = service_pb2.ModelInferRequest.FromString(raw)
    got, raws = codec.parse_request(raw)
    assert [bytes(r) for r in raws] == list(whole.raw_input_contents)
    assert all(isinstance(r, memoryview) for r in raws)
    got.raw_input_contents.extend(bytes(r) for r in raws)
    assert got == whole
    assert _outcome(*codec.parse_request(raw)) == _outcome(whole)
    # Without the extra raw contents the counts agree and the request translates.
    clean = bytes(req.SerializeToString())
    assert _outcome(*codec.parse_request(clean)) == _outcome(req)


def _outcome(req: Any, raws: Any = None) -> bytes | str:
    """The translated body, or the refusal's message."""
    try:
        return codec.to_http(req, raws).body
    except codec.CodecError as exc:
        return str(exc)


@given(st.binary(max_size=64))
def test_the_split_agrees_with_protobuf_on_any_bytes(raw: bytes) -> None:
    try:
        want = service_pb2.ModelInferRequest.FromString(raw)
    except Exception:  # DecodeError
        want = None
    try:
        got, raws = codec.parse_request(raw)
    except codec.CodecError:
        assert want is None
        return
    assert want is not None
    assert [bytes(r) for r in raws] == list(want.raw_input_contents)
    got.ClearField("raw_input_contents")
    got.raw_input_contents.extend(bytes(r) for r in raws)
    assert got == want


def test_requests_the_split_cannot_judge_are_parsed_whole() -> None:
    many = request("m")
    for i in range(codec.MAX_SPLIT_FIELDS):
        many.raw_input_contents.append(bytes([i % 256]))
    raw = bytes(many.SerializeToString())
    assert codec.split_request(raw) is None
    _, raws = codec.parse_request(raw)
    assert [bytes(r) for r in raws] == list(many.raw_input_contents)
    # Field 7 as a varint: protobuf keeps it as an unknown field, no raw contents.
    assert codec.split_request(b"\x38\x01") is None
    assert codec.parse_request(b"\x38\x01")[1] == []
