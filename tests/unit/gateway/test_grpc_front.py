"""The gateway's gRPC front's pure rules: the deadline it forwards, what counts as refused."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from evenserve.gateway.grpc_status import deadline_ms, forward_metadata


@pytest.mark.parametrize(
    ("header", "remaining_s", "want"),
    [
        (None, None, None),  # no deadline at all
        ("250", None, "250"),  # the client's header alone
        (None, 1.5, "1500.000"),  # the gRPC deadline alone
        ("250", 1.5, "250"),  # the header is sooner
        ("5000", 1.5, "1500.000"),  # the gRPC deadline is sooner
        ("soon", 1.5, "soon"),  # not a number: the worker refuses it
        (None, 10.0 * 365 * 86400, None),  # grpcio's "no deadline"
        (None, -0.5, "0.001"),  # already past: the smallest deadline, refused downstream
    ],
)
def test_deadline_is_the_sooner_of_header_and_grpc_deadline(
    header: str | None, remaining_s: float | None, want: str | None
) -> None:
    assert deadline_ms(header, remaining_s) == want


def test_forward_metadata_keeps_the_class_and_adds_the_deadline() -> None:
    meta = {"x-evenserve-priority": "high", "other": "x"}
    assert forward_metadata(meta, 2.0) == (
        ("x-evenserve-priority", "high"),
        ("x-evenserve-deadline-ms", "2000.000"),
    )
    assert forward_metadata({}, None) == ()


# -- the model name read from a request's bytes -----------------------------------------------
from google.protobuf.message import DecodeError  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tritonclient.grpc import service_pb2  # noqa: E402

from evenserve.gateway.grpc_wire import MAX_SCANNED_FIELDS, model_name_of  # noqa: E402
from evenserve.httpio.grpc_service import methods, service_handlers  # noqa: E402


def _request(name: str, inputs: int = 1) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name=name, model_version="1", id="r")
    for i in range(inputs):
        req.inputs.add(name=f"in{i}", datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(bytes(16))
    req.parameters["priority"].int64_param = 3
    return req


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (sizes under 128)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_model_name_is_read_without_parsing_the_request() -> None:
    assert model_name_of(_request("resnet50").SerializeToString()) == "resnet50"
    assert model_name_of(b"") == ""  # every field absent: protobuf's empty name
    # Fields in any order; the last model_name wins, as protobuf's own parse says.
    raw = _field(7, bytes(16)) + _field(1, b"first") + _field(3, b"id") + _field(1, b"second")
    assert service_pb2.ModelInferRequest.FromString(raw).model_name == "second"
    assert model_name_of(raw) == "second"
    # Unknown fields of every wire type are skipped.
    raw = b"\x98\x06\x05" + b"\xa1\x06" + bytes(8) + b"\xad\x06" + bytes(4) + _field(1, b"m")
    assert model_name_of(raw) == "m" == service_pb2.ModelInferRequest.FromString(raw).model_name


def test_requests_the_walk_cannot_judge_are_parsed_whole() -> None:
    many = _request("bert", inputs=MAX_SCANNED_FIELDS)  # more fields than the walk reads
    assert model_name_of(many.SerializeToString()) == "bert"
    group = b"\xa3\x06\xa4\x06" + _field(1, b"g")  # an (empty) group: protobuf skips it
    assert model_name_of(group) == "g" == service_pb2.ModelInferRequest.FromString(group).model_name
    # model_name as a varint: protobuf keeps it as an unknown field, the name stays empty.
    assert model_name_of(b"\x08\x01" + _field(3, b"id")) == ""


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x05ab",  # model_name cut short
        b"\x0a",  # a tag and nothing else
        b"\x0a\x02\xff\xfe",  # a name that is not UTF-8
        b"\x02\x00",  # field 0
        b"\x82\x80\x80\x80\x10\x00",  # a field number over 2**29 - 1
        b"\xff" * 11,  # a varint longer than 10 bytes
    ],
)
def test_bytes_that_are_not_a_request_are_refused(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        service_pb2.ModelInferRequest.FromString(raw)
    with pytest.raises(ValueError, match="not a ModelInferRequest"):
        model_name_of(raw)


@given(st.binary(max_size=64))
def test_the_walk_agrees_with_protobuf_on_any_bytes(raw: bytes) -> None:
    """Bytes protobuf parses give its name; bytes the walk refuses, protobuf refuses too
    (the walk may read a name in bytes malformed further in: the backend refuses those)."""
    try:
        want: str | None = service_pb2.ModelInferRequest.FromString(raw).model_name
    except DecodeError:
        want = None
    try:
        got: str | None = model_name_of(raw)
    except ValueError:
        got = None
    if want is not None or got is None:
        assert got == want


@given(st.text(max_size=300), st.integers(0, 3))
def test_the_walk_reads_any_name(name: str, inputs: int) -> None:
    assert model_name_of(_request(name, inputs).SerializeToString()) == name


# -- the service's handler table --------------------------------------------------------------
def test_every_rpc_has_a_handler_and_unknown_names_are_refused() -> None:
    async def serve(request: object, context: object) -> None:
        return None

    table = service_handlers({"ModelInfer": serve, "ServerLive": serve}, raw=("ModelInfer",))
    assert set(table) == {m.name for m in methods()}
    assert table["ModelInfer"].response_serializer is None  # bytes in, bytes out
    assert table["ServerLive"].response_serializer is not None  # parsed in the handler
    assert table["ModelStreamInfer"].request_streaming  # answered UNIMPLEMENTED, as a stream
    with pytest.raises(ValueError, match="ModelInfre"):
        service_handlers({"ModelInfre": serve})
    with pytest.raises(ValueError, match="ServerLive"):
        service_handlers({}, raw=("ServerLive",))


# -- an HTTP answer as the gRPC answer (the relayed path's HTTP hosts) --------------------------
import grpc  # noqa: E402
import numpy as np  # noqa: E402

from evenserve.gateway.forwarder import Reply  # noqa: E402
from evenserve.gateway.grpc_status import CODE_OF_STATUS, code_of, grpc_reply  # noqa: E402


def _binary_answer(datatype: str, blob: bytes) -> Reply:
    head = (
        b'{"model_name": "m", "outputs": [{"name": "y", "datatype": "%s", "shape": [1, 2], '
        b'"parameters": {"binary_data_size": %d}}]}' % (datatype.encode(), len(blob))
    )
    headers = {"inference-header-content-length": str(len(head))}
    return Reply(200, headers, head + blob)


def test_an_http_answer_becomes_a_grpc_reply_the_dispatcher_judges() -> None:
    y = np.array([1.5, 2.5], dtype="<f4").tobytes()
    got = grpc_reply(_binary_answer("FP32", y), True, "b0")
    assert (got.status, got.code) == (200, grpc.StatusCode.OK)
    assert list(service_pb2.ModelInferResponse.FromString(got.response).raw_output_contents) == [y]
    half = grpc_reply(_binary_answer("FP16", bytes(4)), False, "b0")
    assert (half.status, half.code) == (200, grpc.StatusCode.INVALID_ARGUMENT)
    assert "'FP16' has no typed contents" in half.message
    bad = grpc_reply(Reply(200, {}, b"<html>"), True, "b0")
    assert bad.code == grpc.StatusCode.INTERNAL and bad.message.startswith("backend b0 ")
    full = grpc_reply(
        Reply(
            429,
            {"x-evenserve-reason": "queue-full", "retry-after": "2"},
            b'{"error": "queue-full: model m"}',
        ),
        True,
        "b0",
    )
    assert (full.status, full.reason, full.code) == (
        429,
        "queue-full",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    assert full.message == "queue-full: model m"
    assert dict(full.trailing) == {"x-evenserve-reason": "queue-full", "retry-after": "2"}


def test_every_http_status_has_the_workers_grpc_status() -> None:
    assert code_of(503) == grpc.StatusCode.UNAVAILABLE
    assert code_of(418) == code_of(502) == grpc.StatusCode.INTERNAL
    assert {s: c.name for s, c in CODE_OF_STATUS.items()} == {
        400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED",
        422: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED",
        503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
    }  # fmt: skip
