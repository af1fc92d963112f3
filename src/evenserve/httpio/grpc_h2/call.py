"""One gRPC call as its handler sees it (``Call``: what grpcio's servicer context is to a
handler), and what gRPC puts in HTTP/2's headers: status codes, ``grpc-timeout``,
``grpc-message``'s encoding, the answer's header block."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

from evenserve.httpio.grpc_h2.frames import hpack_int, literal

if TYPE_CHECKING:
    from evenserve.httpio.grpc_h2.writing import Writing

# gRPC status codes (grpc's ``StatusCode`` values).
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT = 0, 1, 2, 3
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 8, 12, 13
#: grpc-timeout units, in seconds.
TIMEOUT_UNITS = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}
#: Request headers that are the transport's, not the call's metadata.
NOT_METADATA = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding")
)


class Abort(Exception):
    """A call answered with a status (``Call.abort``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


#: A unary handler: the request's bytes and the call -> the answer's bytes.
Handler = Callable[[bytearray, "Call"], Awaitable[bytes]]


def status_value(code: Any) -> int:
    """A gRPC status as its number: an int, or grpc's ``StatusCode`` (its value's first item)."""
    if isinstance(code, int):
        return code
    return int(code.value[0])


#: ``:status: 200`` (static index 8) and ``content-type: application/grpc`` (name: static 31).
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + hpack_int(16, 7, 0) + b"application/grpc"
#: ``grpc-status: 0``.
STATUS_OK = literal(b"grpc-status", b"0")


def percent_encode(message: str) -> bytes:
    """grpc-message's encoding: UTF-8, with bytes outside printable ASCII and ``%`` as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout (up to 8 digits and a unit) in seconds; None when it is not one."""
    if not 2 <= len(value) <= 9 or value[-1] not in TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * TIMEOUT_UNITS[value[-1]]


class Call:
    """One call's context, as grpcio's servicer context is to its handler."""

    __slots__ = (
        "conn",
        "deadline",
        "ended",
        "filled",
        "head",
        "message",
        "metadata",
        "path",
        "recv_window",
        "refusal",
        "send_window",
        "sid",
        "task",
        "trailing",
    )

    def __init__(self, conn: Writing, sid: int, path: str, send_window: int) -> None:
        self.conn = conn
        self.sid = sid
        self.path = path
        self.send_window = send_window
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.deadline: float | None = None
        #: The message's 5-byte prefix as it arrives, then the message, ``filled`` so far.
        self.head = bytearray()
        self.message: bytearray | None = None
        self.filled = 0
        #: What the client may still send on this stream before our next WINDOW_UPDATE.
        self.recv_window = conn.limits.window_bytes
        #: The client's side ended (END_STREAM seen) or was dropped.
        self.ended = False
        self.task: asyncio.Task[None] | None = None
        self.trailing: tuple[tuple[str, str], ...] = ()
        #: The status the call is to be answered with once the client has sent a message.
        self.refusal: tuple[int, str] | None = None

    # -- what a handler uses (grpcio's ServicerContext's names) ---------------------------
    async def abort(self, code: Any, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise Abort(status_value(code), details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(self.deadline - self.conn.loop.time(), 0.0)
