"""The gateway's gRPC request codec: ModelInfer as a KServe v2 HTTP request.

The gateway's gRPC front (``grpc_front``) takes ModelInfer from its clients and sends it to a
backend over the same HTTP data plane as an HTTP inference request (the dispatcher's fast
path, the pooled HTTP clients), so only the client-facing side pays for grpcio. This module
is the translation, pure functions over messages and bytes (no I/O):

- ``to_http``: a ``ModelInferRequest`` as a v2 HTTP request with the binary tensor
  extension: a JSON header naming each input with ``parameters.binary_data_size``, then the
  inputs' raw little-endian bytes in order (``Inference-Header-Content-Length`` gives the
  header's length), every output asked for as binary (``binary_data: true``, and
  ``binary_data_output: true`` for a request that names none). Inputs given as
  ``raw_input_contents`` go as they came; inputs given as typed ``contents`` are made raw
  here (numpy; BYTES as the extension's 4-byte length before each element). Request, input
  and output ``parameters`` go as JSON values (a non-finite double as its text, ``nan``,
  ``inf``: JSON has no such number, and every parameter the worker reads refuses it so);
  ``id`` goes as it is. The request is checked as the worker's gRPC front checks what the
  HTTP request cannot carry (``worker.grpc_codec.parse_grpc_request``): raw contents for every
  input or none, typed contents in the field of the input's datatype and as many as its
  shape needs, ``binary_data_output`` and each output's ``binary_data`` booleans, the same
  for every output. A ``CodecError`` (INVALID_ARGUMENT) names the field otherwise. Whether
  the client wants its outputs raw (``raw_output_contents``, the default) or typed is kept
  with the request (``HttpInfer.raw_outputs``).

The answer's way back (a v2 HTTP answer as the ModelInferResponse, a refusal's message) is
``grpc_answer``; the model name of a request relayed as bytes, ``grpc_wire``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from evenserve.core import wire
from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES, contents_error

BINARY_CONTENT_TYPE = "application/octet-stream"
HEADER_LENGTH = wire.HEADER_LENGTH_HEADER.lower()
#: BYTES elements on the wire (binary extension and raw gRPC contents alike): a 4-byte
#: little-endian length before each.
ELEMENT_LENGTH = struct.Struct("<I")
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class CodecError(ValueError):
    """A request the gateway cannot translate, or a response it cannot give as the client
    asked: INVALID_ARGUMENT, the message naming the field."""


@dataclass(slots=True)
class HttpInfer:
    """One ModelInfer as the HTTP request to forward."""

    #: The inference path (``/v2/models/{m}[/versions/{v}]/infer``, names percent-encoded).
    path: str
    body: bytes
    #: The length of the JSON header at the start of ``body``.
    header_length: int
    #: The client wants ``raw_output_contents`` (else typed ``contents``).
    raw_outputs: bool


#: ``ModelInferRequest.raw_input_contents``'s field number.
RAW_INPUT_CONTENTS = 7
#: Top-level fields of a request walked to find its raw contents (``split_request``); a
#: request with more is parsed whole.
MAX_SPLIT_FIELDS = 256
#: protobuf's largest field number.
MAX_FIELD_NUMBER = 2**29 - 1

#: Raw input contents: the bytes of each input, as slices of the request's own bytes.
Raws = list[bytes] | list[memoryview]


def parse_request(raw: bytes) -> tuple[Any, Raws]:
    """A serialized ModelInferRequest parsed, and its raw input contents: slices of ``raw``
    (``split_request``: protobuf parses the rest, a few hundred bytes, not a copy of every
    tensor), or, when the walk cannot tell, from protobuf's parse of the whole. CodecError
    when the bytes are not a ModelInferRequest."""
    split = split_request(raw)
    try:
        if split is not None and split[1]:
            rest, spans = split
            view = memoryview(raw)
            req = service_pb2.ModelInferRequest.FromString(rest)
            return req, [view[a:b] for a, b in spans]
        req = service_pb2.ModelInferRequest.FromString(raw)
    except DecodeError as exc:
        raise CodecError(f"the request is not a ModelInferRequest: {exc}") from None
    return req, list(req.raw_input_contents)


def varint(raw: bytes, i: int) -> tuple[int, int]:
    """The varint at ``raw[i:]`` and the offset after it; IndexError when cut, ValueError
    when longer than 10 bytes."""
    b = raw[i]
    if b < 0x80:
        return b, i + 1
    value = b & 0x7F
    for shift in range(7, 70, 7):
        i += 1
        b = raw[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i + 1
    raise ValueError("varint longer than 10 bytes")


def split_request(raw: bytes) -> tuple[bytes, list[tuple[int, int]]] | None:
    """A serialized ModelInferRequest's bytes without its ``raw_input_contents`` (field 7),
    and where each of those lies in ``raw`` (in order), from a walk over its top-level
    fields; None when the walk cannot tell: bytes that are not a well-formed message, field
    7 of another wire type (protobuf keeps it as an unknown field), a group, more than
    MAX_SPLIT_FIELDS fields. Every other field is kept as it came, so protobuf's parse of
    the rest reads what its parse of the whole would, less field 7."""
    end = len(raw)
    keep: list[bytes] = []
    spans: list[tuple[int, int]] = []
    start = i = 0
    try:
        for _ in range(MAX_SPLIT_FIELDS):
            if i == end:
                keep.append(raw[start:end])
                return b"".join(keep), spans
            at = i
            tag, i = varint(raw, i)
            field, kind = tag >> 3, tag & 7
            if not 0 < field <= MAX_FIELD_NUMBER:
                return None
            if kind == 2:
                size, i = varint(raw, i)
                if i + size > end:
                    return None
                if field == RAW_INPUT_CONTENTS:
                    keep.append(raw[start:at])
                    spans.append((i, i + size))
                    start = i + size
                i += size
            elif field == RAW_INPUT_CONTENTS:
                return None
            elif kind == 0:
                _, i = varint(raw, i)
            elif kind == 1 or kind == 5:
                i += 8 if kind == 1 else 4
                if i > end:
                    return None
            else:
                return None
    except (IndexError, ValueError):
        return None
    return None


def model_path(model: str, version: str, suffix: str) -> str:
    """The HTTP path of ``model`` (and ``version`` when not empty) and ``suffix`` (``infer``,
    ``config``, "" for its metadata), each name percent-encoded (a backend decodes it once):
    a name from a backend's repository index goes into a request line as a path segment."""
    out = wire.MODELS_PREFIX + quote(model, safe="")
    if version:
        out += "/versions/" + quote(version, safe="")
    return out + "/" + suffix if suffix else out


