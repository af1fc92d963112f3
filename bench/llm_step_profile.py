"""Measure an LLM step profile on a GPU: a random-weight ~1B Llama run by the real executor.

Builds a Llama-architecture model from a config with random weights (hidden 2048, 16 layers,
32 heads, 8 KV heads, MLP 8192, vocabulary 32000: about 1.1B parameters) in bf16 on the
device, and times engine steps of ``TorchStepExecutor`` (the runtime the worker serves),
with the device synchronised around each step:

- decodes: batches of 1..128 sequences at contexts 256..2048 (the sequences are prefilled
  once up the ladder of contexts, so the prompts cost the run once);
- prefills: a fresh sequence's first chunk of 128..2048 tokens;
- mixed: a prompt chunk beside a batch of decodes.

It fits ``step = c0 + c_p x prefill tokens + c_d x decodes + c_kv x KV tokens read`` (the
model of ``core.llm``) by non-negative least squares on relative error (each point weighted
by 1/its time, so a 5 ms decode step counts as much as a 50 ms prefill; non-negative: every
subset of the terms is fitted and the best fit with no negative coefficient wins), prints the
fit and every point's residual, and writes a ``kind: llm-step`` profile YAML.

    python bench/llm_step_profile.py --out profiles/h200-llm/llama-1b.yaml
    python bench/llm_step_profile.py --tiny --out /tmp/tiny.yaml     # a CPU check, seconds

The whole GPU grid takes well under a few minutes (bounded: 5 batch sizes x 3 contexts).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from evenserve.core.llm import GIB, StepEntry, StepProfileFile
from evenserve.runtime.llm.torch_executor import (
    TINY_LLAMA,
    LlmTorchParams,
    TorchStepExecutor,
    build_executor,
    parameter_count,
)

LLAMA_1B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}

GRID = {
    "full": {
        "batches": [1, 8, 32, 64, 128],
        "contexts": [256, 1024, 2048],
        "prefills": [128, 512, 1024, 2048],
        "mixed": [(256, 8), (256, 64), (1024, 32)],
        "reps": 5,
        "ladder_chunk": 2048,
    },
    "tiny": {
        "batches": [1, 4, 8],
        "contexts": [32, 96],
        "prefills": [16, 64, 128],
        "mixed": [(32, 4)],
        "reps": 3,
        "ladder_chunk": 64,
    },
}

TERMS = ("c0", "prefill_tokens", "decode_seqs", "kv_tokens")


@dataclass(frozen=True, slots=True)
class Point:
    kind: str
    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    seconds: float
    #: The decodes' context on the ladder (0: none), to group repetitions in the printout.
    context: int = 0


class Timer:
    """Times executor steps with the device synchronised before and after each."""

    def __init__(self, ex: TorchStepExecutor) -> None:
        import torch

        self.ex = ex
        self._sync = torch.cuda.synchronize if ex.device.type == "cuda" else (lambda: None)

    def step(self, entries: list[StepEntry]) -> tuple[dict[int, int], float]:
        self._sync()
        t0 = time.perf_counter()
        out = dict(self.ex.step(entries))
        self._sync()
        return out, time.perf_counter() - t0


def measure(ex: TorchStepExecutor, grid: dict[str, Any], seed: int) -> list[Point]:
    """Every grid point's step times (``reps`` of each; see the module docstring)."""
    rng = np.random.default_rng(seed)
    vocab = ex.vocab_size
    timer = Timer(ex)
    reps = int(grid["reps"])
    points: list[Point] = []

    def tokens(n: int) -> list[int]:
        return [int(t) for t in rng.integers(0, vocab, n)]

    # warm-up: a prefill and a few decodes (allocator, kernels' first launch)
    warm_id = 10**6
    got, _ = timer.step([StepEntry(warm_id, tokens(64), 0, True)])
    for i in range(3):
        got, _ = timer.step([StepEntry(warm_id, [got[warm_id]], 64 + i, True)])
    ex.free(warm_id)

    fresh = itertools.count(2 * 10**6)
    for size in grid["prefills"]:
        for _ in range(reps):
            sid = next(fresh)
            _, s = timer.step([StepEntry(sid, tokens(size), 0, True)])
            ex.free(sid)
            points.append(Point("prefill", size, 0, 0, s))

    batches = sorted(grid["batches"])
    n_seqs = batches[-1]
    held = dict.fromkeys(range(n_seqs), 0)
    last = dict.fromkeys(range(n_seqs), 0)
    for ctx in sorted(grid["contexts"]):
        for sid in held:  # up the ladder: prompt chunks to ``ctx`` (not timed)
            while held[sid] < ctx:
                n = min(int(grid["ladder_chunk"]), ctx - held[sid])
                got, _ = timer.step([StepEntry(sid, tokens(n), held[sid], True)])
                held[sid] += n
                last[sid] = got[sid]
        for b in batches:
            for _ in range(reps):
                entries = [StepEntry(s, [last[s]], held[s], True) for s in range(b)]
                kv = sum(held[s] + 1 for s in range(b))
                got, s = timer.step(entries)
                for sid in range(b):
                    held[sid] += 1
                    last[sid] = got[sid]
                points.append(Point("decode", 0, b, kv, s, ctx))
        for chunk, b in grid["mixed"]:
            if b > n_seqs:
                continue
            for _ in range(reps):
                sid = next(fresh)
                entries = [StepEntry(s, [last[s]], held[s], True) for s in range(b)]
                entries.append(StepEntry(sid, tokens(chunk), 0, True))
                kv = sum(held[s] + 1 for s in range(b))
                got, s = timer.step(entries)
                ex.free(sid)
                for q in range(b):
                    held[q] += 1
                    last[q] = got[q]
                points.append(Point("mixed", chunk, b, kv, s, ctx))
    for sid in held:
        ex.free(sid)
    return points


