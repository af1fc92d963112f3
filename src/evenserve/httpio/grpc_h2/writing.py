"""A connection's output: each answer framed (headers, the message, trailers; or trailers
only) and cut to the client's windows and MAX_FRAME_SIZE, what does not fit held until its
WINDOW_UPDATE; RST_STREAM, WINDOW_UPDATE and GOAWAY; all of it written in one ``write`` per
turn (``flush``). ``Writing`` holds the state both directions share: the calls open, the
windows we may send into, what is waiting to be written."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from evenserve.httpio.grpc_h2.call import (
    OK,
    RESPONSE_HEADERS,
    STATUS_OK,
    Call,
    percent_encode,
)
from evenserve.httpio.grpc_h2.frames import (
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    RST_STREAM,
    WINDOW_UPDATE,
    frame_head,
    literal,
)

if TYPE_CHECKING:
    from evenserve.httpio.grpc_h2.server import GrpcH2Server


class Writing:
    """The output side of one client connection (the package's docstring)."""

    def __init__(self, server: GrpcH2Server) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, Call] = {}
        self.last_sid = 0
        #: Calls answered (``reading.MAX_RESET_SHARE``).
        self.answered = 0
        # What we may send (the connection's window), and the client's settings for it.
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        #: Answers waiting for window: stream id -> (the DATA left, the trailers block).
        self.blocked: dict[int, tuple[memoryview, bytes]] = {}
        self.out: list[bytes] = []
        self.closing = False

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
