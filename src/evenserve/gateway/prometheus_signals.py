"""Turn a Prometheus text exposition into a LoadSample, through a configurable mapping.

This is how the gateway reads servers we did not write (Triton out of the box: pending request
count, GPU utilization, GPU memory), and LLM servers (``llm_samples_from_text``: an
OpenAI-compatible server's waiting and running sequences, KV use, preemptions, prefix-cache
hits and KV configuration per model, through an ``LlmMetricMapping``: vLLM, SGLang, TGI,
TensorRT-LLM). The parser reads only sample lines of the metrics the
mapping names (the rest of a large /metrics text is skipped by a prefix check), so polling it
every 100 ms stays cheap. A signal whose metric is absent is unknown (None), never zero; a text
without the queue metric yields no sample at all, and the router then falls back to its own
in-flight counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from evenserve.cluster.prometheus_mapping import (
    LLM_ENGINES,
    LLM_PRESETS,
    LlmMetricMapping,
    LlmMetricRef,
    MetricRef,
    PrometheusMapping,
)
from evenserve.core.types import LoadSample
from evenserve.policy.llm_routing.base import EngineSample

Series = list[tuple[dict[str, str], float]]


class PrometheusParseError(ValueError):
    """A sample line that is not valid Prometheus text."""


def _parse_labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i >= n:
            break
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            raise PrometheusParseError(f"bad label set in line: {line!r}")
        key = text[i:eq].strip()
        j = eq + 2
        buf: list[str] = []
        while j < n and text[j] != '"':
            c = text[j]
            if c == "\\" and j + 1 < n:
                nxt = text[j + 1]
                buf.append("\n" if nxt == "n" else nxt)
                j += 2
                continue
            buf.append(c)
            j += 1
        if j >= n:
            raise PrometheusParseError(f"unterminated label value in line: {line!r}")
        labels[key] = "".join(buf)
        i = j + 1
    return labels


def parse_samples(text: str, names: Iterable[str]) -> dict[str, Series]:
    """Samples of the named metrics: name -> [(labels, value)]. Other metrics are skipped."""
    wanted = set(names)
    out: dict[str, Series] = {n: [] for n in wanted}
    prefixes = tuple(wanted)
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#" or not line.startswith(prefixes):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            close = line.rfind("}")
            if close < brace:
                raise PrometheusParseError(f"unbalanced braces in line: {line!r}")
            name = line[:brace]
            labels = _parse_labels(line[brace + 1 : close], line)
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name, labels, rest = parts[0], {}, parts[1:]
        if name not in wanted:
            continue  # a longer name sharing the prefix (e.g. _count of a summary)
        if not rest:
            raise PrometheusParseError(f"no value in line: {line!r}")
        try:
            value = float(rest[0])
        except ValueError:
            raise PrometheusParseError(f"bad value in line: {line!r}") from None
        out[name].append((labels, value))
    return out


#: How the samples a MetricRef selects become one figure.
AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": lambda values: sum(values) / len(values),
    "max": max,
    "min": min,
}


def _aggregate(values: list[float], ref: MetricRef) -> float | None:
    return AGGREGATES[ref.aggregate](values) * ref.scale if values else None


def mapped_metric_names(mapping: PrometheusMapping) -> list[str]:
    refs: list[MetricRef | None] = [
        mapping.queue_depth,
        mapping.in_flight,
        mapping.utilization,
        mapping.memory_used_bytes,
        mapping.memory_total_bytes,
    ]
    return sorted({r.metric for r in refs if r is not None})


def sample_from_text(
    text: str, mapping: PrometheusMapping, received_at_s: float
) -> LoadSample | None:
    """The LoadSample a metrics text describes, or None if it lacks the queue metric."""
    series = parse_samples(text, mapped_metric_names(mapping))

    def selected(ref: MetricRef) -> Series:
        want = ref.labels.items()
        return [(lb, v) for lb, v in series[ref.metric] if all(lb.get(k) == x for k, x in want)]

    def value(ref: MetricRef | None) -> float | None:
        return None if ref is None else _aggregate([v for _, v in selected(ref)], ref)

    q_ref = mapping.queue_depth
    q_series = selected(q_ref)
    queue = _aggregate([v for _, v in q_series], q_ref)
    if queue is None:
        return None
    by_model: dict[str, float] = {}
    if q_ref.by_model_label:
        for labels, v in q_series:
            m = labels.get(q_ref.by_model_label)
            if m is not None:
                by_model[m] = by_model.get(m, 0.0) + v * q_ref.scale
    util = value(mapping.utilization)
    if util is not None:
        util = min(1.0, max(0.0, util))
    return LoadSample(
        timestamp_s=received_at_s,
        queue_depth=max(0.0, queue),
        in_flight=max(0.0, value(mapping.in_flight) or 0.0),
        utilization=util,
        memory_used_bytes=value(mapping.memory_used_bytes),
        memory_total_bytes=value(mapping.memory_total_bytes),
        queued_by_model=by_model,
    )


# -- LLM servers ----------------------------------------------------------------------------


def llm_mapping(engine: str) -> LlmMetricMapping:
    """The mapping of an engine family (``LLM_PRESETS``)."""
    return LlmMetricMapping.model_validate(LLM_PRESETS[engine])


#: Every preset's mapping, validated once.
LLM_MAPPINGS: dict[str, LlmMetricMapping] = {e: llm_mapping(e) for e in LLM_ENGINES}


def detect_engine(text: str) -> str | None:
    """The engine family whose ``waiting`` metric the text has (``LLM_ENGINES``' order),
    or None: the text is no LLM server's we know."""
    names = {n for m in LLM_MAPPINGS.values() for n in m.waiting.metrics}
    series = parse_samples(text, names)
    for engine, m in LLM_MAPPINGS.items():
        if any(series[n] for n in m.waiting.metrics):
            return engine
    return None


def _per_model(
    series: dict[str, Series], ref: LlmMetricRef | None, model_label: str | None
) -> dict[str | None, float]:
    """``ref``'s value per model (key None: series without the model label), from the first
    of its metrics the text has; a model without samples is absent."""
    if ref is None:
        return {}
    want = ref.labels.items()
    for name in ref.metrics:
        found = series.get(name)
        if not found:
            continue
        got: dict[str | None, list[float]] = {}
        for labels, v in found:
            if not all(labels.get(k) == x for k, x in want):
                continue
            key = labels.get(model_label) if model_label is not None else None
            got.setdefault(key, []).append(v)
        if got:
            agg = AGGREGATES[ref.aggregate]
            return {k: agg(vs) * ref.scale for k, vs in got.items()}
    return {}


def _int_label(value: str | None) -> int | None:
    try:
        n = int(float(value)) if value is not None else None
    except ValueError:
        return None
    return n if n is not None and n > 0 else None


def llm_samples_from_text(
    text: str, mapping: LlmMetricMapping, taken_s: float
) -> dict[str | None, EngineSample]:
    """Per model (key None: the server's series name no model), the EngineSample the text
    describes, read at ``taken_s``; empty when it lacks the ``waiting`` metric. A signal the
    text lacks is None in the sample (unknown), never zero."""
    series = parse_samples(text, mapping.metric_names())
    label = mapping.model_label
    waiting = _per_model(series, mapping.waiting, label)
    if not waiting:
        return {}
    running = _per_model(series, mapping.running, label)
    usage = _per_model(series, mapping.kv_usage, label)
    preempt = _per_model(series, mapping.preemptions, label)
    queries = _per_model(series, mapping.prefix_queries, label)
    hits = _per_model(series, mapping.prefix_hits, label)
    blocks = _per_model(series, mapping.kv_blocks, label)
    block_tokens = _per_model(series, mapping.block_tokens, label)
    kv_tokens = _per_model(series, mapping.kv_tokens, label)
    info: dict[str | None, tuple[int | None, int | None]] = {}
    ci = mapping.cache_info
    if ci is not None:
        for labels, _v in series.get(ci.metric, []):
            key = labels.get(label) if label is not None else None
            size = _int_label(labels.get(ci.block_size_label)) if ci.block_size_label else None
            n = _int_label(labels.get(ci.num_blocks_label)) if ci.num_blocks_label else None
            info[key] = (size, n)

    def pick(d: dict[str | None, float], key: str | None) -> float | None:
        v = d.get(key)
        return d.get(None) if v is None else v

    out: dict[str | None, EngineSample] = {}
    for key, w in waiting.items():
        u = pick(usage, key)
        q, h = pick(queries, key), pick(hits, key)
        size, n = info.get(key, info.get(None, (None, None)))
        b, bt = pick(blocks, key), pick(block_tokens, key)
        p = pick(preempt, key)
        t = pick(kv_tokens, key)
        out[key] = EngineSample(
            taken_s=taken_s,
            running=max(0, int(pick(running, key) or 0)),
            waiting=max(0, int(w)),
            kv_usage=None if u is None else min(1.0, max(0.0, u)),
            preemptions=None if p is None else int(p),
            prefix_hit_rate=None if q is None or h is None or q <= 0 else min(1.0, h / q),
            kv_blocks=n if n is not None else (int(b) if b and b > 0 else None),
            block_tokens=size if size is not None else (int(bt) if bt and bt > 0 else None),
            kv_tokens=int(t) if t and t >= 1 else None,
        )
    return out
