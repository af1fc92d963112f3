"""Each variant's figures, the report, the choice (the highest throughput that passes) and
the chosen variant's ``variant.yaml`` with its provenance."""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import evenserve
from evenserve.runtime.device import DeviceTarget
from evenserve.worker import gate
from evenserve.worker.optimize.build import relative
from evenserve.worker.optimize.variants import VariantKind
from evenserve.worker.repository import VARIANT_FILE, ModelEntry

REPORT_FILE = "optimize.json"


@dataclass
class VariantResult:
    """One variant's figures; ``status``: chosen | passed | rejected | unsupported | failed."""

    kind: VariantKind
    status: str = "passed"
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gate: gate.GateResult | None = None
    precision_check: dict[str, Any] | None = None
    latency_ms: dict[int, float] = field(default_factory=dict)
    profile_path: str | None = None
    weights_mb: float | None = None
    throughput_rps: float | None = None
    best_batch: int | None = None
    meets_slo: bool | None = None
    build: dict[str, Any] = field(default_factory=dict)
    section: dict[str, Any] | None = None
    runtime_kind: str | None = None

    @property
    def usable(self) -> bool:
        return self.status in ("passed", "chosen")

    def reject(self, reason: str) -> None:
        if self.status in ("passed", "chosen"):
            self.status = "rejected"
        self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        g = self.gate
        gate_out: dict[str, Any] = (
            {"passed": False, "top1_agreement": None, "cosine": None}
            if g is None
            else {
                "passed": g.passed,
                "top1_agreement": g.top1_agreement,
                "cosine": g.cosine,
                "cosine_min": g.cosine_min,
                "items": g.items,
                "nonfinite_items": g.nonfinite_items,
                "reasons": g.reasons,
            }
        )
        return {
            "precision": self.kind.precision,
            "engine": self.kind.engine,
            "quantization": self.kind.quantization,
            "status": self.status,
            "reasons": self.reasons,
            "notes": self.notes,
            "gate": gate_out,
            "precision_check": self.precision_check,
            "profile": None
            if not self.latency_ms
            else {
                "path": self.profile_path,
                "latency_ms": {str(b): ms for b, ms in sorted(self.latency_ms.items())},
                "weights_mb": self.weights_mb,
            },
            "throughput_rps": self.throughput_rps,
            "best_batch": self.best_batch,
            "meets_slo": self.meets_slo,
            "build": self.build,
        }


@dataclass
class OptimizeReport:
    model: str
    device: str
    slo_ms: float | None
    gate_set: dict[str, Any]
    thresholds: dict[str, Any]
    variants: dict[str, VariantResult]
    chosen: str | None
    written: str | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        fp32 = self.variants.get("fp32")
        base = fp32.throughput_rps if fp32 is not None else None
        return {
            "model": self.model,
            "device": self.device,
            "slo_ms": self.slo_ms,
            "gate_set": self.gate_set,
            "thresholds": self.thresholds,
            "variants": {
                n: {
                    **v.to_dict(),
                    "speedup_vs_fp32": None
                    if not base or v.throughput_rps is None
                    else round(v.throughput_rps / base, 3),
                }
                for n, v in self.variants.items()
            },
            "chosen": self.chosen,
            "written": self.written,
            "seconds": round(self.seconds, 1),
        }


def choose(results: Mapping[str, VariantResult]) -> str | None:
    """The usable variant of the highest throughput (ties: the earlier, fp32 first)."""
    best: tuple[float, str] | None = None
    for name, r in results.items():
        if not r.usable or r.throughput_rps is None:
            continue
        if best is None or r.throughput_rps > best[0]:
            best = (r.throughput_rps, name)
    return None if best is None else best[1]


def write_variant(
    entry: ModelEntry, device: DeviceTarget, report: OptimizeReport, root: Path
) -> Path:
    """``variant.yaml`` of the chosen variant, with its provenance."""
    assert report.chosen is not None
    r = report.variants[report.chosen]
    fp32 = report.variants.get("fp32")
    assert r.runtime_kind is not None and r.section is not None
    provenance = {
        "chosen_by": f"evenserve optimize {evenserve.__version__}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node() or "this host",
        "device": device.name,
        "variant": r.kind.description,
        "throughput_rps": r.throughput_rps,
        "best_batch": r.best_batch,
        "fp32_throughput_rps": None if fp32 is None else fp32.throughput_rps,
        "gate": None if r.gate is None else r.gate.to_dict(),
        "gate_set": report.gate_set,
        "precision_check": None if r.precision_check is None else r.precision_check["passed"],
        "build": r.build,
        "report": relative(root / REPORT_FILE, entry.directory),
        "rejected": {
            n: v.reasons
            for n, v in report.variants.items()
            if v.status != "passed" and n != report.chosen
        },
    }
    doc = {
        "variant": report.chosen,
        "runtime": r.runtime_kind,
        r.runtime_kind: r.section,
        "profile": r.profile_path,
        "provenance": provenance,
    }
    path = entry.directory / VARIANT_FILE
    header = (
        f"# Written by `evenserve optimize` ({provenance['date']}): {entry.name} is served as "
        f"the {report.chosen} variant.\n# Delete this file (or set use_variant: false in "
        "model.yaml) to serve model.yaml as written.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return path
