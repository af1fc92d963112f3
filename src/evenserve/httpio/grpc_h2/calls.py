"""A connection's calls: a header block opens one (or refuses it, answered once its client
has sent its first message), a whole request runs its handler as a task, and the handler's
answer, abort or failure is written (the package's docstring says what is refused, and how)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import hpack
from hpack.exceptions import HPACKError, OversizedHeaderListError

from evenserve.httpio.grpc_h2.call import (
    INTERNAL,
    NOT_METADATA,
    OK,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    UNKNOWN,
    Abort,
    Call,
    Handler,
    parse_timeout,
)
from evenserve.httpio.grpc_h2.frames import (
    COMPRESSION_ERROR,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    ConnectionError_,
)
from evenserve.httpio.grpc_h2.writing import Writing

if TYPE_CHECKING:
    from evenserve.httpio.grpc_h2.server import GrpcH2Server

log = logging.getLogger("evenserve.grpc")

#: How long a call refused before its handler runs waits for its client's first message
#: before it is answered anyway (``Calls.refuse_waiting``).
REFUSAL_WAIT_S = 0.2


class Calls(Writing):
    """The calls of one client connection (the module's docstring)."""

    def __init__(self, server: GrpcH2Server) -> None:
        super().__init__(server)
        self.handlers = server.handlers
        self.decoder = hpack.Decoder(max_header_list_size=self.limits.hard_header_list_bytes)
        #: The client sent GOAWAY: no new call is taken.
        self.goaway_received = False

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
