"""Unary gRPC over cleartext HTTP/2 (h2c with prior knowledge) on an asyncio protocol.

What the gateway's gRPC front runs with ``gateway.grpc_server: h2`` (design note 0003): the
framing is written here, the header blocks are decoded with ``hpack`` (the HPACK of the
``h2`` project: Huffman, the dynamic table and its size updates, a cap on the decoded
list). Serving a unary call costs a fraction of grpcio's server's CPU (the note's figures),
because this does only what a unary call needs: read one request message, call one
handler, write one answer.

Per connection: the client's preface, then SETTINGS both ways; per stream (an odd id above
the last one) a HEADERS block (with its CONTINUATIONs) naming a ``POST`` to ``/service/Method``
with ``content-type: application/grpc``, DATA up to END_STREAM carrying one message with
gRPC's 5-byte prefix (uncompressed), and the answer: HEADERS, DATA, trailers; or one HEADERS
block with the status ("trailers only"). The answer's header blocks use no dynamic table
(indexed static entries and literals without indexing), so nothing the client sends about
its own table matters to them.

What it refuses, and how (RFC 9113; gRPC's HTTP/2 protocol document):

- a connection that does not start with the preface, or whose preface and SETTINGS do not
  arrive within ``preface_timeout_s``: closed (after a GOAWAY PROTOCOL_ERROR when the bytes
  were not a preface);
- a frame over the MAX_FRAME_SIZE we advertise: GOAWAY FRAME_SIZE_ERROR; a frame where it
  cannot be (DATA or HEADERS on stream 0, SETTINGS or PING on a stream, a PUSH_PROMISE, a
  CONTINUATION not following its HEADERS, a new stream id not above the last, DATA on a
  stream never opened): GOAWAY PROTOCOL_ERROR; a header block HPACK cannot decode, or whose
  compressed or decoded size passes ``hard_header_list_bytes`` (four times
  ``max_header_list_bytes``, at least 64 KiB): GOAWAY COMPRESSION_ERROR, or
  ENHANCE_YOUR_CALM (the decoder's table would be out of step with the client's after
  either; under that size the block is decoded and the call alone refused, below); DATA
  beyond a window we gave: GOAWAY FLOW_CONTROL_ERROR. Every connection error closes the
  connection after its GOAWAY; calls in flight on it are cancelled;
- a stream over ``max_concurrent_streams`` (advertised in SETTINGS): RST_STREAM
  REFUSED_STREAM (a client may retry it: nothing of it was handled);
- a decoded header list over ``max_header_list_bytes`` (also advertised): RESOURCE_EXHAUSTED;
  a method other than POST, a content-type that is not gRPC's, no path: the call answered
  with its gRPC status (INTERNAL, UNIMPLEMENTED for an unknown path or an RPC not served,
  streaming ones included, as grpcio does), once the client has sent its first DATA or
  ended its side (grpc's Python client fails a call whose status comes before its first
  message is sent, as INTERNAL), or ``REFUSAL_WAIT_S`` after its headers if it sends
  nothing (a stream opened before its first request is not left waiting); a compressed
  message: UNIMPLEMENTED; a message over
  ``max_message_bytes``: RESOURCE_EXHAUSTED as soon as its prefix gives its size, and
  RST_STREAM NO_ERROR (the rest of the stream is ignored, its flow control still
  counted); not exactly one message: INTERNAL;
- frames on a stream already answered or reset are ignored (RFC 9113 5.1); DATA or HEADERS
  after a stream's END_STREAM: GOAWAY STREAM_CLOSED; a client that resets more than
  ``FREE_RESETS`` streams and more than it had answered ("rapid reset": each opened stream
  may have sent a request to a backend): GOAWAY ENHANCE_YOUR_CALM; a client that does not
  read what it is sent is not read from until it does (its PINGs cannot queue answers).

Flow control both ways: the windows we give (``window_bytes`` per stream and for the
connection) are topped up as DATA is read, once half is used; our DATA is cut to the
client's windows and MAX_FRAME_SIZE, and what does not fit waits for its WINDOW_UPDATE.
PING is answered; RST_STREAM cancels its call; a client's GOAWAY lets the calls it covers
finish; a client that goes away cancels every call of the connection (the handler sees
CancelledError, nothing is logged, nothing is written).

Handlers: ``(request bytes, call) -> answer bytes``, looked up by path; ``call`` is what
grpcio's servicer context is to a handler (``abort``, ``set_trailing_metadata``,
``invocation_metadata``, ``time_remaining``), so the same servicer runs on either server.
A handler that raises anything else answers UNKNOWN (logged: that is a bug).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import hpack
from hpack.exceptions import HPACKError, OversizedHeaderListError

log = logging.getLogger("evenserve.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (RFC 9113 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
# Flags.
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Error codes (RFC 9113 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
# SETTINGS parameters.
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
MAX_WINDOW = (1 << 31) - 1
#: Streams a client may reset before its resets are weighed against its answered calls, and
#: the share of those it may reset beyond them (more: GOAWAY ENHANCE_YOUR_CALM).
FREE_RESETS = 100
MAX_RESET_SHARE = 1
#: How long a call refused before its handler runs waits for its client's first message
#: before it is answered anyway (``Connection.refuse_waiting``).
REFUSAL_WAIT_S = 0.2
DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
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


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection may ask of the server (see the module docstring)."""

    max_message_bytes: int = 4 * 1024 * 1024
    max_header_list_bytes: int = 16 * 1024
    max_concurrent_streams: int = 256
    #: The MAX_FRAME_SIZE advertised (frames up to it are read).
    max_frame_bytes: int = 1 << 20
    #: The window given to each stream and to the connection.
    window_bytes: int = 16 * 1024 * 1024
    preface_timeout_s: float = 10.0
    max_connections: int = 4096

    @property
    def hard_header_list_bytes(self) -> int:
        """A header block over this (compressed or decoded) is a connection error."""
        return max(4 * self.max_header_list_bytes, 64 * 1024)


