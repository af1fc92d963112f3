"""The gateway's gRPC answer codec: a backend's v2 HTTP answer as the ModelInferResponse.

The other half of ``grpc_codec`` (which makes ModelInfer a v2 HTTP request), pure functions
over bytes and messages (no I/O):

- ``to_grpc``: a backend's 200 answer (JSON header, binary outputs after it) as a serialized
  ``ModelInferResponse``: model name and version, id, parameters, each output's name,
  datatype, shape and parameters (``binary_data_size`` dropped), its data as
  ``raw_output_contents`` or as typed ``contents`` as the client asked (FP16 and BF16 have
  no typed contents: a CodecError, as the worker answers). An output a backend sent as JSON
  ``data`` is made raw. An answer that is not a v2 inference response is a ``BadAnswer``
  (the front answers INTERNAL naming the backend).
- ``error_message``: the message of a refusal's body (``{"error": ...}``).

The HTTP status of a refusal becomes the gRPC status the worker's own gRPC front gives for
it (``grpc_status.CODE_OF_STATUS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2

from evenserve.core import wire
from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES
from evenserve.gateway.grpc_codec import (
    ELEMENT_LENGTH,
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    CodecError,
)

#: The longest error message kept from a backend's body that is not ``{"error": ...}``.
MAX_MESSAGE_CHARS = 512


class BadAnswer(ValueError):
    """A backend's 200 answer that is not a v2 inference response (INTERNAL)."""


def to_grpc(body: bytes | memoryview, header_length: str | None, raw_outputs: bool) -> bytes:
    """A backend's 200 answer to an inference request (its body, and its
    ``Inference-Header-Content-Length``: None when the body is JSON alone) as a serialized
    ModelInferResponse; CodecError when it cannot be given as asked (typed contents of FP16),
    BadAnswer when it is not a v2 inference response."""
    size = len(body)
    if header_length is None:
        n = size
    else:
        text = header_length.strip()
        if not text.isdigit() or not 0 < int(text) <= size:
            raise BadAnswer(
                f"{wire.HEADER_LENGTH_HEADER} {wire.shown(header_length)} is not within its "
                f"body's {size} bytes"
            )
        n = int(text)
    try:
        head = orjson.loads(body[:n])
    except orjson.JSONDecodeError as exc:
        raise BadAnswer(f"its JSON is not valid: {exc}") from None
    if not isinstance(head, dict):
        raise BadAnswer("its JSON is not an object")
    resp = service_pb2.ModelInferResponse()
    for key in ("model_name", "model_version", "id"):
        v = head.get(key)
        if v is None:
            continue
        if not isinstance(v, str):
            raise BadAnswer(f"{key}: not a string")
        setattr(resp, key, v)
    _set_parameters(resp.parameters, head.get("parameters"), "parameters")
    outputs = head.get("outputs")
    if not isinstance(outputs, list):
        raise BadAnswer("outputs: not a list")
    offset = n
    for i, o in enumerate(outputs):
        if not isinstance(o, dict):
            raise BadAnswer(f"outputs[{i}]: not an object")
        name, datatype, shape = o.get("name"), o.get("datatype"), o.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise BadAnswer(f"outputs[{i}]: name and datatype must be strings")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and INT64_MIN <= d <= INT64_MAX
            for d in shape
        ):
            raise BadAnswer(f"output {wire.shown(name)}: shape is not a list of integers")
        op = o.get("parameters") or {}
        if not isinstance(op, dict):
            raise BadAnswer(f"output {wire.shown(name)}: parameters is not an object")
        op = dict(op)
        nbytes = op.pop("binary_data_size", None)
        if nbytes is not None:
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise BadAnswer(f"output {wire.shown(name)}: binary_data_size is not a size")
            if offset + nbytes > size:
                raise BadAnswer(
                    f"output {wire.shown(name)}: its {nbytes} bytes run past the body's end"
                )
            blob: bytes | memoryview = body[offset : offset + nbytes]
            offset += nbytes
        elif "data" in o:
            blob = json_data_bytes(name, datatype, o["data"])
        else:
            raise BadAnswer(f"output {wire.shown(name)}: neither data nor binary_data_size")
        out = resp.outputs.add(name=name, datatype=datatype, shape=shape)
        _set_parameters(out.parameters, op, f"output {wire.shown(name)}: parameters")
        if raw_outputs:
            resp.raw_output_contents.append(bytes(blob))
        else:
            typed_contents(out.contents, name, datatype, blob)
    if offset != size:
        raise BadAnswer(f"{size - offset} bytes beyond its outputs")
    return bytes(resp.SerializeToString())


