"""A pooled keep-alive HTTP/1.1 client for one origin (asyncio protocol + httptools).

The gateway forwards with it (one client per backend) and polls with it (one more per
backend: one persistent connection), and the load generator sends with it. Per request it
writes a head and a body on an idle pooled connection and parses the answer with httptools;
on loopback it costs 0.03-0.05 ms of CPU per request, aiohttp's client 0.08-0.13 ms and
httpx's 0.7-0.8 ms (bench/http_server_choice.py).

It does what a proxy's upstream side needs and no more: ``http://`` only, any method,
``Content-Length`` or chunked answers, keep-alive (a connection is reused only when the
answer allows it), the response headers it was asked to keep, a time limit per request, and
a cap on connections (``max_connections``; requests beyond it wait for one to come back).
A time limit is measured from when the request was sent, and a timeout is only declared
when the answer is not there: deadlines are checked by one sweep per client, not a timer per
request. The sweep sleeps until the earliest deadline in flight (at most ``SWEEP_MAX_S``, and
it ends when nothing is in flight); a request it finds past its deadline gets one more look
``SWEEP_GRACE_S`` later before it fails, so an answer that arrived while the loop was too
busy to read it is read first: the caller's own lag never reads as the server's.

Answers are parsed by httptools without a callback per header: the head arrives as bytes
(``Reply.head``), and only the headers asked for (``keep_headers``) are read out of it. An
answer that came in one read with a ``Content-Length`` body and no hop-by-hop header (what a
backend's answer nearly always is) is read without the parser's callbacks and kept whole
(``Reply.raw``), so a proxy can relay it without building it again (the gateway does).

Keep-alive without losing requests. A server closes a connection that has been idle for its
keep-alive timeout (uvicorn: 5 s, ours: 15 s, nginx: 75 s) and does not read what is in flight
on it, so a request written on a pooled connection as that timer fires gets no answer: the
connection is lost before any byte of a response. Two remedies, as HTTP clients do:
- an idle connection is retired (closed, not reused) after ``max_idle_s`` (4 s), below those
  timeouts;
- a request whose *reused* connection is lost before *any* byte of the answer arrived is sent
  once more on a fresh connection (:meth:`HttpClient.send`; counted in ``resent``). A fresh
  connection lost, a connection lost after answer bytes, or the resend lost too, is an error.

Errors, by what they mean for a retry: :class:`ConnectFailed` (never connected: refused or
connect timeout; the request did not leave), :class:`ConnectionLost` (connected, no complete
answer), :class:`ResponseTimeout` (sent, no answer in time), :class:`BadResponse`.

Streamed answers (``HttpClient.stream``, the ``stream`` module) go beside this path: the head
first, then the body's pieces as they arrive (chunked, ``Content-Length`` or to the
connection's end), the connection pooled again only once the body was read to its end.

The package: ``reply`` (what a request gets back: ``Reply``, the errors, the head's
headers), ``connection`` (one keep-alive connection: a request written, its answer parsed)
``pool`` (``HttpClient``: the pool, the cap, the deadline sweep, the resend) and ``stream``
(``StreamReply``: a streamed answer).
"""

from evenserve.httpio.client.pool import MAX_IDLE_S, HttpClient
from evenserve.httpio.client.reply import (
    BadResponse,
    ConnectFailed,
    ConnectionLost,
    HttpClientError,
    Reply,
    ResponseTimeout,
    parse_headers,
)
from evenserve.httpio.client.stream import StreamReply

__all__ = [
    "MAX_IDLE_S",
    "BadResponse",
    "ConnectFailed",
    "ConnectionLost",
    "HttpClient",
    "HttpClientError",
    "Reply",
    "ResponseTimeout",
    "StreamReply",
    "parse_headers",
]
