"""A running cluster measured over a window, as a run summary ``evenserve diagnose`` reads; and
a recommended parameter change applied to it.

Theory of operation. :func:`collect_live` asks the gateway for its backends
(``GET /admin/backends``, the admin bearer token), reads each backend's load report once
(its models' SLOs), then scrapes every backend for ``window_s`` with the load generator's
own :class:`~evenserve.loadgen.scrape.Scraper` (the load endpoint every 100 ms, ``/metrics``
a few times a window) and reads the gateway's ``/metrics`` at the window's start and end. The
devices' figures are the live bench's: ``loadgen.records.to_records`` over the scrapes and
``report.summary.summarize``, so utilization, queue depth, held idle time, observed vs
profile, input staging and memory are computed by the very code a bench run uses. The
request figures come from the gateway's counters and latency histogram deltas over the
window (no per-request samples: nobody here sent the requests): latency percentiles are
histogram estimates (linear within a bucket, as Prometheus's ``histogram_quantile``), an SLO
attainment only when the SLO is a bucket edge (else None), drops by the gateway's outcome.
The routing spec comes from the gateway's ``/admin/params``; the batching spec per model from
the workers' ``/admin/params`` (the same token, as ``evenserve up`` runs them), overridden by
any the gateway's params set.

:func:`push_recommendation` applies a partial parameter set through the versioned params API
(``GET`` the current version, ``PUT`` with it as ``expected_version``) and returns the new
version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from evenserve.core.errors import EvenserveError
from evenserve.core.wire import LOAD_PATH, METRICS_PATH
from evenserve.httpio.params_client import ParamsAPIError, get_params, push_params
from evenserve.loadgen.records import RunLabels, measured_batch_figures, to_records
from evenserve.loadgen.scrape import Scraper
from evenserve.policy.batching import BATCHING
from evenserve.report.summary import run_summary, summarize

BACKENDS_PATH = "/admin/backends"
PARAMS_PATH = "/admin/params"
#: The gateway's series (``metrics.names``; spelled out: experiments do not import metrics).
GATEWAY_REQUESTS = "evenserve_gateway_requests_total"
GATEWAY_DURATION = "evenserve_gateway_request_duration_seconds"
OK_OUTCOME = "ok"
UNKNOWN_MODEL_LABEL = "_unknown"
LATENCY_NOTE = (
    "latency_ms: estimates from the gateway's request-duration histogram over the window "
    "(linear within a bucket); slo_attainment: the share of the window's requests answered "
    "ok within the SLO, known only when the SLO is a bucket edge"
)


class LiveCollectError(EvenserveError):
    """The cluster could not be measured: names the URL and what to do."""


def _r(x: float) -> float:
    return round(x, 6)


async def _get(
    session: aiohttp.ClientSession, url: str, token: str | None, what: str
) -> tuple[int, Any]:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    try:
        async with session.get(url, headers=headers) as resp:
            text = await resp.text()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise LiveCollectError(
            f"{url}: no answer ({type(exc).__name__}: {exc}); is the {what} running, and is "
            "this its URL?"
        ) from None
    if what == "metrics":
        return status, text
    try:
        return status, json.loads(text)
    except ValueError:
        return status, None


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _requests(
    fams: Mapping[str, list[tuple[dict[str, str], float]]],
) -> dict[tuple[str, str], float]:
    """(model, outcome) -> requests so far, summed over backends."""
    out: dict[tuple[str, str], float] = {}
    for labels, v in fams.get(GATEWAY_REQUESTS, []):
        key = (labels.get("model", ""), labels.get("outcome", ""))
        out[key] = out.get(key, 0.0) + v
    return out


def _buckets(
    fams: Mapping[str, list[tuple[dict[str, str], float]]],
) -> dict[str, dict[float, float]]:
    """model -> bucket upper bound (seconds; inf) -> cumulative count."""
    out: dict[str, dict[float, float]] = {}
    for labels, v in fams.get(GATEWAY_DURATION + "_bucket", []):
        out.setdefault(labels.get("model", ""), {})[float(labels["le"])] = v
    return out


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The ``q`` quantile of a cumulative histogram (bound -> count), linear within its
    bucket as Prometheus's ``histogram_quantile``; None without observations. A quantile in
    the +Inf bucket is the highest finite bound."""
    bounds = sorted(buckets)
    if not bounds:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return prev_b
            if c == prev_c:
                return b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
        prev_b, prev_c = b, c
    return prev_b