class Abort(Exception):
    """A call answered with a status (``Call.abort``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


class ConnectionError_(Exception):
    """A connection error: the GOAWAY code and why."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)
        self.code = code
        self.why = why


#: A unary handler: the request's bytes and the call -> the answer's bytes.
Handler = Callable[[bytearray, "Call"], Awaitable[bytes]]


def status_value(code: Any) -> int:
    """A gRPC status as its number: an int, or grpc's ``StatusCode`` (its value's first item)."""
    if isinstance(code, int):
        return code
    return int(code.value[0])


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first``'s high bits as the prefix's pattern."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, with a literal name (RFC 7541 6.2.2)."""
    return b"\x00" + hpack_int(len(name), 7, 0) + name + hpack_int(len(value), 7, 0) + value


#: ``:status: 200`` (static index 8) and ``content-type: application/grpc`` (name: static 31).
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + hpack_int(16, 7, 0) + b"application/grpc"
#: ``grpc-status: 0``.
STATUS_OK = literal(b"grpc-status", b"0")


def frame_head(length: int, ftype: int, flags: int, sid: int) -> bytes:
    return length.to_bytes(3, "big") + bytes((ftype, flags)) + (sid & MAX_WINDOW).to_bytes(4, "big")


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

    def __init__(self, conn: H2Connection, sid: int, path: str, send_window: int) -> None:
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


