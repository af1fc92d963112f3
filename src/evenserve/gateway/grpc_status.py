"""A gRPC call and its HTTP counterpart, both ways: statuses, metadata, the deadline.

The gateway's gRPC front judges and answers through the HTTP data plane: a backend's gRPC
status is judged as its HTTP counterpart (``HTTP_OF``, ``http_status``: UNAVAILABLE as 503,
RESOURCE_EXHAUSTED with a reason as 429), an HTTP answer goes back as the gRPC status the
worker's own gRPC front gives for it (``CODE_OF_STATUS``) with ``TRAILING_HEADERS`` as
trailing metadata, and the client's class metadata and gRPC deadline go as the
``x-evenserve-priority`` and ``x-evenserve-deadline-ms`` headers (``deadline_ms``: the
sooner of the deadline and the client's own header).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc

from evenserve.core import wire
from evenserve.gateway import grpc_answer
from evenserve.gateway import grpc_codec as codec
from evenserve.gateway.answers import Answer, GrpcReply
from evenserve.gateway.forwarder import Reply, ResponseTimeout, Unreachable
from evenserve.httpio.client import parse_headers

S = grpc.StatusCode


#: The HTTP counterpart of a backend's gRPC status, for the dispatcher's rules.
HTTP_OF = {
    S.OK: 200,
    S.INVALID_ARGUMENT: 400,
    S.NOT_FOUND: 404,
    S.UNAVAILABLE: 503,
    S.DEADLINE_EXCEEDED: 504,
    S.UNIMPLEMENTED: 501,
}


#: The gRPC status of an HTTP answer (a backend's or the gateway's own), as the worker's gRPC
#: front gives it for the same refusal (``worker.grpc_api``); any other status is INTERNAL.
CODE_OF_STATUS = {
    400: S.INVALID_ARGUMENT,
    404: S.NOT_FOUND,
    413: S.RESOURCE_EXHAUSTED,  # over the size limit (grpcio's own answer for a message)
    422: S.INVALID_ARGUMENT,  # a request a server's schema refused (FastAPI's, MLServer's)
    429: S.RESOURCE_EXHAUSTED,
    501: S.UNIMPLEMENTED,
    503: S.UNAVAILABLE,
    504: S.DEADLINE_EXCEEDED,
}


#: The response headers of an HTTP answer that go back as trailing metadata (with
#: ``x-evenserve-backend``), as the worker's gRPC front sends them.
TRAILING_HEADERS = (wire.REASON_HEADER, wire.RETRY_AFTER_HEADER, wire.LOAD_WAIT_HEADER)


#: The headers of an HTTP answer the front reads: those, and the binary extension's length.
READ_HEADERS = frozenset(h.encode() for h in (*TRAILING_HEADERS, codec.HEADER_LENGTH))


#: A client deadline further than this (seconds) is no deadline (grpcio's "infinite").
NO_DEADLINE_S = 365 * 86400.0


def deadline_ms(header: str | None, remaining_s: float | None) -> str | None:
    """The ``x-evenserve-deadline-ms`` to forward: the client's gRPC deadline (its remaining
    time, ``context.time_remaining()``) or the client's header, whichever is sooner; a header
    that is not a number is forwarded as it is, for the worker to refuse."""
    if remaining_s is None or remaining_s >= NO_DEADLINE_S:
        return header
    ms = max(remaining_s * 1000.0, 0.001)
    if header is not None:
        try:
            given = float(header.strip())
        except ValueError:
            return header
        if not given < ms:
            return f"{ms:.3f}"
        return header
    return f"{ms:.3f}"


def code_of(status: int) -> Any:
    """The gRPC status of an HTTP answer's status (``CODE_OF_STATUS``)."""
    return CODE_OF_STATUS.get(status, S.INTERNAL)


def metadata_value(value: str) -> bool:
    """Whether ``value`` can go as (ASCII) gRPC metadata or an HTTP header value as it is."""
    return value.isascii() and value.isprintable()


def http_headers(
    meta: Mapping[str, str], remaining_s: float | None, header_length: int
) -> dict[str, str]:
    """The HTTP request headers of a ModelInfer translated (``grpc_codec.to_http``): the
    binary extension's, and the client's class and deadline metadata (``deadline_ms``: its
    gRPC deadline counts). ValueError naming a metadata value an HTTP header cannot carry."""
    headers = {
        "content-type": codec.BINARY_CONTENT_TYPE,
        codec.HEADER_LENGTH: str(header_length),
    }
    priority = meta.get(wire.PRIORITY_HEADER)
    deadline = deadline_ms(meta.get(wire.DEADLINE_HEADER), remaining_s)
    for key, value in ((wire.PRIORITY_HEADER, priority), (wire.DEADLINE_HEADER, deadline)):
        if value is None:
            continue
        if not metadata_value(value):
            raise ValueError(f"metadata {key}: not printable ASCII: {wire.shown(value)}")
        headers[key] = value
    return headers


