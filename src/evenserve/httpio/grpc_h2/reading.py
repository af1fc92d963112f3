"""A connection's input: the preface, then frames, each checked where it may be (a
connection error raised where it may not); header blocks gathered with their CONTINUATIONs;
DATA counted against the windows we gave (topped up once half is used) and copied straight
into its call's message as it arrives, whatever the chunking of the reads."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from evenserve.httpio.grpc_h2.call import RESOURCE_EXHAUSTED, Call
from evenserve.httpio.grpc_h2.calls import Calls
from evenserve.httpio.grpc_h2.frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ConnectionError_,
    frame_head,
)

if TYPE_CHECKING:
    from evenserve.httpio.grpc_h2.server import GrpcH2Server

#: Streams a client may reset before its resets are weighed against its answered calls, and
#: the share of those it may reset beyond them (more: GOAWAY ENHANCE_YOUR_CALM).
FREE_RESETS = 100
MAX_RESET_SHARE = 1


class Reading(Calls):
    """The input side of one client connection (the module's docstring)."""

    def __init__(self, server: GrpcH2Server) -> None:
        super().__init__(server)
        self.buf = bytearray()
        self.preface = True
        #: Streams the client reset (``MAX_RESET_SHARE``).
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
        # What the client may still send us (the connection's window), and what it has
        # sent since our last WINDOW_UPDATE.
        self.recv_window = self.limits.window_bytes
        self.recv_used = 0
        #: Closes the connection if its preface and SETTINGS are late.
        self.preface_timer: asyncio.TimerHandle | None = None

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
        used (a stream's is topped up the same way in ``payload``)."""
        self.recv_window -= length
        if self.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA over the connection window")
        self.recv_used += length
        if self.recv_used >= self.limits.window_bytes // 2:
            self.out.append(self.window_update(0, self.recv_used))
            self.recv_window += self.recv_used
            self.recv_used = 0