class H2Connection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server: GrpcH2Server) -> None:
        self.server = server
        self.limits = limits = server.limits
        self.handlers = server.handlers
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.preface = True
        self.decoder = hpack.Decoder(max_header_list_size=limits.hard_header_list_bytes)
        self.calls: dict[int, Call] = {}
        self.last_sid = 0
        #: Calls answered, and streams the client reset (``MAX_RESET_SHARE``).
        self.answered = 0
        self.resets = 0
        # A header block being read: its stream, flags of its HEADERS, the fragments.
        self.block_sid = 0
        self.block_flags = 0
        self.block: bytearray | None = None
        # The DATA frame being read: bytes of its payload still to come, its call (None:
        # dropped), whether it ends its stream.
        self.data_left = 0
        self.data_call: Call | None = None
        self.data_end = False
        # Windows: what the client may still send us (connection), and what we may send.
        self.recv_window = limits.window_bytes
        self.recv_used = 0
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        #: Answers waiting for window: stream id -> (the DATA left, the trailers block).
        self.blocked: dict[int, tuple[memoryview, bytes]] = {}
        self.out: list[bytes] = []
        self.closing = False
        self.goaway_received = False
        self.preface_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        if len(self.server.connections) > self.limits.max_connections:
            self.goaway(ENHANCE_YOUR_CALM, "too many connections")
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lim = self.limits
        settings = (
            (S_MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, lim.window_bytes),
            (S_MAX_FRAME_SIZE, lim.max_frame_bytes),
            (S_MAX_HEADER_LIST_SIZE, lim.max_header_list_bytes),
            (S_ENABLE_PUSH, 0),
        )
        payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in settings)
        self.out.append(frame_head(len(payload), SETTINGS, 0, 0) + payload)
        self.out.append(self.window_update(0, lim.window_bytes - DEFAULT_WINDOW))
        self.flush()
        self.preface_timer = self.loop.call_later(lim.preface_timeout_s, self.preface_late)

    def pause_writing(self) -> None:
        """The client does not read what we write: stop reading what it sends (PINGs and
        SETTINGS would otherwise queue answers without bound) until it does."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def preface_late(self) -> None:
        if self.preface and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        if self.preface_timer is not None:
            self.preface_timer.cancel()
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        self.blocked.clear()
        self.server.idle(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            if self.preface:
                buf = self.buf
                buf += data
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 preface")
                    return
                if not buf.startswith(PREFACE):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 preface")
                del buf[: len(PREFACE)]
                self.preface = False
                data = b""
            view = memoryview(data)
            if self.data_left:  # the rest of a DATA frame's payload: to its message
                view = self.payload(view)
            if self.buf:
                self.buf += view
                self.read_frames(self.buf)
            elif view:
                self.read_frames(view)
        except ConnectionError_ as exc:
            self.goaway(exc.code, exc.why)
            return
        if self.out:
            self.flush()

    def read_frames(self, src: bytearray | memoryview) -> None:
        """The frames in ``src`` (``self.buf``, or the bytes just read when none are kept):
        each whole one handled, an unpadded DATA frame's payload as it comes; what is left
        of a frame kept in ``self.buf``."""
        n = len(src)
        pos = 0
        max_frame = self.limits.max_frame_bytes
        try:
            while n - pos >= 9:
                length = (src[pos] << 16) | (src[pos + 1] << 8) | src[pos + 2]
                if length > max_frame:
                    raise ConnectionError_(FRAME_SIZE_ERROR, "frame over MAX_FRAME_SIZE")
                ftype = src[pos + 3]
                flags = src[pos + 4]
                sid = int.from_bytes(src[pos + 5 : pos + 9], "big") & MAX_WINDOW
                start = pos + 9
                end = start + length
                if self.block is not None and ftype != CONTINUATION:
                    raise ConnectionError_(PROTOCOL_ERROR, "header block not continued")
                if ftype == DATA and not flags & PADDED:
                    # Taken as it arrives: straight into its call's message.
                    self.on_data_head(flags, sid, length)
                    pos = min(end, n)
                    # (no view of ``src`` outlives this line: ``self.buf`` is cut below)
                    self.payload(memoryview(src)[start:pos])
                    continue
                if end > n:
                    break
                pos = end
                if ftype == DATA:
                    self.on_padded_data(flags, sid, bytes(src[start:end]))
                elif ftype == HEADERS:
                    self.on_headers(flags, sid, bytes(src[start:end]))
                elif ftype == CONTINUATION:
                    self.on_continuation(flags, sid, bytes(src[start:end]))
                elif ftype == SETTINGS:
                    self.on_settings(flags, sid, bytes(src[start:end]))
                elif ftype == WINDOW_UPDATE:
                    self.on_window_update(sid, bytes(src[start:end]))
                elif ftype == PING:
                    if sid:
                        raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
                    if length != 8:
                        raise ConnectionError_(FRAME_SIZE_ERROR, "PING not 8 bytes")
                    if not flags & ACK:
                        self.out.append(frame_head(8, PING, ACK, 0) + bytes(src[start:end]))
                elif ftype == RST_STREAM:
                    self.on_rst_stream(sid, length)
                elif ftype == GOAWAY:
                    if sid:
                        raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
                    self.goaway_received = True
                elif ftype == PRIORITY:
                    if not sid:
                        raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
                    if length != 5:
                        raise ConnectionError_(FRAME_SIZE_ERROR, "PRIORITY not 5 bytes")
                elif ftype == PUSH_PROMISE:
                    raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
                # Unknown frame types are ignored (RFC 9113 4.1).
        finally:
            if src is self.buf:
                del self.buf[:pos]
            elif pos < n:
                self.buf += src[pos:]

    # -- frames ---------------------------------------------------------------------------
    def on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self.calls.values():
                    call.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self.out.append(frame_head(0, SETTINGS, ACK, 0))
        if self.preface_timer is not None:
            self.preface_timer.cancel()
            self.preface_timer = None
        if self.blocked:
            self.resume()

    def on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE not 4 bytes")
        inc = int.from_bytes(payload, "big") & MAX_WINDOW
        if not sid:
            if not inc:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
        else:
            call = self.calls.get(sid)
            if call is None:
                if sid > self.last_sid:
                    raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
                return  # a stream closed meanwhile
            if not inc:
                self.reset(sid, PROTOCOL_ERROR)
                return
            call.send_window += inc
            if call.send_window > MAX_WINDOW:
                self.reset(sid, FLOW_CONTROL_ERROR)
                return
        if self.blocked:
            self.resume()

    def on_rst_stream(self, sid: int, length: int) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if length != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM not 4 bytes")
        if sid > self.last_sid:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        call = self.calls.pop(sid, None)
        self.blocked.pop(sid, None)
        if call is None:
            return
        if call.task is not None:
            call.task.cancel()
        self.resets += 1
        if self.resets > FREE_RESETS and self.resets > self.answered * MAX_RESET_SHARE:
            # Streams opened and reset at once cost the server (a handler may have sent
            # the request on) and the client nothing ("rapid reset").
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many streams reset")
        self.server.idle(self)

    def on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS padding without its length")
            start = 1
            end -= payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        if end < start:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS padding over its payload")
        block = payload[start:end]
        if flags & END_HEADERS:
            self.on_block(flags, sid, block)
        else:
            self.block_sid, self.block_flags, self.block = sid, flags, bytearray(block)

    def on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        block = self.block
        if block is None or sid != self.block_sid:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block += payload
        if len(block) > self.limits.hard_header_list_bytes:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block over the limit")
        if flags & END_HEADERS:
            self.block = None
            self.on_block(self.block_flags, sid, bytes(block))

    def on_block(self, flags: int, sid: int, block: bytes) -> None:
        """A whole header block of stream ``sid`` (``flags``: its HEADERS frame's)."""
        try:
            fields = self.decoder.decode(block, raw=True)
        except OversizedHeaderListError:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header list over the limit") from None
        except (HPACKError, ValueError, IndexError) as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {exc}") from None
        if sid <= self.last_sid:  # trailers of an open stream, or a block on a closed one
            call = self.calls.get(sid)
            if call is None:
                return  # a stream answered or reset: its frames are ignored (RFC 9113 5.1)
            if call.ended:
                raise ConnectionError_(STREAM_CLOSED, "HEADERS after the end of the stream")
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "trailers without END_STREAM")
            call.ended = True
            if call.refusal is not None:
                self.refuse(call, *call.refusal)
            else:
                self.end_of_request(call)
            return
        if not sid & 1:
            raise ConnectionError_(PROTOCOL_ERROR, "a stream id that is even")
        self.last_sid = sid
        if len(self.calls) >= self.limits.max_concurrent_streams or self.goaway_received:
            self.reset(sid, REFUSED_STREAM)
            return
        path = b""
        method = b""
        ctype = b""
        timeout = None
        size = 0
        meta = []
        for name, value in fields:
            size += len(name) + len(value) + 32
            if name[0] == 0x3A:  # ':'
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            elif name in NOT_METADATA:
                if name == b"content-type":
                    ctype = value
                elif name == b"grpc-timeout":
                    timeout = parse_timeout(value)
            else:
                meta.append((name.decode("latin-1"), value.decode("latin-1")))
        call = Call(self, sid, path.decode("latin-1"), self.peer_initial_window)
        self.calls[sid] = call
        call.ended = bool(flags & END_STREAM)
        if timeout is not None:
            call.deadline = self.loop.time() + timeout
        call.metadata = tuple(meta)
        refusal: tuple[int, str] | None = None
        if size > self.limits.max_header_list_bytes:
            refusal = RESOURCE_EXHAUSTED, "header list over the server's limit"
        elif method != b"POST":
            refusal = INTERNAL, f"method {method.decode('latin-1')!r} is not POST"
        elif not (ctype == b"application/grpc" or ctype.startswith(b"application/grpc+")):
            refusal = INTERNAL, "content-type is not application/grpc"
        elif call.path not in self.handlers:
            why = self.server.refused.get(call.path) or f"Method not found: {call.path}"
            refusal = UNIMPLEMENTED, why
        if refusal is None:
            if call.ended:
                self.end_of_request(call)
        elif call.ended:
            self.refuse(call, *refusal)
        else:
            # Answered at its first DATA (or its end): grpc's Python client fails a call as
            # INTERNAL when its status comes before it has sent its first message. A client
            # that sends nothing (a stream opened before its first request) is answered
            # after REFUSAL_WAIT_S all the same: never left waiting.
            call.refusal = refusal
            self.loop.call_later(REFUSAL_WAIT_S, self.refuse_waiting, call)

    def on_data_head(self, flags: int, sid: int, length: int) -> None:
        """A DATA frame of ``length`` bytes begins: its windows counted, its payload's call
        (None: dropped) and end of stream noted for ``payload``."""
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        self.consumed(length)
        self.data_left = length
        self.data_end = bool(flags & END_STREAM)
        call = self.calls.get(sid)
        self.data_call = None
        if call is None or call.ended:
            if sid > self.last_sid:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            if call is not None:  # DATA after END_STREAM
                raise ConnectionError_(STREAM_CLOSED, "DATA after the end of the stream")
            return  # a stream answered or reset: ignored, its window counted
        call.recv_window -= length
        if call.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA over a stream's window")
        if call.refusal is not None:
            self.refuse(call, *call.refusal)
            return
        self.data_call = call
        if not length:
            self.payload(memoryview(b""))

    def payload(self, view: memoryview) -> memoryview:
        """Bytes of the DATA frame being read, to its call's message; what is after the
        frame returned."""
        left = self.data_left
        chunk, rest = view[:left], view[left:]
        self.data_left = left = left - len(chunk)
        call = self.data_call
        if call is None or call.ended:
            return rest
        if chunk:
            self.fill(call, chunk)
        if left or self.calls.get(call.sid) is not call:
            return rest
        if self.data_end:
            call.ended = True
            self.end_of_request(call)
        else:
            window = self.limits.window_bytes
            if call.recv_window <= window // 2:
                self.out.append(self.window_update(call.sid, window - call.recv_window))
                call.recv_window = window
        return rest

    def fill(self, call: Call, chunk: memoryview) -> None:
        """``chunk`` of ``call``'s request to its message: the 5-byte prefix, then the
        message into a buffer of the size the prefix gives (one copy). A size over the
        limit is refused at once; bytes past the message are a second one (``end_of_request``
        refuses the call)."""
        msg = call.message
        if msg is None:
            head = call.head
            need = 5 - len(head)
            head += chunk[:need]
            chunk = chunk[need:]
            if len(head) < 5:
                return
            size = int.from_bytes(head[1:5], "big")
            if size > self.limits.max_message_bytes:
                self.refuse(
                    call,
                    RESOURCE_EXHAUSTED,
                    f"received message larger than max ({size} vs. "
                    f"{self.limits.max_message_bytes})",
                    reset=True,
                )
                return
            msg = call.message = bytearray(size)
        filled = call.filled
        n = len(chunk)
        if filled + n > len(msg):
            call.filled = len(msg) + 1  # a second message
            return
        msg[filled : filled + n] = chunk
        call.filled = filled + n

    def on_padded_data(self, flags: int, sid: int, payload: bytes) -> None:
        """A padded DATA frame, whole: its padding dropped, its data as an unpadded one's."""
        if not payload or payload[0] >= len(payload):
            raise ConnectionError_(PROTOCOL_ERROR, "DATA padding over its payload")
        self.on_data_head(flags, sid, len(payload))
        self.data_left = len(payload) - 1 - payload[0]
        self.payload(memoryview(payload)[1 : 1 + self.data_left])

    def consumed(self, length: int) -> None:
        """``length`` bytes of DATA read: the connection's window, topped up once half is
        used (a stream's is topped up the same way in ``on_data``)."""
        self.recv_window -= length
        if self.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA over the connection window")
        self.recv_used += length
        if self.recv_used >= self.limits.window_bytes // 2:
            self.out.append(self.window_update(0, self.recv_used))
            self.recv_window += self.recv_used
            self.recv_used = 0

    # -- calls ------------------------------------------------------------------------------
    def end_of_request(self, call: Call) -> None:
        """The request of ``call`` is whole: its message, to its handler."""
        msg = call.message
        if msg is None or call.filled != len(msg):
            if msg is None and not call.head:
                return self.refuse(call, INTERNAL, "no request message")
            if msg is None or call.filled < len(msg):
                return self.refuse(call, INTERNAL, "the request message is cut short")
            return self.refuse(call, INTERNAL, "more than one request message")
        if call.head[0]:
            return self.refuse(
                call, UNIMPLEMENTED, "compressed messages are not supported by this server"
            )
        call.message = None
        handler = self.handlers[call.path]
        call.task = self.loop.create_task(self.run(call, handler, msg))
        return None

    async def run(self, call: Call, handler: Handler, message: bytearray) -> None:
        try:
            answer = await handler(message, call)
        except Abort as exc:
            self.answer(call, None, exc.code, exc.message)
        except asyncio.CancelledError:
            return  # the client reset the stream or went away: nothing to write
        except Exception:
            log.exception("gRPC handler of %s failed", call.path)
            self.answer(call, None, UNKNOWN, "Unexpected error in the server's handler")
        else:
            self.answer(call, answer, OK, "")
        if self.out:
            self.flush()

    def refuse_waiting(self, call: Call) -> None:
        """A refused call whose client has sent nothing since: answered now."""
        if call.refusal is not None and not call.ended and self.calls.get(call.sid) is call:
            self.refuse(call, *call.refusal)
            self.flush()

    def refuse(self, call: Call, code: int, message: str, reset: bool = False) -> None:
        """``call`` answered with a status before its handler ran; what the client still
        sends on it is ignored. With ``reset``, a client still sending is also told to stop
        (RST_STREAM NO_ERROR, RFC 9113 8.1): for a message over the limit. Not otherwise:
        grpc's Python client fails a streaming call whose stream is reset while it writes
        (INTERNAL) even after its status came."""
        self.answer(call, None, code, message)
        if not call.ended:
            if reset:
                self.reset(call.sid, NO_ERROR)
            call.ended = True

    def trailers(self, call: Call, code: int, message: str) -> bytes:
        block = STATUS_OK if code == OK else literal(b"grpc-status", str(code).encode())
        if message:
            block += literal(b"grpc-message", percent_encode(message))
        for key, value in call.trailing:
            block += literal(key.encode("latin-1"), value.encode("latin-1"))
        return block

    def answer(self, call: Call, message: bytes | None, code: int, details: str) -> None:
        """The answer of ``call``: headers, the message, trailers; or trailers only."""
        sid = call.sid
        if self.calls.get(sid) is not call or self.transport is None:
            return
        trailers = self.trailers(call, code, details)
        out = self.out
        if message is None:
            block = RESPONSE_HEADERS + trailers
            out.append(frame_head(len(block), HEADERS, END_HEADERS | END_STREAM, sid) + block)
            self.close_stream(call)
            return
        out.append(frame_head(len(RESPONSE_HEADERS), HEADERS, END_HEADERS, sid))
        out.append(RESPONSE_HEADERS)
        data = len(message).to_bytes(5, "big") + message if len(message) < 4096 else None
        size = len(message) + 5
        window = min(call.send_window, self.send_window)
        if data is not None and size <= window and size <= self.peer_max_frame:
            out.append(frame_head(size, DATA, 0, sid) + data)
            call.send_window -= size
            self.send_window -= size
            out.append(frame_head(len(trailers), HEADERS, END_HEADERS | END_STREAM, sid))
            out.append(trailers)
            self.close_stream(call)
            return
        body = memoryview(len(message).to_bytes(5, "big") + message)
        self.blocked[sid] = (body, trailers)
        self.send_blocked(call)

    def send_blocked(self, call: Call) -> bool:
        """Write what the windows let of ``call``'s answer; True when it is all written."""
        sid = call.sid
        body, trailers = self.blocked[sid]
        out = self.out
        frame = self.peer_max_frame
        while body:
            n = min(len(body), call.send_window, self.send_window, frame)
            if n <= 0:
                self.blocked[sid] = (body, trailers)
                return False
            out.append(frame_head(n, DATA, 0, sid))
            out.append(bytes(body[:n]))
            body = body[n:]
            call.send_window -= n
            self.send_window -= n
        del self.blocked[sid]
        out.append(frame_head(len(trailers), HEADERS, END_HEADERS | END_STREAM, sid))
        out.append(trailers)
        self.close_stream(call)
        return True

    def resume(self) -> None:
        for sid in list(self.blocked):
            call = self.calls.get(sid)
            if call is None:
                self.blocked.pop(sid, None)
            elif not self.send_blocked(call) and self.send_window <= 0:
                break
        self.flush()

    def close_stream(self, call: Call) -> None:
        self.answered += 1
        self.calls.pop(call.sid, None)
        if not self.calls:
            self.server.idle(self)

    def reset(self, sid: int, code: int) -> None:
        self.out.append(frame_head(4, RST_STREAM, 0, sid) + code.to_bytes(4, "big"))
        call = self.calls.pop(sid, None)
        self.blocked.pop(sid, None)
        if call is not None and call.task is not None:
            call.task.cancel()

    @staticmethod
    def window_update(sid: int, inc: int) -> bytes:
        return frame_head(4, WINDOW_UPDATE, 0, sid) + inc.to_bytes(4, "big")

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
        out.clear()

    def goaway(self, code: int, why: str, close: bool = True) -> None:
        """A GOAWAY naming the last stream taken; with ``close``, a connection error: the
        connection closed (its calls cancelled)."""
        payload = self.last_sid.to_bytes(4, "big") + code.to_bytes(4, "big") + why.encode()
        self.out.append(frame_head(len(payload), GOAWAY, 0, 0) + payload)
        self.flush()
        if close:
            self.closing = True
            if self.transport is not None:
                self.transport.close()


