"""The wire contract between gateway, worker, load generator and simulator, in one place.

Paths (KServe v2, plus evenserve's load endpoint), the ``x-evenserve-*`` headers, the reasons
a request is refused (also the simulator's drop reasons and the ``reason`` label of the
refusal counters), and how a request's priority class and deadline are read from text or
JSON. Every side imports these names from here, so a rename cannot leave one side behind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# -- paths -------------------------------------------------------------------------------------
HEALTH_LIVE_PATH = "/v2/health/live"
HEALTH_READY_PATH = "/v2/health/ready"
SERVER_METADATA_PATH = "/v2"
REPOSITORY_INDEX_PATH = "/v2/repository/index"
#: The worker's load report (JSON), polled by the gateway every signal interval.
LOAD_PATH = "/v2/evenserve/load"
METRICS_PATH = "/metrics"


#: A model's routes (route templates), with and without a version; the model's metadata is
#: the bare path, its ``/ready``, ``/config``, ``/stats`` and ``/infer`` follow it.
MODEL_ROUTES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")
MODEL_STATS_PATH = "/v2/models/stats"


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
#: Response: why the worker refused the request (one of REFUSAL_REASONS).
REASON_HEADER = "x-evenserve-reason"
#: Response (from the gateway): the backend that answered.
BACKEND_HEADER = "x-evenserve-backend"
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
REFUSAL_REASONS = (QUEUE_FULL, SHED, DEADLINE_INFEASIBLE, DEADLINE_EXPIRED)
#: HTTP status of each refusal.
REFUSAL_STATUS: Mapping[str, int] = {
    QUEUE_FULL: 429,
    SHED: 429,
    DEADLINE_INFEASIBLE: 504,
    DEADLINE_EXPIRED: 504,
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


def parse_priority(value: object, where: str) -> int | None:
    """A priority class: an integer (higher first), an integer in text, or a class name.

    None when absent; ValueError naming ``where`` otherwise."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text in PRIORITY_CLASSES:
            return PRIORITY_CLASSES[text]
        try:
            return int(text)
        except ValueError:
            pass
    raise ValueError(
        f"{where}: must be an integer or one of {', '.join(PRIORITY_CLASSES)}, got {value!r}"
    )


def parse_deadline_ms(value: object, where: str) -> float | None:
    """A deadline in milliseconds after arrival (a finite number > 0, or one in text).

    None when absent; ValueError naming ``where`` otherwise."""
    if value is None:
        return None
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number <= 0:
        raise ValueError(f"{where}: must be a number of milliseconds > 0, got {value!r}")
    return number