def _set_parameters(target: Any, params: Any, where: str) -> None:
    """JSON ``params`` into an InferParameter map (values no parameter can hold are left
    out: an object, a list, null)."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise BadAnswer(f"{where}: not an object")
    for k, v in params.items():
        if isinstance(v, bool):
            target[k].bool_param = v
        elif isinstance(v, int):
            if INT64_MIN <= v <= INT64_MAX:
                target[k].int64_param = v
            elif 0 <= v <= UINT64_MAX:
                target[k].uint64_param = v
        elif isinstance(v, float):
            target[k].double_param = v
        elif isinstance(v, str):
            target[k].string_param = v


def json_data_bytes(name: str, datatype: str, data: Any) -> bytes:
    """An output a backend gave as JSON ``data`` (flat or nested) as raw bytes; BadAnswer when
    the data does not fit the datatype."""
    dtype = DATATYPES.get(datatype)
    if dtype is None and datatype != "BYTES":
        raise BadAnswer(f"output {wire.shown(name)}: {wire.shown(datatype)} given as JSON data")
    try:
        if dtype is None:  # BYTES: strings (UTF-8) or lists of byte values
            flat = np.asarray(data, dtype=object).reshape(-1)
            parts = [v.encode() if isinstance(v, str) else bytes(v) for v in flat]
            return b"".join(ELEMENT_LENGTH.pack(len(p)) + p for p in parts)
        arr = np.asarray(data, dtype=dtype)
        return arr.astype(dtype.newbyteorder("<"), copy=False).tobytes()
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadAnswer(f"output {wire.shown(name)}: data does not fit {datatype}: {exc}") from None


def typed_contents(contents: Any, name: str, datatype: str, blob: bytes | memoryview) -> None:
    """An output's raw bytes into typed ``contents``; CodecError for a datatype that has none
    (FP16, BF16), BadAnswer when the bytes do not fit the datatype."""
    if datatype == "BYTES":
        contents.bytes_contents.extend(split_bytes(name, blob))
        return
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise CodecError(
            f"output {wire.shown(name)}: {wire.shown(datatype)} has no typed contents; "
            "ask for raw contents"
        )
    dtype = DATATYPES[datatype]
    if len(blob) % dtype.itemsize:
        raise BadAnswer(f"output {wire.shown(name)}: {len(blob)} bytes are no {datatype} tensor")
    values = np.frombuffer(blob, dtype=dtype.newbyteorder("<")).tolist()
    getattr(contents, field).extend(values)


def split_bytes(name: str, blob: bytes | memoryview) -> list[bytes]:
    """A BYTES tensor's raw bytes as its elements; BadAnswer when they are cut."""
    out: list[bytes] = []
    data = bytes(blob)
    i, end = 0, len(data)
    while i < end:
        if i + 4 > end:
            raise BadAnswer(f"output {wire.shown(name)}: BYTES element length cut short")
        (n,) = ELEMENT_LENGTH.unpack_from(data, i)
        i += 4
        if i + n > end:
            raise BadAnswer(f"output {wire.shown(name)}: BYTES element runs past the data")
        out.append(data[i : i + n])
        i += n
    return out


def error_message(body: bytes | memoryview, status: int) -> str:
    """A refusal's message: its body's ``error`` (``{"error": "..."}``, as the worker, the
    gateway, Triton and MLServer write it), else the status and the body's start."""
    try:
        err = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        err = None
    if isinstance(err, str):
        return err
    text = bytes(body[:MAX_MESSAGE_CHARS]).decode("utf-8", "replace").strip()
    return f"HTTP status {status}" + (f": {text}" if text else "")
