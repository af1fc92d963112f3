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

The package, by what each module holds: ``frames`` (HTTP/2's wire: frame types, flags, error
codes, SETTINGS, a frame's head, HPACK's encoding of the few fields written), ``call`` (one
call as its handler sees it, and gRPC's statuses, timeouts and messages), ``writing`` (a
connection's output: answers framed under the client's windows, resets, GOAWAY),
``calls`` (a header block opens a call or refuses it; a whole request runs its handler),
``reading`` (the client's frames read, flow control counted, DATA into its call's message)
and ``server`` (the connection as an asyncio protocol, and the listener). A connection is
one object, ``H2Connection``, whose class is built in layers, one per module: ``Writing``,
then ``Calls``, then ``Reading``, then the protocol; a call from one layer to another is a
plain method call on ``self``, as it was when the class was written in one module.
"""

from evenserve.httpio.grpc_h2.call import Call, Handler
from evenserve.httpio.grpc_h2.server import GrpcH2Server, Limits

__all__ = ["Call", "GrpcH2Server", "Handler", "Limits"]
