"""A model's statistics through the gateway: Triton's statistics extension summed over every
backend that hosts it, so a client (perf_analyzer's server-side section, tritonclient's
``get_inference_statistics``) sees the cluster's figures, not one worker's.

Summed: ``inference_count``, ``execution_count``, every ``{count, ns}`` of
``inference_stats`` and of each ``batch_stats`` entry (merged by ``batch_size``);
``last_inference`` is the latest. A figure a backend does not report counts as zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson

from evenserve.core.wire import ModelPath
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.forwarder import Forwarder


def _add_duration(into: dict[str, Any], d: Any) -> None:
    if isinstance(d, dict):
        into["count"] = into.get("count", 0) + int(d.get("count", 0))
        into["ns"] = into.get("ns", 0) + int(d.get("ns", 0))


def aggregate_model_stats(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``model_stats`` entry from each backend's entry for the same model."""
    if not entries:
        raise ValueError("no statistics to aggregate")
    first = entries[0]
    inference: dict[str, dict[str, Any]] = {}
    batches: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {
        "name": first.get("name"),
        "version": first.get("version"),
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
    }
    for e in entries:
        out["last_inference"] = max(out["last_inference"], int(e.get("last_inference", 0)))
        out["inference_count"] += int(e.get("inference_count", 0))
        out["execution_count"] += int(e.get("execution_count", 0))
        for key, d in (e.get("inference_stats") or {}).items():
            _add_duration(inference.setdefault(key, {"count": 0, "ns": 0}), d)
        for b in e.get("batch_stats") or []:
            size = int(b.get("batch_size", 0))
            merged = batches.setdefault(size, {"batch_size": size})
            for key, d in b.items():
                if key != "batch_size":
                    _add_duration(merged.setdefault(key, {"count": 0, "ns": 0}), d)
    out["inference_stats"] = inference
    out["response_stats"] = {}
    out["batch_stats"] = [batches[s] for s in sorted(batches)]
    out["memory_usage"] = []
    return out


async def collect_model_stats(
    registry: BackendRegistry, forwarder: Forwarder, model: str, path: str
) -> tuple[dict[str, Any] | None, list[str]]:
    """``model``'s statistics summed over every healthy backend hosting it (HTTP ``path``:
    ``/v2/models/{m}[/versions/{v}]/stats``), and the backends that answered; None when none
    did. The HTTP and the gRPC front both answer with this."""
    hosts = [v.name for v in registry.router.candidates(model)]
    replies = await asyncio.gather(
        *(forwarder.request("GET", registry.url(n), path, b"", {}) for n in hosts),
        return_exceptions=True,
    )
    entries: list[dict[str, Any]] = []
    named: list[str] = []
    for name, reply in zip(hosts, replies, strict=True):
        if isinstance(reply, BaseException) or reply.status != 200:
            continue
        try:
            doc = orjson.loads(reply.body)
            entries += [e for e in doc["model_stats"] if isinstance(e, dict)]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        named.append(name)
    if not entries:
        return None, named
    return aggregate_model_stats(entries), named


async def collect_all_stats(
    registry: BackendRegistry, forwarder: Forwarder, version: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every served model's summed statistics (``/v2/models/stats``; gRPC ModelStatistics
    with an empty name), skipping a model no backend answered for; the backends that did."""
    models = registry.models()
    got = await asyncio.gather(
        *(
            collect_model_stats(registry, forwarder, m, ModelPath(m, version, "stats").path())
            for m in models
        )
    )
    entries = [merged for merged, _ in got if merged is not None]
    return entries, sorted({n for _, hosts in got for n in hosts})