def answer_headers(ans: Answer) -> Mapping[str, str]:
    """The headers of an answer the front reads (``READ_HEADERS``), in one pass over a
    relayed answer's head (``Answer.header`` reads it for each name)."""
    if ans.raw is not None:
        return parse_headers(ans.head, READ_HEADERS)
    return ans.headers


def trailing_of(header: Any, backend: str | None) -> list[tuple[str, str]]:
    """The trailing metadata of an HTTP answer: ``TRAILING_HEADERS`` it has (``header``: the
    answer's header lookup), and the backend that answered."""
    out = []
    for key in TRAILING_HEADERS:
        value = header(key)
        if value is not None and metadata_value(value):
            out.append((key, value))
    if backend is not None:
        out.append((wire.BACKEND_HEADER, backend))
    return out


def connect_refused(exc: Any) -> bool:
    """A backend call that failed because the backend refused the connection."""
    return exc.code() == S.UNAVAILABLE and "connection refused" in (exc.details() or "").lower()


def http_status(code: Any, reason: str | None) -> int:
    if code == S.RESOURCE_EXHAUSTED:  # a refusal (429); without a reason, over the size limit
        return 429 if reason else 413
    return HTTP_OF.get(code, 500)


def forward_metadata(
    meta: Mapping[str, str], remaining_s: float | None
) -> tuple[tuple[str, str], ...]:
    """The request metadata forwarded to the backend: the class, and the deadline
    (``deadline_ms``)."""
    out = (
        [(wire.PRIORITY_HEADER, meta[wire.PRIORITY_HEADER])] if wire.PRIORITY_HEADER in meta else []
    )
    deadline = deadline_ms(meta.get(wire.DEADLINE_HEADER), remaining_s)
    if deadline is not None:
        out.append((wire.DEADLINE_HEADER, deadline))
    return tuple(out)


def backend_failure(exc: Any) -> GrpcReply:
    """A backend's failed ModelInfer call as the dispatcher judges it: a GrpcReply with the
    backend's status, message and trailing metadata; raises Unreachable when the connection
    was refused (the request never reached it), ResponseTimeout when our own time limit ran
    out (a DEADLINE_EXCEEDED without the worker's reason)."""
    if connect_refused(exc):
        raise Unreachable("connect-refused")
    trailing = tuple((k, v) for k, v in exc.trailing_metadata() or () if isinstance(v, str))
    reason = dict(trailing).get(wire.REASON_HEADER)
    if exc.code() == S.DEADLINE_EXCEEDED and reason is None:
        raise ResponseTimeout("timeout")
    return GrpcReply(
        http_status(exc.code(), reason), reason, exc.code(), exc.details() or "", trailing
    )


def no_version(model: str, version: str) -> str:
    """A version no HTTP route can name (``wire.is_safe_name``): no backend has it."""
    return f"model {model!r} has no version {wire.shown_name(version)}"


def bad_answer(backend: str | None, exc: Exception) -> str:
    return f"backend {backend} answered what is not a v2 inference response: {exc}"


def grpc_reply(reply: Reply, raw_outputs: bool, name: str) -> GrpcReply:
    """Backend ``name``'s HTTP answer to a translated ModelInfer as the dispatcher judges a
    gRPC one: the HTTP status, the reason, the gRPC status and message, the trailing
    metadata, and for a 200 the ModelInferResponse's bytes."""
    headers = parse_headers(reply.head) if reply.head else reply.headers
    trailing = tuple(trailing_of(headers.get, None))
    status = reply.status
    if status != 200:
        message = grpc_answer.error_message(reply.body, status)
        reason = headers.get(wire.REASON_HEADER)
        return GrpcReply(status, reason, code_of(status), message, trailing)
    try:
        response = grpc_answer.to_grpc(reply.body, headers.get(codec.HEADER_LENGTH), raw_outputs)
    except codec.CodecError as exc:
        return GrpcReply(200, None, S.INVALID_ARGUMENT, str(exc), trailing)
    except grpc_answer.BadAnswer as exc:
        return GrpcReply(200, None, S.INTERNAL, bad_answer(name, exc), trailing)
    return GrpcReply(200, None, S.OK, "", trailing, response)
