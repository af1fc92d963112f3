"""What ``evenserve optimize`` checks of a variant: the gate set and its outputs against
fp32's, the precision that really ran, and the throughput its profile allows under the SLO."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.device import DeviceTarget
from evenserve.worker.optimize.variants import VariantKind
from evenserve.worker.profiler import synthetic_batch
from evenserve.worker.repository import ModelEntry

#: The reference batch of the latency ratio (the largest profiled size up to it).
REFERENCE_BATCH = 8
#: Items a variant that cannot win (slower than fp32) is gated on.
REDUCED_GATE_ITEMS = 64
#: A reduced-precision variant within this ratio of fp32's latency is "no faster".
NO_FASTER = 0.05


# -- the gate set -----------------------------------------------------------------------------
def gate_set(
    entry: ModelEntry, calibration: Path | None, items: int, seed: int
) -> tuple[dict[str, Array], dict[str, Any]]:
    """The inputs every variant is gated on, and how they were made."""
    if calibration is not None:
        try:
            with np.load(calibration) as data:
                arrays = {k: np.asarray(data[k]) for k in data.files}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--calibration: cannot read {calibration}: {exc}") from exc
        out: dict[str, Array] = {}
        for t in entry.config.inputs:
            if t.name not in arrays:
                raise ConfigError(
                    f"--calibration: {calibration} has no array {t.name!r} "
                    f"(has: {', '.join(sorted(arrays)) or 'none'})"
                )
            a = arrays[t.name]
            dims = [d for d in t.shape]
            if a.ndim != len(dims) + 1 or any(
                d != -1 and d != s for d, s in zip(dims, a.shape[1:], strict=True)
            ):
                raise ConfigError(
                    f"--calibration: {t.name}: shape {list(a.shape)} does not fit "
                    f"[items, {', '.join(map(str, dims))}]"
                )
            out[t.name] = a.astype(t.spec().dtype, copy=False)
        counts = {a.shape[0] for a in out.values()}
        if len(counts) != 1 or 0 in counts:
            raise ConfigError(f"--calibration: the arrays hold different item counts {counts}")
        return out, {"source": str(calibration), "items": counts.pop()}
    rng = np.random.default_rng(seed)
    return synthetic_batch(entry, items, {}, rng), {"source": "synthetic", "items": items}


def split_batches(
    inputs: Mapping[str, Array], size: int, limit: int | None = None
) -> list[dict[str, Array]]:
    n = next(iter(inputs.values())).shape[0]
    if limit is not None:
        n = min(n, limit)
    return [{k: v[i : min(i + size, n)] for k, v in inputs.items()} for i in range(0, n, size)]


def run_outputs(runtime: Runtime, batches: Sequence[Mapping[str, Array]], output: str) -> Array:
    """One output of ``runtime`` over the batches, concatenated."""
    return np.concatenate([runtime.run(b)[output] for b in batches])


# -- the checks -------------------------------------------------------------------------------
def precision_check(
    kind: VariantKind,
    evidence: Mapping[str, Any],
    latency_ratio: float | None,
    device: DeviceTarget,
) -> dict[str, Any]:
    """Whether the precision that ran is the one asked for (see the module docstring)."""
    reasons: list[str] = []
    notes: list[str] = []
    expected = kind.precision
    if kind.engine == "onnxruntime":
        seen = str(evidence.get("precision"))
        if seen != expected:
            reasons.append(f"the ONNX graph runs {seen}, {expected} was asked for")
    elif expected == "int8":
        # (A runtime refuses an int8 that converted no layer at all: it fails to build.)
        frac = float(evidence.get("quantized_weight_fraction", 0.0))
        if frac < 0.5:
            reasons.append(
                f"int8 covers {frac:.1%} of the Linear/Conv weights (the rest stays float: "
                "dynamic quantization only converts Linear layers)"
            )
    else:
        want = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[expected]
        weights = {
            k: v
            for k, v in evidence.get("weights_bytes", {}).items()
            if k in ("float32", "float16", "bfloat16", "float64")
        }
        total = sum(weights.values())
        share = weights.get(want, 0.0) / total if total else 0.0
        if share < 0.9:
            reasons.append(f"{share:.0%} of the float weights are {want}, {expected} was asked for")
        acts = evidence.get("activation_dtypes", {})
        n = sum(acts.values())
        act_share = acts.get(want, 0) / n if n else 0.0
        if act_share < 0.5:
            reasons.append(
                f"{act_share:.0%} of the layer outputs are {want}, {expected} was asked for"
            )
    if latency_ratio is not None and expected != "fp32" and abs(latency_ratio - 1.0) <= NO_FASTER:
        msg = (
            f"latency {latency_ratio:.2f}x fp32's: no faster, the reduced precision may not "
            "have run"
        )
        (reasons if device.kind == "cuda" else notes).append(msg)
    return {
        "passed": not reasons,
        "expected": expected,
        "evidence": dict(evidence),
        "latency_ratio_vs_fp32": None if latency_ratio is None else round(latency_ratio, 3),
        "reasons": reasons,
        "notes": notes,
    }


def throughput(
    latency_ms: Mapping[int, float], slo_ms: float | None
) -> tuple[float | None, int | None]:
    """Best items/s over the batch sizes that leave room for the SLO, and that batch size."""
    best: tuple[float | None, int | None] = (None, None)
    for b, ms in sorted(latency_ms.items()):
        if slo_ms is not None and 2.0 * ms > slo_ms:
            continue
        rps = b * 1000.0 / ms
        if best[0] is None or rps > best[0]:
            best = (round(rps, 3), b)
    return best


def ratio_batch(a: Mapping[int, float], b: Mapping[int, float], device: DeviceTarget) -> int | None:
    """The batch size of the latency ratio: on a GPU the largest both profiled (small
    batches there are launch-bound, the same in any precision), else the largest up to
    REFERENCE_BATCH."""
    common = [x for x in a if x in b]
    if not common:
        return None
    if device.kind == "cuda":
        return max(common)
    under = [x for x in common if x <= REFERENCE_BATCH]
    return max(under) if under else min(common)


def evidence_of(runtime: Runtime, batch: Mapping[str, Array]) -> dict[str, Any]:
    """What precision ran: a torch runtime's weights and activations, an ONNX graph's
    initializers and operators (read once, when the ONNX runtime loaded the file)."""
    evidence = getattr(runtime, "precision_evidence", None)
    if evidence is not None:
        return dict(evidence(batch))
    return dict(runtime.describe().get("graph_precision") or {"precision": "unknown"})
