"""``evenserve optimize``'s run: each variant built, profiled, checked and gated in turn, the
cheapest chosen and written (see the package's docstring)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.device import DeviceTarget
from evenserve.worker import gate
from evenserve.worker.optimize.build import (
    build_onnx,
    ensure_export,
    relative,
    section_of,
    torch_params,
)
from evenserve.worker.optimize.checks import (
    REDUCED_GATE_ITEMS,
    REFERENCE_BATCH,
    evidence_of,
    gate_set,
    precision_check,
    ratio_batch,
    run_outputs,
    split_batches,
    throughput,
)
from evenserve.worker.optimize.selection import (
    REPORT_FILE,
    OptimizeReport,
    VariantResult,
    choose,
    write_variant,
)
from evenserve.worker.optimize.variants import (
    VARIANTS,
    default_variants,
    parse_variants,
    unsupported,
)
from evenserve.worker.profiler import measure, write_profile
from evenserve.worker.repository import ModelEntry

VARIANTS_DIR = "variants"


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


Progress = Callable[[str, str], None]


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
    sizes = sorted(set(options.batch_sizes or opt.batch_sizes or default_sizes(cfg)))
    if any(b < 1 or b > cfg.max_batch_size for b in sizes):
        where = "--batch-sizes" if options.batch_sizes else f"{entry.source}: optimize.batch_sizes"
        raise ConfigError(f"{where}: each must be within 1..{cfg.max_batch_size}")
    output = opt.gate_output or cfg.outputs[0].name
    items = options.calibration_items or opt.calibration_items
    inputs, gate_info = gate_set(entry, calibration, items, options.seed)
    gate_batch = min(REFERENCE_BATCH, cfg.max_batch_size)
    batches = split_batches(inputs, gate_batch)
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
                        onnx_file = ensure_export(
                            entry, device, options.cpu_threads, root, onnx_file, batches
                        )
                    except Exception as exc:
                        export_failed = exc
                        raise
                    runtime, params, artifacts = build_onnx(
                        entry, device, options.cpu_threads, kind, root, onnx_file, inputs, res.notes
                    )
                    res.build["artifacts"] = artifacts
                else:
                    params = torch_params(entry, kind)
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
                res.section = section_of(params)
                if kind.engine == "onnxruntime":
                    res.section["file"] = relative(Path(res.section["file"]), entry.directory)

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
                res.profile_path = relative(prof_path, entry.directory) if options.write else None
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
                rb = ratio_batch(res.latency_ms, fp32_latency, device)
                ratio = None
                if name != "fp32" and rb is not None:
                    ratio = res.latency_ms[rb] / fp32_latency[rb]
                evidence = evidence_of(runtime, batches[0])
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
                used = batches if limit is None else split_batches(inputs, gate_batch, limit)
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

        chosen = choose(results)
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
            written = str(write_variant(entry, device, report, root))
            report.written = written
        if options.write:
            root.mkdir(parents=True, exist_ok=True)
            (root / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        return report
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def default_sizes(cfg: Any) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= cfg.max_batch_size]
    return sorted({*sizes, cfg.max_batch_size})
