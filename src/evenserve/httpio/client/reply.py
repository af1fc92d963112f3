"""What a request gets back: an answer (``Reply``), or an error that says what it means for
a retry; and the headers read out of an answer's head."""

from __future__ import annotations

from typing import NamedTuple


class HttpClientError(Exception):
    """A request that got no (complete, well-formed) HTTP answer."""


class ConnectFailed(HttpClientError, ConnectionError):
    """Could not connect: the request never left. The message is ``connect-refused`` or
    ``timeout`` (or the OS error's name)."""


class ConnectionLost(HttpClientError, ConnectionError):
    """Connected, but the connection closed before the answer was complete."""


class ResponseTimeout(HttpClientError, TimeoutError):
    """The server has the request and did not answer within the time limit."""


class BadResponse(HttpClientError):
    """The answer was not valid HTTP."""


class Reply(NamedTuple):
    """One answer: status, the response headers asked for (lower-case names), the body,
    ``resent``: 1 when the request was sent again on a fresh connection (see ``send``), the
    head as received (status line and headers, up to and with the blank line), and ``raw``:
    the whole answer as received when it came in one read, its head's lines end in CRLF, its
    body is exactly its one ``Content-Length`` and it has no hop-by-hop header (RFC 9110
    7.6.1) nor Transfer-Encoding (else None): an answer a proxy may relay as it is."""

    status: int
    headers: dict[str, str]
    body: bytes
    resent: int
    head: bytes = b""
    raw: bytes | None = None


#: An answer as a connection parses it: a ``Reply`` sent once (``resent`` 0).
Result = Reply
#: ``Reply`` from a tuple of its six fields, without the Python-level ``__new__`` of a named
#: tuple (one interpreted call less per answer): ``new_reply(Reply, (status, ...))``.
new_reply = tuple.__new__


def head_end(data: bytes) -> int:
    """Where the head of an HTTP message in ``data`` ends (after its blank line); -1: not in
    it."""
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        return end + 4
    end = data.find(b"\n\n")  # bare line feeds, as a lenient parser takes them
    return end + 2 if end >= 0 else -1


def parse_headers(head: bytes, keep: frozenset[bytes] | None = None) -> dict[str, str]:
    """The headers of an HTTP head (``Reply.head``) by lower-case name, a repeated one's
    values joined with ", "; only the names in ``keep`` (lower case) when it is given."""
    out: dict[str, str] = {}
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip().lower()
        if keep is not None and key not in keep:
            continue
        k, v = key.decode("latin-1"), value.strip().decode("latin-1")
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out