def infer_path(model: str, version: str) -> str:
    """The HTTP inference path of ``model`` (``model_path``)."""
    return model_path(model, version, "infer")


def parameter_value(p: Any) -> Any:
    """An ``InferParameter`` as a JSON value (None when unset; a non-finite double as its
    text, which JSON can carry)."""
    which = p.WhichOneof("parameter_choice")
    if which is None:
        return None
    v = getattr(p, which)
    if which == "double_param" and not math.isfinite(v):
        return repr(v)
    return v


def _parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: parameter_value(p) for k, p in params.items()}


def _binary_flag(value: Any, message: str) -> bool:
    if not isinstance(value, bool):
        raise CodecError(message)
    return value


def to_http(req: Any, raws: Raws | None = None) -> HttpInfer:
    """``req`` (a ModelInferRequest) as the HTTP request to forward (module docstring), with
    ``raws`` as its raw input contents (``parse_request``'s; default: ``req``'s own);
    CodecError naming the field when it cannot be."""
    params = _parameters(req.parameters)
    binary_default = True
    if "binary_data_output" in params:
        binary_default = _binary_flag(
            params["binary_data_output"], "parameters.binary_data_output: must be a boolean"
        )
    params["binary_data_output"] = True
    outputs: list[dict[str, Any]] = []
    kinds: set[bool] = set()
    for o in req.outputs:
        op = _parameters(o.parameters)
        binary = op.get("binary_data", binary_default)
        must = f"output {wire.shown(o.name)}: binary_data must be a boolean"
        kinds.add(_binary_flag(binary, must))
        op["binary_data"] = True
        outputs.append({"name": o.name, "parameters": op})
    if len(kinds) > 1:
        raise CodecError(
            "outputs: raw_output_contents are used for every output or for none "
            "(binary_data differs between outputs)"
        )
    raw_outputs = kinds.pop() if kinds else binary_default

    if raws is None:
        raws = list(req.raw_input_contents)
    n_inputs = len(req.inputs)
    if raws and len(raws) != n_inputs:
        raise CodecError(
            f"raw_input_contents: {len(raws)} given for {n_inputs} inputs "
            "(raw contents are given for every input or for none)"
        )
    inputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for i, t in enumerate(req.inputs):
        shape = list(t.shape)
        blob: bytes | memoryview
        if raws:
            if t.HasField("contents"):
                raise CodecError(
                    f"input {wire.shown(t.name)}: both contents and raw_input_contents given"
                )
            blob = raws[i]
        else:
            blob = typed_bytes(t.name, t.datatype, t.contents, shape)
        tp = _parameters(t.parameters)
        tp["binary_data_size"] = len(blob)
        inputs.append({"name": t.name, "datatype": t.datatype, "shape": shape, "parameters": tp})
        blobs.append(blob)
    head: dict[str, Any] = {}
    if req.id:
        head["id"] = req.id
    head["inputs"] = inputs
    if outputs:
        head["outputs"] = outputs
    head["parameters"] = params
    header = orjson.dumps(head)
    return HttpInfer(
        infer_path(req.model_name, req.model_version),
        b"".join((header, *blobs)),
        len(header),
        raw_outputs,
    )


def typed_bytes(name: str, datatype: str, contents: Any, shape: list[int]) -> bytes:
    """An input's typed ``contents`` as raw little-endian bytes (BYTES: each element after its
    4-byte length); CodecError naming the input when they do not fit its datatype or shape."""
    shown = wire.shown(name)
    if any(d < 0 for d in shape):
        raise CodecError(f"input {shown}: shape {wire.shown(shape)} has a negative dimension")
    field = "bytes_contents" if datatype == "BYTES" else CONTENTS_FIELD.get(datatype)
    if field is None:
        raise CodecError(
            f"input {shown}: {wire.shown(datatype)} has no typed contents; use raw_input_contents"
        )
    why = contents_error(contents, field, datatype, shape)
    if why is not None:
        raise CodecError(f"input {shown}: {why}")
    values = getattr(contents, field)
    if field == "bytes_contents":
        return b"".join(ELEMENT_LENGTH.pack(len(v)) + v for v in values)
    want = DATATYPES[datatype]
    if want.kind in "iu" and want.itemsize < 4:
        wide = np.array(values, dtype=np.int64)
        info = np.iinfo(want)
        if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
            raise CodecError(f"input {shown}: a value is out of range for {datatype}")
        arr = wide.astype(want)
    else:
        arr = np.array(values, dtype=want)
    return arr.astype(want.newbyteorder("<"), copy=False).tobytes()


# -- the answer --------------------------------------------------------------------------------
