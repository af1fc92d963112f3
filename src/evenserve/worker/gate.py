"""The correctness gate of a cheaper variant: its outputs against the fp32 reference's.

Two figures on the same gate set (a calibration set or synthetic inputs):

- **top-1 agreement**: the fraction of predictions (the argmax over the output's last axis,
  per item; per position for an output with more axes, like token classification) where the
  variant picks the class fp32 picks.
- **cosine**: the cosine similarity of each item's flattened output with fp32's, averaged
  over the items (the minimum is reported too). It sees what top-1 hides: logits that drift
  while the winner stays.

An item whose output holds NaN or inf (fp16 overflow, a broken kernel) disagrees and has
cosine -1: a variant that produces them never passes. Pure numpy: no framework, no clock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class GateResult:
    """The figures of one variant on the gate set, and the verdict."""

    passed: bool
    top1_agreement: float
    cosine: float
    cosine_min: float
    items: int
    nonfinite_items: int
    min_top1_agreement: float
    min_cosine: float
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    reference: NDArray[Any],
    candidate: NDArray[Any],
    *,
    min_top1_agreement: float,
    min_cosine: float,
) -> GateResult:
    """Gate ``candidate`` against ``reference`` (both ``[items, ...]`` of one output)."""
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(candidate, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValueError(f"output shapes differ: reference {ref.shape}, variant {got.shape}")
    if ref.ndim == 0 or ref.shape[0] == 0:
        raise ValueError("the gate set is empty")
    items = ref.shape[0]
    finite: NDArray[np.bool_] = np.asarray(np.isfinite(got.reshape(items, -1)).all(axis=1))
    nonfinite = int(items - finite.sum())
    # Top-1 per item (and per position for outputs of more than one axis per item).
    if ref.ndim == 1:
        agree = np.isclose(ref, got) & finite  # a scalar output: agreement is equality
    else:
        same = np.argmax(ref, axis=-1) == np.argmax(np.nan_to_num(got), axis=-1)
        agree = same.reshape(items, -1) & finite[:, None]
    top1 = float(agree.mean())
    a = ref.reshape(items, -1)
    b = np.where(finite[:, None], got.reshape(items, -1), 0.0)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, (a * b).sum(axis=1) / norms, 0.0)
    # Both all-zero: the same output.
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cos = np.where(both_zero, 1.0, cos)
    cos = np.where(finite, cos, -1.0)
    # Judged as reported (6 decimals): fp32 against itself is 1.0, not 0.9999999999999998.
    top1 = round(top1, 6)
    mean_cos, min_cos = round(float(cos.mean()), 6), round(float(cos.min()), 6)
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} of {items} items have non-finite outputs (NaN or inf)")
    if top1 < min_top1_agreement:
        reasons.append(f"top-1 agreement {top1:.4f} < {min_top1_agreement} (min_top1_agreement)")
    if mean_cos < min_cosine:
        reasons.append(f"cosine {mean_cos:.4f} < {min_cosine} (min_cosine)")
    return GateResult(
        passed=not reasons,
        top1_agreement=top1,
        cosine=mean_cos,
        cosine_min=min_cos,
        items=items,
        nonfinite_items=nonfinite,
        min_top1_agreement=min_top1_agreement,
        min_cosine=min_cosine,
        reasons=reasons,
    )