def design(points: list[Point]) -> tuple[np.ndarray, np.ndarray]:
    a = np.array([[1.0, p.prefill_tokens, p.decode_seqs, p.kv_tokens] for p in points])
    return a, np.array([p.seconds for p in points])


def fit(points: list[Point]) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares on relative error: the coefficients (seconds per unit of
    each term in TERMS) and each point's relative residual ((predicted - measured) /
    measured). With four terms, every subset holding c0 is fitted and the best fit whose
    coefficients are all non-negative wins (exact NNLS, no solver needed)."""
    a, t = design(points)
    w = 1.0 / t
    best: tuple[float, np.ndarray] | None = None
    for r in range(1, len(TERMS)):
        for others in itertools.combinations(range(1, len(TERMS)), r - 1):
            cols = [0, *others]
            sol, *_ = np.linalg.lstsq(a[:, cols] * w[:, None], t * w, rcond=None)
            if np.any(sol < 0) or not np.all(np.isfinite(sol)):
                continue
            coef = np.zeros(len(TERMS))
            coef[cols] = sol
            err = float(np.sum(((a @ coef - t) * w) ** 2))
            if best is None or err < best[0]:
                best = (err, coef)
    # also the full model (all four terms)
    sol, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    if np.all(sol >= 0) and np.all(np.isfinite(sol)):
        err = float(np.sum(((a @ sol - t) * w) ** 2))
        if best is None or err < best[0]:
            best = (err, sol)
    if best is None:  # c0 alone is always feasible with positive times; kept for the types
        raise RuntimeError("no non-negative fit")
    coef = best[1]
    return coef, (a @ coef - t) / t


def device_name(ex: TorchStepExecutor) -> str:
    import torch

    if ex.device.type == "cuda":
        return str(torch.cuda.get_device_name(ex.device))
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def device_memory_bytes(ex: TorchStepExecutor) -> float:
    import torch

    if ex.device.type == "cuda":
        return float(torch.cuda.get_device_properties(ex.device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the profile YAML to write")
    ap.add_argument("--model", default=None, help="the profile's model name")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tiny", action="store_true", help="tiny config, CPU, few points")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.tiny:
        config, grid = TINY_LLAMA, GRID["tiny"]
        device = "cpu" if args.device == "cuda" else args.device
        dtype = "float32" if args.dtype == "bfloat16" and device == "cpu" else args.dtype
        model = args.model or "tiny-llama"
    else:
        config, grid, device, dtype = LLAMA_1B, GRID["full"], args.device, args.dtype
        model = args.model or "llama-1b-random"
    longest = max(grid["contexts"]) + 4 * int(grid["reps"]) + 8
    params = LlmTorchParams(
        config=config,
        dtype=dtype,
        device=device,
        seed=args.seed,
        threads=args.threads,
        max_seqs=max(grid["batches"]) + 2,
        max_model_len=max(longest, max(grid["prefills"])),
    )
    t0 = time.perf_counter()
    ex = build_executor(Path("."), params)
    built_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    points = measure(ex, grid, args.seed)
    measured_s = time.perf_counter() - t0
    coef, rel = fit(points)
    name = device_name(ex)
    c0, cp, cd, ckv = (float(c) for c in coef)
    doc = StepProfileFile(
        kind="llm-step",
        model=model,
        device=name,
        runtime="torch-llm (transformers, packed step, slot KV cache)",
        precision={"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype],
        source=(
            f"measured by bench/llm_step_profile.py on {name}, random weights "
            f"({parameter_count(config) / 1e6:.1f}M-parameter Llama architecture), "
            f"{len(points)} steps; NNLS fit on relative error, "
            f"RMS relative residual {math.sqrt(float(np.mean(rel**2))):.3f}"
        ),
        notes=(
            "cpu_ms_per_output_token not measured (0); KV read is the decodes' context "
            "tokens; a prefill chunk's attention over its prefix is not a term"
        ),
        c0_ms=max(c0 * 1e3, 1e-6),
        prefill_us_per_token=cp * 1e6,
        decode_us_per_seq=cd * 1e6,
        kv_us_per_token=ckv * 1e6,
        weights_gib=ex.describe()["weights_bytes"] / GIB,
        kv_bytes_per_token=ex.kv_bytes_per_token,
        device_memory_gib=device_memory_bytes(ex) / GIB,
        max_model_len=int(ex.config.max_position_embeddings),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(doc.model_dump(exclude_none=True), sort_keys=False))
    print(f"{model} on {name}: {parameter_count(config) / 1e6:.1f}M parameters, {dtype}; "
          f"built in {built_s:.1f} s, {len(points)} steps in {measured_s:.1f} s")  # fmt: skip
    print(f"fit: c0 {c0 * 1e3:.4f} ms, prefill {cp * 1e6:.3f} us/token, "
          f"decode {cd * 1e6:.3f} us/seq, kv {ckv * 1e6:.5f} us/token")  # fmt: skip
    grouped: dict[tuple[str, int, int, int], list[tuple[float, float]]] = {}
    for p, r in zip(points, rel, strict=True):
        key = (p.kind, p.prefill_tokens, p.decode_seqs, p.context)
        grouped.setdefault(key, []).append((p.seconds, p.seconds * (1 + r)))
    print(f"{'kind':8s} {'prefill':>7s} {'decodes':>7s} {'context':>7s} {'ms':>9s} {'fit ms':>9s} "
          f"{'rel':>7s}")  # fmt: skip
    for (kind, pt, ds, ctx), vals in grouped.items():  # the median of each point's repetitions
        s = statistics.median(v[0] for v in vals)
        pred = statistics.median(v[1] for v in vals)
        print(f"{kind:8s} {pt:7d} {ds:7d} {ctx:7d} {s * 1e3:9.3f} {pred * 1e3:9.3f} "
              f"{(pred - s) / s:+7.1%}")  # fmt: skip
    print(f"RMS relative residual {math.sqrt(float(np.mean(rel**2))):.3f}; wrote {args.out}")
    return {
        "coefficients_s": dict(zip(TERMS, (c0, cp, cd, ckv), strict=True)),
        "relative_residuals": [float(r) for r in rel],
        "points": len(points),
        "profile": str(args.out),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
