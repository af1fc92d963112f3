"""Turn a Prometheus text exposition into a LoadSample, through a configurable mapping.

This is how the gateway reads servers we did not write (Triton out of the box: pending request
count, GPU utilization, GPU memory). The parser reads only sample lines of the metrics the
mapping names (the rest of a large /metrics text is skipped by a prefix check), so polling it
every 100 ms stays cheap. A signal whose metric is absent is unknown (None), never zero; a text
without the queue metric yields no sample at all, and the router then falls back to its own
in-flight counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from evenserve.cluster.prometheus_mapping import MetricRef, PrometheusMapping
from evenserve.core.types import LoadSample

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
