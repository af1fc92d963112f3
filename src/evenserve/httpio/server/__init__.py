"""An HTTP/1.1 server on an asyncio protocol and httptools: what the gateway and the worker run.

Why not uvicorn + starlette: serving a tiny POST costs them 0.05-0.07 ms of CPU per request
on this project's 2-core host, granian (Rust) 0.11 ms, this server 0.02-0.03 ms
(bench/http_server_choice.py; design note 0007). This server does only what a KServe v2
endpoint needs, per request: parse the head with httptools (the C parser uvicorn uses),
read the body, call one handler, write one response. The handler gets a :class:`Request`
with the whole body and returns a :class:`Response`; routing is the application's (a dict
lookup and ``core.wire.split_model_path``). A handler may instead return a
:class:`StreamResponse` whose body is an async iterator of pieces: it is written chunked
(close-delimited to an HTTP/1.0 client) as the pieces come, beside the whole-body path, which
does not change for it (see ``StreamResponse``).

One path skips the parser: a request read whole in one piece (head and a body of exactly its
``Content-Length``) whose request line and header lines are byte for byte ones this
connection has read before and checked (a known method, an origin-form target of printable
ASCII, HTTP/1.1; well-formed header lines, none repeated, no Transfer-Encoding, Expect,
Upgrade or Connection other than ``keep-alive``) is handed over as the parser would hand it,
without its callbacks: a keep-alive client sends the same lines request after request.
Anything else, bad input included, is the parser's (``connection.Connection.data_received``).

Limits, each answered as HTTP says (and then the connection is closed, since what follows on
it cannot be trusted):
- a request head (request line and headers) over ``max_header_bytes`` or with more than
  ``max_headers`` headers: 431. The head's bytes are counted as they arrive, before the
  parser sees them (httptools hands a header over only once its line is complete), so a head
  that never ends, or one of 50 MiB, is refused as soon as it passes the limit: the rest is
  neither parsed nor kept. One comparison per chunk read while a head is being read;
- a ``Content-Length`` over ``max_body_bytes``: 413 at once, before any of the body is read;
  a chunked body that grows over it: 413 as soon as it does (the rest is not read);
- malformed HTTP: 400; an upgrade (websocket, h2c): 501;
- a head not complete ``header_timeout_s`` after the connection opened or its previous
  answer went out, or a body that stalls for ``body_timeout_s``: the connection is closed
  (408 when nothing of the request is being handled); idle keep-alive connections are
  closed after ``keepalive_timeout_s``;
- connections beyond ``max_connections`` get a 503 and are closed at once, so a flood of
  idle connections cannot take the file descriptors the process needs for its own backends.
Request targets in absolute form (``GET http://host:port/path HTTP/1.1``, which RFC 9112
3.2.2 says a server must accept) reach the handler as their path; ``*`` (``OPTIONS *``) is
handed over as it is. A HEAD request is answered without the body its handler returns.
A handler that raises answers 500 (logged once, with the traceback: that is a bug) and the
connection stays usable. A client that goes away mid-request is not an error: nothing is
logged. Pipelined requests are answered in order, one at a time; reading pauses when
``max_pipelined`` are waiting.

Graceful stop (:meth:`HttpServer.stop`): stop listening, close idle connections, let every
request already read be answered (then close its connection), and after ``timeout_s`` close
what is left.

The package: ``messages`` (what a handler gets and returns, and a response's head as bytes),
``limits`` (``Limits``, and ``Listener``: what a connection sees of its server),
``connection`` (one client connection: the head and body read under the limits, requests
handed to the handler in order, answers written) and ``listener`` (``HttpServer``: the
listening socket, the connections' deadlines swept, the graceful stop).
"""

from evenserve.httpio.server.limits import Limits
from evenserve.httpio.server.listener import HttpServer, raise_descriptor_limit
from evenserve.httpio.server.messages import (
    JSON,
    FastHandler,
    Handler,
    Request,
    Response,
    StreamResponse,
    json_bytes,
    json_response,
)

__all__ = [
    "JSON",
    "FastHandler",
    "Handler",
    "HttpServer",
    "Limits",
    "Request",
    "Response",
    "StreamResponse",
    "json_bytes",
    "json_response",
    "raise_descriptor_limit",
]
