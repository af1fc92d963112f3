"""``evenserve optimize``: a model's cheaper variants, gated, profiled, and the cheapest chosen.

For one torch-based model (runtime ``transformers`` or ``torch``) on one device, each variant
the device supports is built and loaded, and then:

1. **Precision check**: the precision asked for is the one that runs. For torch variants the
   dtypes of the weights (qint8 for dynamically quantized layers) and of every leaf module's
   floating outputs during one batch; for ONNX Runtime variants the graph's initializers and
   quantized operators. The latency ratio against fp32 (at batch 8 on the CPU, the largest
   profiled batch on a GPU) is reported: on a GPU a reduced-precision variant no faster
   than fp32 (within 5 %) fails the check (an "fp16" engine that runs fp32), on the CPU it
   is a note (bf16/fp16 without native support is legitimately slower).
2. **Profile** at the batch sizes, as ``evenserve profile`` measures them (same timed call),
   written to ``variants/NAME/profile.yaml``; throughput is the best ``items/s`` over the
   batch sizes whose latency leaves room for the SLO (``2 x latency <= slo_ms``: a request
   may wait for the running batch, then run in the next).
3. **Correctness gate** on the gate set (``optimize.calibration`` or synthetic inputs from
   the input spec): top-1 agreement and cosine against fp32's outputs, thresholds from
   model.yaml's ``optimize:``. A variant slower than fp32 cannot be chosen, so its gate runs
   on the first 64 items only (``gate.items`` says how many).

A variant that fails any of them is rejected with its figures. ``optimize`` chooses the
highest-throughput variant that passes and meets the SLO and writes ``variant.yaml`` (the
runtime section, the profile, the provenance) into the model folder, where the worker and
``evenserve profile`` pick it up (``repository``); the full report goes to
``variants/optimize.json``.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel

import evenserve
from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.device import DeviceTarget
from evenserve.runtime.onnx_runtime import OnnxParams
from evenserve.runtime.torch_common import CompileParams
from evenserve.worker import gate
from evenserve.worker.profiler import measure, synthetic_batch, write_profile
from evenserve.worker.repository import VARIANT_FILE, ModelEntry

#: The reference batch of the latency ratio (the largest profiled size up to it).
REFERENCE_BATCH = 8
#: Items a variant that cannot win (slower than fp32) is gated on.
REDUCED_GATE_ITEMS = 64
#: A reduced-precision variant within this ratio of fp32's latency is "no faster".
NO_FASTER = 0.05
VARIANTS_DIR = "variants"
REPORT_FILE = "optimize.json"


@dataclass(frozen=True)
class VariantKind:
    """One kind of variant: its precision, its engine, where it runs."""

    name: str
    precision: str
    engine: str  # eager | compile | onnxruntime
    quantization: str | None = None  # dynamic | static
    description: str = ""


VARIANTS: dict[str, VariantKind] = {
    v.name: v
    for v in (
        VariantKind("fp32", "fp32", "eager", description="the model as built (the reference)"),
        VariantKind("fp16", "fp16", "eager", description="weights and activations in fp16"),
        VariantKind("bf16", "bf16", "eager", description="weights and activations in bf16"),
        VariantKind(
            "int8-dynamic",
            "int8",
            "eager",
            "dynamic",
            "torch dynamic quantization of Linear layers (CPU)",
        ),
        VariantKind("compile", "fp32", "compile", description="torch.compile (inductor)"),
        VariantKind(
            "onnxruntime", "fp32", "onnxruntime", description="ONNX Runtime, all graph opts"
        ),
        VariantKind(
            "onnxruntime-int8",
            "int8",
            "onnxruntime",
            "dynamic",
            "ONNX Runtime, dynamic INT8 quantization",
        ),
        VariantKind(
            "onnxruntime-int8-static",
            "int8",
            "onnxruntime",
            "static",
            "ONNX Runtime, static INT8 (QDQ) calibrated on the calibration set",
        ),
    )
}


@dataclass
class OptimizeOptions:
    """What ``evenserve optimize`` was asked for (None: model.yaml's, then the default)."""

    variants: Sequence[str] | None = None
    batch_sizes: Sequence[int] | None = None
    calibration: Path | None = None
    calibration_items: int | None = None
    warmup: int = 2
    iters: int = 5
    cpu_threads: int | None = None
    seed: int = 0
    #: Write variant.yaml, the profiles and the ONNX files into the model folder.
    write: bool = True


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


Progress = Callable[[str, str], None]


def default_variants(device: DeviceTarget, calibration: Path | None) -> list[str]:
    """The variants built when none are named: what the device can run."""
    if device.kind == "cuda":
        names = ["fp32", "fp16", "bf16", "compile", "onnxruntime"]
    else:
        names = ["fp32", "bf16", "fp16", "int8-dynamic", "compile", "onnxruntime"]
        names.append("onnxruntime-int8")
    if calibration is not None:
        names.append("onnxruntime-int8-static")
    return names


def parse_variants(names: Sequence[str], where: str = "--variants") -> list[str]:
    """Known variant names, fp32 first (the reference), without repeats."""
    out = ["fp32"]
    for n in names:
        if n not in VARIANTS:
            raise ConfigError(f"{where}: unknown variant {n!r} (known: {', '.join(VARIANTS)})")
        if n not in out:
            out.append(n)
    return out


def unsupported(kind: VariantKind, device: DeviceTarget, has_calibration: bool) -> str | None:
    """Why ``kind`` cannot be built on ``device`` (None: it can)."""
    if kind.engine == "eager" and kind.quantization == "dynamic" and device.kind != "cpu":
        return "torch's dynamic quantization runs on the CPU only"
    if kind.quantization == "static" and not has_calibration:
        return "static quantization needs a calibration set (optimize.calibration or --calibration)"
    if kind.engine == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            return "onnxruntime is not installed (pip install 'evenserve[onnx]')"
        if device.kind == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"
        try:
            import onnx  # noqa: F401
        except ImportError:
            return "onnx is not installed (pip install 'evenserve[onnx]')"
    if kind.engine == "compile" and shutil.which("cc") is None and device.kind == "cpu":
        return "torch.compile on the CPU needs a C compiler (cc), none found"
    return None


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


def _batches(
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


def _ratio_batch(
    a: Mapping[int, float], b: Mapping[int, float], device: DeviceTarget
) -> int | None:
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


# -- building ---------------------------------------------------------------------------------
def _torch_params(entry: ModelEntry, kind: VariantKind) -> BaseModel:
    params = entry.runtime_params
    assert params is not None
    update: dict[str, Any] = {"precision": kind.precision}
    update["compile"] = CompileParams() if kind.engine == "compile" else None
    return params.model_copy(update=update)


def torch_variant(entry: ModelEntry, name: str) -> dict[str, Any]:
    """A variant.yaml document serving a torch-engine variant (``fp16``, ``int8-dynamic``,
    ``compile``...) of ``entry`` as it is, without measuring it (benchmarks of one variant)."""
    kind = VARIANTS.get(name)
    if kind is None or kind.engine == "onnxruntime":
        torch_ones = [n for n, k in VARIANTS.items() if k.engine != "onnxruntime"]
        raise ConfigError(f"variant {name!r}: not one of {', '.join(torch_ones)}")
    runtime = entry.config.runtime
    return {
        "variant": name,
        "runtime": runtime,
        runtime: _section(_torch_params(entry, kind)),
        "provenance": {"written_by": "a benchmark, unmeasured"},
    }


def _section(params: BaseModel) -> dict[str, Any]:
    return params.model_dump(mode="json", exclude_defaults=True)


def _onnx_entry(entry: ModelEntry, params: OnnxParams) -> ModelEntry:
    cfg = entry.config.model_copy(
        update={"runtime": "onnx", "onnx": params.model_dump(), entry.config.runtime: None}
    )
    return ModelEntry(cfg, entry.directory, entry.source, params, None)


def optimize(
    entry: ModelEntry,
    device: DeviceTarget,
    options: OptimizeOptions,
    progress: Progress | None = None,
) -> OptimizeReport:
    """Build, check, profile and gate each variant; choose; write (see the module docstring)."""
    started = time.perf_counter()
    cfg = entry.config
    if cfg.runtime not in ("transformers", "torch"):
        raise ConfigError(
            f"{entry.source}: runtime: optimize builds variants of torch-based models "
            f"(transformers or torch); {entry.name!r} is {cfg.runtime}"
        )
    if device.kind == "emulated":
        raise ConfigError("--device: optimize measures real devices (cpu or cuda:N)")
    opt = cfg.optimize
    calibration = options.calibration
    if calibration is None and opt.calibration is not None:
        calibration = entry.directory / opt.calibration
    if options.variants:
        names = parse_variants(options.variants)
    elif opt.variants:
        names = parse_variants(opt.variants, f"{entry.source}: optimize.variants")
    else:
        names = default_variants(device, calibration)
    sizes = sorted(set(options.batch_sizes or opt.batch_sizes or _default_sizes(cfg)))
    if any(b < 1 or b > cfg.max_batch_size for b in sizes):
        where = "--batch-sizes" if options.batch_sizes else f"{entry.source}: optimize.batch_sizes"
        raise ConfigError(f"{where}: each must be within 1..{cfg.max_batch_size}")
    output = opt.gate_output or cfg.outputs[0].name
    items = options.calibration_items or opt.calibration_items
    inputs, gate_info = gate_set(entry, calibration, items, options.seed)
    gate_batch = min(REFERENCE_BATCH, cfg.max_batch_size)
    batches = _batches(inputs, gate_batch)
    gate_info.update(batch=gate_batch, output=output)
    thresholds = {"min_top1_agreement": opt.min_top1_agreement, "min_cosine": opt.min_cosine}
    say = progress or (lambda _v, _m: None)

    scratch = None if options.write else Path(tempfile.mkdtemp(prefix="evenserve-optimize-"))
    root = (scratch or entry.directory) / VARIANTS_DIR
    results: dict[str, VariantResult] = {}
    reference: Array | None = None
    fp32_latency: dict[int, float] = {}
    onnx_file: Path | None = None
    export_failed: Exception | None = None  # the export runs once; its failure is each ORT's
    try:
        for name in names:
            kind = VARIANTS[name]
            res = VariantResult(kind)
            results[name] = res
            why = unsupported(kind, device, calibration is not None)
            if why is not None:
                res.status, res.reasons = "unsupported", [why]
                say(name, f"unsupported: {why}")
                continue
            runtime: Runtime | None = None
            params: BaseModel
            try:
                say(name, "building")
                t0 = time.perf_counter()
                if kind.engine == "onnxruntime":
                    if export_failed is not None:
                        raise export_failed
                    try:
                        onnx_file = _ensure_export(entry, device, options, root, onnx_file, batches)
                    except Exception as exc:
                        export_failed = exc
                        raise
                    runtime, params, artifacts = _build_onnx(
                        entry, device, options, kind, root, onnx_file, inputs, res
                    )
                    res.build["artifacts"] = artifacts
                else:
                    params = _torch_params(entry, kind)
                    runtime = entry.create_runtime(
                        device, cpu_threads=options.cpu_threads, profiles_dir=None, params=params
                    )
                    runtime.load()
                res.build["load_seconds"] = round(time.perf_counter() - t0, 3)
                described = runtime.describe()
                for key in ("quantization", "compile", "graph_optimization", "variant_notes"):
                    if key in described:
                        res.build[key] = described[key]
                res.runtime_kind = "onnx" if kind.engine == "onnxruntime" else cfg.runtime
                res.section = _section(params)
                if kind.engine == "onnxruntime":
                    res.section["file"] = _relative(Path(res.section["file"]), entry.directory)

                say(name, "profiling")
                load_start = os.getloadavg()[0]
                points = measure(
                    runtime,
                    entry,
                    device,
                    sizes,
                    warmup=options.warmup,
                    iters=options.iters,
                    seed=options.seed,
                    threads=options.cpu_threads,
                )
                res.latency_ms = {p.batch: round(p.median_ms, 3) for p in points}
                prof_path = root / name / "profile.yaml"
                prof = write_profile(
                    prof_path,
                    entry,
                    device,
                    runtime,
                    points,
                    warmup=options.warmup,
                    iters=options.iters,
                    load_average=(load_start, os.getloadavg()[0]),
                )
                res.profile_path = _relative(prof_path, entry.directory) if options.write else None
                res.weights_mb = prof.weights_mb
                res.throughput_rps, res.best_batch = throughput(res.latency_ms, cfg.slo_ms)
                res.meets_slo = res.throughput_rps is not None
                if name == "fp32":
                    fp32_latency = res.latency_ms
                if not res.meets_slo:
                    res.reject(
                        f"no profiled batch size leaves room for slo_ms {cfg.slo_ms} "
                        f"(2 x latency; batch {min(res.latency_ms)} takes "
                        f"{res.latency_ms[min(res.latency_ms)]:.1f} ms)"
                    )

                say(name, "checking precision")
                rb = _ratio_batch(res.latency_ms, fp32_latency, device)
                ratio = None
                if name != "fp32" and rb is not None:
                    ratio = res.latency_ms[rb] / fp32_latency[rb]
                evidence = _evidence(runtime, batches[0])
                res.precision_check = precision_check(kind, evidence, ratio, device)
                for r in res.precision_check["reasons"]:
                    res.reject(f"precision check: {r}")
                res.notes.extend(res.precision_check["notes"])

                say(name, "gating")
                fp32_rps = results["fp32"].throughput_rps
                limit = None
                if (
                    name != "fp32"
                    and fp32_rps is not None
                    and (res.throughput_rps or 0.0) < fp32_rps
                ):
                    limit = REDUCED_GATE_ITEMS
                    res.notes.append(
                        f"slower than fp32: gated on the first {REDUCED_GATE_ITEMS} items only"
                    )
                used = batches if limit is None else _batches(inputs, gate_batch, limit)
                got = run_outputs(runtime, used, output)
                if name == "fp32":
                    reference = got
                assert reference is not None
                res.gate = gate.compare(
                    reference[: got.shape[0]],
                    got,
                    min_top1_agreement=opt.min_top1_agreement,
                    min_cosine=opt.min_cosine,
                )
                for r in res.gate.reasons:
                    res.reject(f"gate: {r}")
                say(name, res.status)
            except Exception as exc:  # a variant that cannot be built is reported, not fatal
                res.status = "failed"
                res.reasons.append(f"{type(exc).__name__}: {exc}")
                say(name, f"failed: {exc}")
                if name == "fp32":
                    raise ConfigError(f"{entry.source}: the fp32 reference failed: {exc}") from exc
            finally:
                if runtime is not None:
                    runtime.close()
                del runtime
                gc.collect()

        chosen = _choose(results)
        written = None
        if chosen is not None:
            results[chosen].status = "chosen"
        report = OptimizeReport(
            entry.name,
            device.name,
            cfg.slo_ms,
            gate_info,
            thresholds,
            results,
            chosen,
            None,
            time.perf_counter() - started,
        )
        if options.write and chosen is not None:
            written = str(_write_variant(entry, device, report, root))
            report.written = written
        if options.write:
            root.mkdir(parents=True, exist_ok=True)
            (root / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        return report
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _default_sizes(cfg: Any) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= cfg.max_batch_size]
    return sorted({*sizes, cfg.max_batch_size})


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _evidence(runtime: Runtime, batch: Mapping[str, Array]) -> dict[str, Any]:
    """What precision ran: a torch runtime's weights and activations, an ONNX graph's
    initializers and operators (read once, when the ONNX runtime loaded the file)."""
    evidence = getattr(runtime, "precision_evidence", None)
    if evidence is not None:
        return dict(evidence(batch))
    return dict(runtime.describe().get("graph_precision") or {"precision": "unknown"})


def _ensure_export(
    entry: ModelEntry,
    device: DeviceTarget,
    options: OptimizeOptions,
    root: Path,
    done: Path | None,
    batches: Sequence[Mapping[str, Array]],
) -> Path:
    """The fp32 model exported to ONNX once (``variants/onnxruntime/model.onnx``)."""
    if done is not None:
        return done
    from evenserve.runtime import onnx_export

    params = entry.runtime_params
    assert params is not None
    base = params.model_copy(update={"precision": "fp32", "compile": None})
    runtime = entry.create_runtime(
        device, cpu_threads=options.cpu_threads, profiles_dir=None, params=base
    )
    runtime.load()
    try:
        path = root / "onnxruntime" / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx_export.export_onnx(runtime, batches[0], path)
        return path
    finally:
        runtime.close()


def _build_onnx(
    entry: ModelEntry,
    device: DeviceTarget,
    options: OptimizeOptions,
    kind: VariantKind,
    root: Path,
    exported: Path,
    inputs: Mapping[str, Array],
    res: VariantResult,
) -> tuple[Runtime, OnnxParams, dict[str, Any]]:
    from evenserve.runtime import onnx_export

    artifacts: dict[str, Any] = {"exported": _relative(exported, entry.directory)}
    path = exported
    if kind.quantization is not None:
        path = root / kind.name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind.quantization == "dynamic":
            artifacts["quantization"] = onnx_export.quantize_dynamic(exported, path)
        else:
            # Calibrate on the first quarter of the set (at most 128 items), in batches.
            n = next(iter(inputs.values())).shape[0]
            take = max(1, min(128, n // 4))
            cal = _batches(inputs, min(REFERENCE_BATCH, entry.config.max_batch_size), take)
            artifacts["quantization"] = onnx_export.quantize_static(exported, path, cal)
            res.notes.append(f"calibrated on the first {take} items of the gate set")
    artifacts["file"] = _relative(path, entry.directory)
    # Threads come from the runtime context (--cpu-threads here, the worker's when served),
    # not from the section: variant.yaml must not pin optimize's setting.
    params = OnnxParams(file=str(path.resolve()))
    onnx = _onnx_entry(entry, params)
    runtime = onnx.create_runtime(device, cpu_threads=options.cpu_threads, profiles_dir=None)
    runtime.load()
    return runtime, params, artifacts


def _choose(results: Mapping[str, VariantResult]) -> str | None:
    """The usable variant of the highest throughput (ties: the earlier, fp32 first)."""
    best: tuple[float, str] | None = None
    for name, r in results.items():
        if not r.usable or r.throughput_rps is None:
            continue
        if best is None or r.throughput_rps > best[0]:
            best = (r.throughput_rps, name)
    return None if best is None else best[1]


def _write_variant(
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
        "report": _relative(root / REPORT_FILE, entry.directory),
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
