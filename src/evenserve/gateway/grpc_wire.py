"""A ModelInferRequest's model name read from its bytes, without parsing the message.

The gateway relays ModelInfer as bytes to backends that take gRPC (``grpc_forward: grpc``)
and needs only the model name to route it: a walk over the message's top-level fields for
field 1, protobuf's parse only when the walk cannot tell.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from evenserve.gateway import grpc_codec as codec

#: Top-level fields of a ModelInferRequest walked to find its model_name before letting
#: protobuf parse it (in C) instead: a request has a handful (name, inputs, raw contents).
MAX_SCANNED_FIELDS = 64


MAX_FIELD_NUMBER = codec.MAX_FIELD_NUMBER


def _scan_model_name(raw: bytes) -> str | None:
    """Field 1 (``model_name``) of a serialized ModelInferRequest, from a walk over its
    top-level fields (each skipped by its length; the last field 1 wins, as in protobuf's own
    parse); None when the walk cannot tell: bytes that are not a well-formed message, a
    group, field 1 of another wire type (protobuf keeps it as an unknown field), more than
    MAX_SCANNED_FIELDS fields."""
    end = len(raw)
    i = 0
    name = b""
    try:
        for _ in range(MAX_SCANNED_FIELDS):
            if i == end:
                return name.decode()
            tag, i = codec.varint(raw, i)
            field, kind = tag >> 3, tag & 7
            if not 0 < field <= MAX_FIELD_NUMBER:
                return None
            if kind == 2:
                size, i = codec.varint(raw, i)
                if i + size > end:
                    return None
                if field == 1:
                    name = raw[i : i + size]
                i += size
            elif field == 1:  # model_name is a string: let protobuf judge
                return None
            elif kind == 0:
                _, i = codec.varint(raw, i)
            elif kind == 1 or kind == 5:
                i += 8 if kind == 1 else 4
                if i > end:
                    return None
            else:  # groups: let protobuf judge
                return None
    except (IndexError, ValueError):  # a cut varint, a name that is not UTF-8
        return None
    return name.decode() if i == end else None


def model_name_of(raw: bytes) -> str:
    """``model_name`` of a serialized ModelInferRequest, without parsing the message (a walk
    over its top-level fields), or from protobuf's parse when the walk cannot tell;
    ValueError when the bytes are not a ModelInferRequest. Not a validation: bytes malformed
    further in (an input's field) are the backend's to refuse, as it parses them whole."""
    name = _scan_model_name(raw)
    if name is not None:
        return name
    try:
        return str(service_pb2.ModelInferRequest.FromString(raw).model_name)
    except DecodeError as exc:
        raise ValueError(f"the request is not a ModelInferRequest: {exc}") from None
