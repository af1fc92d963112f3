"""The wire contract between gateway, worker, load generator and simulator, in one place.

Paths (KServe v2, plus evenserve's load endpoint), the ``x-evenserve-*`` headers, the reasons
a request is refused (also the simulator's drop reasons and the ``reason`` label of the
refusal counters), and how a request's priority class and deadline are read from text or
JSON. Every side imports these names from here, so a rename cannot leave one side behind.

Untrusted input is read here too, as pure functions both servers call: a model route split
into safe names (``split_model_path``), request JSON with bounded nesting and bounded numbers
(``parse_json``), and bounded classes and deadlines (``parse_priority``,
``parse_deadline_ms``). Each raises ValueError naming the field, never anything else.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

import orjson

# -- paths -------------------------------------------------------------------------------------
HEALTH_LIVE_PATH = "/v2/health/live"
HEALTH_READY_PATH = "/v2/health/ready"
SERVER_METADATA_PATH = "/v2"
REPOSITORY_INDEX_PATH = "/v2/repository/index"
#: Triton's model repository extension: ``POST {prefix}{model}/load`` and ``.../unload``.
REPOSITORY_MODELS_PREFIX = "/v2/repository/models/"
REPOSITORY_ACTIONS = ("load", "unload")
#: The worker's load report (JSON), polled by the gateway every signal interval.
LOAD_PATH = "/v2/evenserve/load"
METRICS_PATH = "/metrics"


#: The protocol extensions the gateway serves (HTTP ``/v2`` and gRPC ServerMetadata);
#: perf_analyzer reads server-side figures only from a server that lists ``statistics``.
GATEWAY_EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics", "model_configuration")


#: A model's routes (route templates), with and without a version; the model's metadata is
#: the bare path, its ``/ready``, ``/config``, ``/stats`` and ``/infer`` follow it.
MODEL_ROUTES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
MODEL_STATS_PATH = "/v2/models/stats"
MODELS_PREFIX = "/v2/models/"
#: What may follow a model's route: its metadata (""), readiness, config, statistics, infer.
MODEL_SUFFIXES = ("", "ready", "config", "stats", "infer")
#: The characters of a routable model name or version (after percent-decoding), and the most
#: of them; "." and ".." are never names (a path segment of dots means a directory).
NAME_CHARS = "A-Za-z0-9_.-"
MAX_NAME_LENGTH = 128
_NAME_RE = re.compile(f"[{NAME_CHARS}]{{1,{MAX_NAME_LENGTH}}}")


def is_safe_name(text: str) -> bool:
    """A model name or version the servers route: ``[A-Za-z0-9_.-]{1,128}``, not ``.``/``..``."""
    return _NAME_RE.fullmatch(text) is not None and text not in (".", "..")


class ModelPath(NamedTuple):
    """A model route split: ``/v2/models/{model}[/versions/{version}][/{suffix}]``."""

    model: str
    #: None when the path names no version.
    version: str | None
    #: One of MODEL_SUFFIXES ("" is the model's metadata).
    suffix: str

    def path(self) -> str:
        """The canonical path (what a gateway forwards; never the client's raw bytes)."""
        out = MODELS_PREFIX + self.model
        if self.version is not None:
            out += "/versions/" + self.version
        return out + ("/" + self.suffix if self.suffix else "")


def split_model_path(raw_path: str) -> ModelPath | None:
    """Split a request target's path, as the client sent it (not yet percent-decoded), into
    the model, its version and what follows; None when it is no model route or a name is not
    safe (then the server answers 404).

    The model and the version are percent-decoded exactly once, each on its own after the
    path is split on "/": ``%2F`` never makes a segment, ``%2e%2e`` is ``..`` (refused) and
    ``%252e%252e`` stays ``%2e%2e`` (refused: ``%`` is no name character). ``versions`` and the
    suffix are matched as sent. A query string is ignored. ``/v2/models/stats``
    (MODEL_STATS_PATH) splits as the model ``stats``: a server matches its exact paths first.
    """
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith(MODELS_PREFIX):
        return None
    parts = path[len(MODELS_PREFIX) :].split("/")
    version: str | None = None
    if len(parts) in (3, 4) and parts[1] == "versions":
        version = _decoded_name(parts[2])
        if version is None:
            return None
        parts = [parts[0], *parts[3:]]
    if len(parts) > 2:
        return None
    suffix = parts[1] if len(parts) == 2 else ""
    if len(parts) == 2 and (suffix == "" or suffix not in MODEL_SUFFIXES):
        return None
    model = _decoded_name(parts[0])
    return None if model is None else ModelPath(model, version, suffix)


def _decoded_name(segment: str) -> str | None:
    """One path segment percent-decoded once, if it is then a safe name."""
    if len(segment) > 3 * MAX_NAME_LENGTH:
        return None
    try:
        name = unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return None
    return name if is_safe_name(name) else None


def split_repository_path(raw_path: str) -> tuple[str, str] | None:
    """``/v2/repository/models/{model}/{load|unload}`` split into the model (percent-decoded
    once, a safe name) and the action; None for any other path."""
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith(REPOSITORY_MODELS_PREFIX):
        return None
    parts = path[len(REPOSITORY_MODELS_PREFIX) :].split("/")
    if len(parts) != 2 or parts[1] not in REPOSITORY_ACTIONS:
        return None
    model = _decoded_name(parts[0])
    return None if model is None else (model, parts[1])


def repository_path(model: str, action: str) -> str:
    """``/v2/repository/models/{model}/{action}``."""
    return f"{REPOSITORY_MODELS_PREFIX}{model}/{action}"


def infer_path(model: str, version: str | None = None) -> str:
    """``/v2/models/{model}[/versions/{version}]/infer``."""
    if version:
        return f"/v2/models/{model}/versions/{version}/infer"
    return f"/v2/models/{model}/infer"


# -- headers (lower case) ----------------------------------------------------------------------
#: Request: the priority class (an integer, or a class name) when the body has none.
PRIORITY_HEADER = "x-evenserve-priority"
#: Request: the deadline in milliseconds after arrival when the body has none.
DEADLINE_HEADER = "x-evenserve-deadline-ms"
#: Request (OpenAI routes of LLM models, read by the gateway's LLM router): the request's
#: time-to-first-token and time-per-output-token targets, milliseconds.
TTFT_HEADER = "x-evenserve-ttft-ms"
TPOT_HEADER = "x-evenserve-tpot-ms"
#: Response: why the worker refused the request (one of REFUSAL_REASONS).
REASON_HEADER = "x-evenserve-reason"
#: Response header (gRPC: trailing metadata) with the milliseconds an inference request
#: waited for its model's load (requests that arrived while it was LOADING).
LOAD_WAIT_HEADER = "x-evenserve-load-wait-ms"
#: Response (from the gateway): the backend that answered.
BACKEND_HEADER = "x-evenserve-backend"
#: Response (from the worker, relayed by the gateway): milliseconds the request waited in
#: its queue before its batch started, and its batch's compute time (answered requests).
QUEUE_MS_HEADER = "x-evenserve-queue-ms"
COMPUTE_MS_HEADER = "x-evenserve-compute-ms"
#: Response of ``GET /admin/log``: the first returned record's ``t_s`` on the recorder's
#: clock (its lines' ``t_s`` are relative to that record).
LOG_ORIGIN_HEADER = "x-evenserve-log-origin-s"
#: Response of ``GET /admin/log``: the last sequence number returned (resume after it).
LOG_LAST_SEQ_HEADER = "x-evenserve-log-last-seq"
RETRY_AFTER_HEADER = "retry-after"
#: KServe v2 binary tensor extension: length of the JSON part of the body (KServe's spelling;
#: header names are case-insensitive).
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"

# -- refusals ----------------------------------------------------------------------------------
#: 429: the model's queue is full of requests of this class or higher.
QUEUE_FULL = "queue-full"
#: 429: the request was queued, then made room for a request of a higher class.
SHED = "shed"
#: 504 at once: the latency profile says the deadline cannot be met even alone.
DEADLINE_INFEASIBLE = "deadline-infeasible"
#: 504: while it waited the request could no longer finish by its deadline.
DEADLINE_EXPIRED = "deadline-expired"
#: 503 with Retry-After: the request waited longer than the device's load bound
#: (``load_wait``) for its model to finish loading.
LOAD_TIMEOUT = "load-timeout"
REFUSAL_REASONS = (QUEUE_FULL, SHED, DEADLINE_INFEASIBLE, DEADLINE_EXPIRED, LOAD_TIMEOUT)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one inference answer is told on each transport and counted: the HTTP status, the
    gRPC status code's name (``grpc.StatusCode[grpc_code]``) and the ``outcome`` label of
    ``evenserve_worker_requests_total`` (``metrics.names.OUTCOMES``)."""

    http_status: int
    grpc_code: str
    label: str


# -- the worker's outcome table (both its fronts answer from it) --------------------------------
ANSWERED = Outcome(200, "OK", "success")
#: A malformed request, a missing/unexpected/mistyped/misshapen input, a bad parameter.
BAD_REQUEST = Outcome(400, "INVALID_ARGUMENT", "bad_request")
#: A body over the limit (gRPC: grpcio refuses the message before the worker sees it).
TOO_LARGE = Outcome(413, "RESOURCE_EXHAUSTED", "too_large")
#: A Content-Encoding the worker does not decode (HTTP only).
UNSUPPORTED_ENCODING = Outcome(415, "INVALID_ARGUMENT", "bad_request")
#: No such model or version.
MODEL_NOT_FOUND = Outcome(404, "NOT_FOUND", "not_found")
#: Not ready, shutting down, the model loading, unloading or unloaded.
UNAVAILABLE = Outcome(503, "UNAVAILABLE", "unavailable")
#: The runtime failed.
FAILED = Outcome(500, "INTERNAL", "error")
#: Each refusal's outcome.
REFUSAL_OUTCOMES: Mapping[str, Outcome] = {
    QUEUE_FULL: Outcome(429, "RESOURCE_EXHAUSTED", "rejected_queue_full"),
    SHED: Outcome(429, "RESOURCE_EXHAUSTED", "shed"),
    DEADLINE_INFEASIBLE: Outcome(504, "DEADLINE_EXCEEDED", "deadline_infeasible"),
    DEADLINE_EXPIRED: Outcome(504, "DEADLINE_EXCEEDED", "deadline_expired"),
    LOAD_TIMEOUT: Outcome(503, "UNAVAILABLE", "unavailable"),
}
#: HTTP status of each refusal.
REFUSAL_STATUS: Mapping[str, int] = {r: o.http_status for r, o in REFUSAL_OUTCOMES.items()}
#: The outcome of a request refused as malformed, by the HTTP status its check gave.
PROTOCOL_OUTCOMES: Mapping[int, Outcome] = {
    400: BAD_REQUEST,
    413: TOO_LARGE,
    415: UNSUPPORTED_ENCODING,
}
#: Simulator-only drop reason: no device hosts the model (the gateway answers 503).
NO_BACKEND = "no-backend"
#: 429 from the gateway itself (and the simulator's drop reason for it): every healthy host
#: of the model is full or predicted to start the request later than the model's SLO
#: (policy.routing.refusal). Also the gateway's outcome label for it.
OVERLOADED = "overloaded"

# -- classes and deadlines ---------------------------------------------------------------------
#: Priority classes by name; higher numbers are served first.
PRIORITY_CLASSES: Mapping[str, int] = {"offline": 0, "online": 10}
ONLINE = PRIORITY_CLASSES["online"]
OFFLINE = PRIORITY_CLASSES["offline"]


#: The priority classes a request may ask for (a 32-bit integer, as Triton's).
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
#: Longer texts are refused before they are converted (a number of them has no use).
MAX_NUMBER_TEXT = 64


def shown(value: object, limit: int = 40) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def shown_name(value: str) -> str:
    """A model name or version a client sent, for an error message: whole when it could be a
    routable name (``MAX_NAME_LENGTH`` characters; HTTP's routes admit no longer), cut beyond
    as ``shown`` cuts (a gRPC request's names are unbounded, and an error message travels in
    a header the client bounds: about 8 KiB in grpcio)."""
    return shown(value, MAX_NAME_LENGTH + 2)


def parse_priority(value: object, where: str) -> int | None:
    """A priority class: an integer (higher first) in PRIORITY_MIN..PRIORITY_MAX, the same in
    text, or a class name.

    None when absent; ValueError naming ``where`` otherwise."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        if len(text) <= MAX_NUMBER_TEXT:
            try:
                number = int(text)
            except ValueError:
                number = None
    if number is not None and PRIORITY_MIN <= number <= PRIORITY_MAX:
        return number
    raise ValueError(
        f"{where}: must be an integer in {PRIORITY_MIN}..{PRIORITY_MAX} or one of "
        f"{', '.join(PRIORITY_CLASSES)}, got {shown(value)}"
    )


def parse_deadline_ms(value: object, where: str) -> float | None:
    """A deadline in milliseconds after arrival (a finite number > 0, or one in text).

    None when absent; ValueError naming ``where`` otherwise."""
    if value is None:
        return None
    number: float | None = None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and len(value) <= MAX_NUMBER_TEXT:
            number = float(value.strip())
    except (ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number) or number <= 0:
        raise ValueError(f"{where}: must be a number of milliseconds > 0, got {shown(value)}")
    return number


# -- JSON bodies -------------------------------------------------------------------------------
#: The deepest nesting of arrays and objects a request body may have (a v2 request needs its
#: object, ``inputs``, an input, and one level per tensor dimension).
MAX_JSON_DEPTH = 64
#: An integer of more digits fits no tensor datatype and no field; it is read as an
#: OversizedNumber (never converted: Python refuses more than 4300 digits, slowly).
MAX_INT_DIGITS = 40
_DEPTH_CHUNK = 1 << 20
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_LONG_DIGITS_RE = re.compile(b"[0-9]{%d}" % (MAX_INT_DIGITS + 1))
#: An integer of this many digits may be one orjson reads as a float (it keeps integers exact
#: only within -2**63 .. 2**64 - 1; every integer of fewer digits is within).
_ORJSON_EXACT_DIGITS = 19
#: ``bytes.translate`` table for ``has_long_integer``: digits -> "0", the bytes that may stand
#: before the digits of a fraction or an exponent (``.``, ``e``, ``E``, ``+``) -> ".", a quote
#: -> "q" (a string that begins with digits is no number), every other byte -> " ".
_CLASSES = bytes(
    ord("0") if c in b"0123456789" else ord(".") if c in b".eE+" else ord("q") if c == 34 else 32
    for c in range(256)
)
_INTEGER_RUN = b"0" * _ORJSON_EXACT_DIGITS
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class OversizedNumber:
    """An integer literal too long to be any value a request may hold; validation then names
    the field that held it (it is no int, so it fits no integer field)."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | OversizedNumber:
    digits = len(text) - (text[0] == "-")
    return OversizedNumber(digits) if digits > MAX_INT_DIGITS else int(text)


def json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in JSON text (brackets inside strings skipped).

    Exact for valid JSON; for invalid JSON some figure (it is refused either way). Linear and
    at C speed (numpy, in chunks of bounded memory): where no string holds a backslash, the
    brackets and quotes are found by vector compares and a bracket after an odd number of
    quotes is inside a string; otherwise strings are cut out by a regular expression first.
    """
    import numpy as np  # only here: most of core's users never read untrusted JSON

    if b"\\" in data:
        return _json_depth_escaped(data)
    whole = np.frombuffer(data, dtype=np.uint8)
    depth = deepest = 0
    quotes_before = 0
    for start in range(0, len(whole), _DEPTH_CHUNK):
        chunk = whole[start : start + _DEPTH_CHUNK]
        folded = chunk | 0x20  # "[" -> "{", "]" -> "}"; no other byte folds onto them
        opens = np.flatnonzero(folded == 0x7B)
        closes = np.flatnonzero(folded == 0x7D)
        quotes = np.flatnonzero(chunk == 0x22)
        if len(quotes):
            opens = opens[(np.searchsorted(quotes, opens) + quotes_before) % 2 == 0]
            closes = closes[(np.searchsorted(quotes, closes) + quotes_before) % 2 == 0]
            quotes_before += len(quotes)
        if not len(opens) and not len(closes):
            continue
        at = np.concatenate((opens, closes))
        step = np.concatenate((np.ones(len(opens), np.int64), np.full(len(closes), -1)))
        levels = np.cumsum(step[np.argsort(at, kind="stable")]) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


def _json_depth_escaped(data: bytes) -> int:
    """``json_depth`` of text whose strings may hold escapes: strings cut out first."""
    import numpy as np

    kept = _STRING_RE.sub(b"", data) if b'"' in data else data
    brackets = np.frombuffer(kept.translate(None, _NOT_BRACKET), dtype=np.uint8)
    depth = deepest = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        chunk = brackets[start : start + _DEPTH_CHUNK]
        levels = np.cumsum(np.where((chunk == 0x5B) | (chunk == 0x7B), 1, -1)) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


def json_too_deep(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """``json_depth(data) > max_depth``, without the scan when there are too few brackets
    (counted with ``bytes.find``, which skips ahead at memchr's speed, up to the first one
    too many)."""
    seen = 0
    for bracket in (b"[", b"{"):
        at = data.find(bracket)
        while at >= 0:
            seen += 1
            if seen > max_depth:
                return json_depth(data) > max_depth
            at = data.find(bracket, at + 1)
    return False


def has_long_integer(data: bytes) -> bool:
    """Whether JSON text may hold an integer literal of 19 digits or more (one orjson could
    read as a float). A digit run right after ``.``, ``e``, ``E`` or ``+`` is a fraction or an
    exponent, not an integer: ``0.00020164294983260334`` is a float to everyone. Errs only
    towards True (a string with a long run of digits after a space or a sign, an exponent of
    19 digits after ``e-``). Two C-speed passes (``bytes.translate``, ``bytes.find``)."""
    classes = data.translate(_CLASSES)
    return classes.find(b" " + _INTEGER_RUN) >= 0 or classes.startswith(_INTEGER_RUN)


def parse_json(
    data: bytes,
    where: str = "body",
    max_depth: int = MAX_JSON_DEPTH,
    *,
    exact_integers: bool = True,
) -> Any:
    """Untrusted JSON: nesting deeper than ``max_depth`` is refused before parsing, integers
    of more than MAX_INT_DIGITS digits become OversizedNumber. ValueError naming ``where``:
    ``body: JSON nested too deep (over 64 levels)``, ``body: not valid JSON: ...``.

    UTF-8, or UTF-16/32 as ``json.loads`` detects them (recoded to UTF-8 first: there the depth
    scan is exact). Read by orjson (5-10x json's speed on tensor bodies: bench/worker_decode.py),
    except text that may hold an integer orjson would read as a float (``has_long_integer``:
    19 digits or more; floats of any length do not count), which json reads exactly. With
    ``exact_integers=False`` that scan is skipped and such an integer may come back as a float:
    for callers that treat a float where an integer belongs as an error and then read the text
    again exactly (``worker.kserve.parse_infer_request``), so a valid body pays no scan."""
    too_deep = f"{where}: JSON nested too deep (over {max_depth} levels)"
    try:
        encoding = json.detect_encoding(data)
        if encoding not in ("utf-8", "utf-8-sig"):
            data = data.decode(encoding).encode("utf-8")
    except UnicodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {str(exc)[:200]}") from None
    if json_too_deep(data, max_depth):
        raise ValueError(too_deep)
    try:
        if not exact_integers or not has_long_integer(data):
            # What orjson refuses (1e400, NaN, bad JSON) is read again by json below, so the
            # error names the field where json reads a value (1e400 is inf) as before.
            with contextlib.suppress(orjson.JSONDecodeError):
                return orjson.loads(data)
        parse_int = _parse_int if _LONG_DIGITS_RE.search(data) else None
        return json.loads(data, parse_int=parse_int)
    except RecursionError:  # the scan refuses far less deep: a second guard only
        raise ValueError(too_deep) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{where}: not valid JSON: {str(exc)[:200]}") from None