def _delta(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[Any, float]:
    return {k: max(0.0, v - a.get(k, 0.0)) for k, v in b.items()}


def request_figures(
    before: str, after: str, window_s: float, slo_ms: Mapping[str, float]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """From two readings of the gateway's ``/metrics``: per model (throughput, latency
    estimates, SLO attainment when the SLO is a bucket edge, drops), the requests' counts,
    and the overall latency estimates."""
    f0, f1 = _families(before), _families(after)
    req = _delta(_requests(f0), _requests(f1))
    b0, b1 = _buckets(f0), _buckets(f1)
    hist = {m: _delta(b0.get(m, {}), h) for m, h in b1.items()}
    models = sorted({m for m, _ in req} | set(hist) | set(slo_ms))
    models = [m for m in models if m and m != UNKNOWN_MODEL_LABEL]
    window = max(window_s, 1e-9)
    per_model: dict[str, Any] = {}
    overall: dict[float, float] = {}
    for m in models:
        h = hist.get(m, {})
        for le, c in h.items():
            overall[le] = overall.get(le, 0.0) + c
        ok = sum(v for (mm, o), v in req.items() if mm == m and o == OK_OUTCOME)
        arrived = sum(v for (mm, _), v in req.items() if mm == m)
        slo = slo_ms.get(m)
        attainment = None
        if slo is not None and math.isfinite(slo) and arrived > 0:
            edge = next(
                (le for le in h if math.isfinite(le) and math.isclose(le, slo / 1000.0)), None
            )
            if edge is not None:
                attainment = _r(min(h[edge], ok) / arrived)
        per_model[m] = {
            "slo_ms": slo,
            "latency_ms": _latency_ms(h),
            "slo_attainment": attainment,
            "throughput_rps": _r(ok / window),
            "completed": round(ok),
            "dropped": round(arrived - ok),
        }
    reasons: dict[str, int] = {}
    for (_, o), v in req.items():
        if o != OK_OUTCOME and v > 0:
            reasons[o] = reasons.get(o, 0) + round(v)
    arrived_all = sum(req.values())
    ok_all = sum(v for (_, o), v in req.items() if o == OK_OUTCOME)
    counts = {
        "arrived": round(arrived_all),
        "completed": round(ok_all),
        "dropped": round(arrived_all - ok_all),
        "dropped_by_reason": dict(sorted(reasons.items())),
    }
    return per_model, counts, _latency_ms(overall)


def _latency_ms(h: Mapping[float, float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        v = histogram_quantile(q, h)
        out[name] = None if v is None else _r(v * 1000.0)
    return out


async def _collect(
    gateway_url: str, window_s: float, token: str | None, timeout_s: float
) -> dict[str, Any]:
    gw = gateway_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        status, body = await _get(session, gw + BACKENDS_PATH, token, "gateway")
        if status == 401:
            raise LiveCollectError(
                f"{gw}{BACKENDS_PATH}: 401, the admin API refused the "
                + ("token given" if token else "request without a token")
                + ": pass the gateway's admin token (the file `evenserve up` writes as "
                "admin-token in its log folder, or $EVENSERVE_ADMIN_TOKEN)"
            )
        if status == 404:
            raise LiveCollectError(
                f"{gw}{BACKENDS_PATH}: 404, the gateway's admin API is off (it has no admin "
                "token): start it with gateway.admin configured"
            )
        if status != 200 or not isinstance(body, dict):
            raise LiveCollectError(
                f"{gw}{BACKENDS_PATH}: HTTP {status}, not the gateway's backends; is {gw} an "
                "evenserve gateway?"
            )
        backends = {str(b["name"]): str(b["url"]) for b in body.get("backends", []) if b.get("url")}
        if not backends:
            raise LiveCollectError(f"{gw}{BACKENDS_PATH}: the gateway has no backends")
        routing_spec: dict[str, Any] = dict(body.get("policy") or {})
        slo_ms: dict[str, float] = {}
        batching: dict[str, dict[str, Any]] = {}
        for url in backends.values():
            with contextlib.suppress(LiveCollectError):
                st, rep = await _get(session, url.rstrip("/") + LOAD_PATH, None, "worker")
                if st == 200 and isinstance(rep, dict):
                    for m, v in (rep.get("slo_ms_by_model") or {}).items():
                        slo_ms.setdefault(str(m), float(v))
            if token is not None:
                with contextlib.suppress(LiveCollectError):
                    st, p = await _get(session, url.rstrip("/") + PARAMS_PATH, token, "worker")
                    if st == 200 and isinstance(p, dict):
                        live = p.get("live") or p.get("params") or {}
                        for m, spec in (live.get("batching_per_model") or {}).items():
                            batching.setdefault(str(m), spec)
        if token is not None:
            with contextlib.suppress(LiveCollectError):
                st, p = await _get(session, gw + PARAMS_PATH, token, "gateway")
                if st == 200 and isinstance(p, dict):
                    params = p.get("params") or {}
                    routing_spec = dict(params.get("routing") or routing_spec)
                    for m, spec in (params.get("batching_per_model") or {}).items():
                        if spec is not None:
                            batching[str(m)] = spec
        t0 = time.perf_counter()
        _, before = await _get(session, gw + METRICS_PATH, None, "metrics")
        scraper = Scraper(
            backends, t0, interval_s=0.1, metrics_interval_s=max(0.1, min(1.0, window_s / 4))
        )
        scraper.start(session)
        try:
            await asyncio.sleep(window_s)
            await scraper.final_sample(session)
        finally:
            await scraper.stop()
        end_s = scraper.now()
        _, after = await _get(session, gw + METRICS_PATH, None, "metrics")
    per_model, counts, latency = request_figures(str(before), str(after), end_s, slo_ms)
    labels = RunLabels(
        scenario="live",
        arm="live",
        routing=str(routing_spec.get("policy", "")),
        batching="",
        seed=0,
        slo_ms={m: v for m, v in slo_ms.items()},
        routing_spec=routing_spec,
        batching_spec={m: _resolved(spec) for m, spec in sorted(batching.items())},
    )
    arm = measured_batch_figures(summarize(to_records([], scraper.data, labels, 0.0, end_s)))
    arm["models"] = per_model
    arm["requests"] = counts
    arm["latency_ms"] = latency
    arm["throughput_rps"] = _r(counts["completed"] / max(end_s, 1e-9))
    arm["slo_attainment"] = None
    arm["note"] = LATENCY_NOTE
    arm["backends"] = backends
    arm["scrape_errors"] = {n: b.last_error for n, b in scraper.data.items() if b.errors}
    return run_summary("live", 0, {"live": arm})


def _resolved(spec: Any) -> dict[str, Any]:
    try:
        return dict(BATCHING.resolved(spec, "batching"))
    except EvenserveError:
        return dict(spec) if isinstance(spec, Mapping) else {"policy": str(spec)}


def collect_live(
    gateway_url: str, window_s: float, token: str | None, *, timeout_s: float = 10.0
) -> dict[str, Any]:
    """The cluster behind ``gateway_url`` measured for ``window_s`` seconds, as a run summary
    (``{"scenario": "live", "seed": 0, "arms": {"live": ARM}}``); LiveCollectError naming
    the URL when the gateway cannot be read."""
    if not (window_s > 0 and math.isfinite(window_s)):
        raise LiveCollectError(f"window: must be a number of seconds > 0, not {window_s!r}")
    return asyncio.run(_collect(gateway_url, window_s, token, timeout_s))


def push_recommendation(gateway_url: str, params_update: Mapping[str, Any], token: str) -> int:
    """Apply a partial parameter set (``routing``, ``batching_per_model``, ...) to the gateway
    (which forwards batching to its workers) on top of the version in force; returns the new
    version. LiveCollectError naming the URL on refusal (401: the token; 409: another change
    came first; 400: the field)."""
    gw = gateway_url.rstrip("/")
    try:
        current = get_params(gw, token)
        reply = push_params(
            gw,
            token,
            dict(params_update),
            expected_version=int(current["version"]),
            note="evenserve diagnose recommendation",
        )
    except ParamsAPIError as exc:
        hint = {
            401: "pass the gateway's admin token",
            409: "another change came first; diagnose again",
            0: "is the gateway running, and is this its URL?",
        }.get(exc.status, "see the message")
        raise LiveCollectError(f"{gw}{PARAMS_PATH}: {exc} ({hint})") from None
    return int(reply["version"])