class GrpcH2Server:
    """The listener: an asyncio server of ``H2Connection``; ``handlers`` by path, and the
    paths answered UNIMPLEMENTED with their message as soon as their headers are read
    (``refused``: RPCs not served, streaming ones included); any other path is UNIMPLEMENTED
    too."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        limits: Limits,
        refused: Mapping[str, str] | None = None,
    ) -> None:
        self.handlers = dict(handlers)
        self.refused = dict(refused or {})
        self.limits = limits
        self.loop = asyncio.get_event_loop()
        self.connections: set[H2Connection] = set()
        self.server: asyncio.Server | None = None
        self.stopping: asyncio.Event | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: any free port); the port bound."""
        self.loop = asyncio.get_running_loop()
        self.server = await self.loop.create_server(
            lambda: H2Connection(self), host, port, reuse_address=True
        )
        return int(self.server.sockets[0].getsockname()[1])

    def idle(self, conn: H2Connection) -> None:
        """``conn`` has no call in flight: closed if the server is stopping."""
        if self.stopping is not None and not conn.calls and conn.transport is not None:
            conn.flush()  # the last answer, then the close
            conn.transport.close()
        if self.stopping is not None and not any(c.calls for c in self.connections):
            self.stopping.set()

    async def stop(self, grace_s: float) -> None:
        """Stop listening; GOAWAY to every connection; let the calls in flight finish for up
        to ``grace_s``, then close every connection."""
        if self.server is not None:
            self.server.close()
        self.stopping = asyncio.Event()
        for conn in list(self.connections):
            conn.goaway(NO_ERROR, "server stopping", close=not conn.calls)
        if any(c.calls for c in self.connections):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), grace_s)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self.server is not None:
            await self.server.wait_closed()
