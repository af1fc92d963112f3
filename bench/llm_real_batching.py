"""A real (random-weight) causal LM on the CPU: one sequence at a time against continuous
batching through ``TorchStepExecutor``, and transformers' own ``generate_batch``.

N sequences (prompts of random byte tokens, ``--prompt-min``..``--prompt-max`` long, seeded)
each generate ``--output`` tokens, EOS ignored. Modes:

- ``generate``: transformers' ``model.generate`` (greedy), one sequence after another;
- ``executor-1``: the executor, one sequence after another (a whole-prompt prefill step, then
  one decode step per token): the executor's own cost without batching;
- ``executor-cb``: continuous batching through the executor: a loop (this script's, not the
  project's engine) runs steps of every running decode plus prompt chunks within
  ``--step-tokens``, admits a waiting sequence when fewer than ``--max-batch`` run, and a
  finished one leaves at once;
- ``padded-dynamic``: the alternative design measured against the executor: one DynamicCache
  per sequence, prompts prefilled alone, decodes batched by left-padding the caches;
- ``generate-batch``: transformers' ``generate_batch`` (its own scheduler and paged cache),
  where the installed transformers has it.

It prints output tokens/s of each, the ratio to ``generate``, and how many sequences'
tokens equal ``generate``'s (greedy, float32: they should all).

    python bench/llm_real_batching.py [--preset tiny|small] [--n 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evenserve.core.llm import StepEntry
from evenserve.runtime.llm.torch_executor import (
    TINY_LLAMA,
    LlmTorchParams,
    TorchStepExecutor,
    build_executor,
    parameter_count,
)

#: The padding id the generate paths get: never a prompt token (prompts are bytes 0-255), as
#: generate masks prompt tokens equal to it.
PAD = TINY_LLAMA["pad_token_id"]

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": TINY_LLAMA,
    # About 50M parameters with a 32k vocabulary: the LM head and the MLPs dominate.
    "small": {
        **TINY_LLAMA,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
    },
}


@dataclass
class _Seq:
    seq_id: int
    prompt: list[int]
    fed: int = 0
    out: list[int] = field(default_factory=list)


def prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_one_at_a_time(
    ex: TorchStepExecutor, prompts: list[list[int]], output: int
) -> list[list[int]]:
    outs = []
    for i, p in enumerate(prompts):
        tok = ex.step([StepEntry(i, p, 0, True)])[i]
        out = [tok]
        while len(out) < output:
            out.append(ex.step([StepEntry(i, [out[-1]], len(p) + len(out) - 1, True)])[i])
        ex.free(i)
        outs.append(out)
    return outs


def run_continuous(
    ex: TorchStepExecutor,
    prompts: list[list[int]],
    output: int,
    max_batch: int,
    step_tokens: int,
) -> tuple[list[list[int]], dict[str, float]]:
    """Continuous batching (see the module docstring); the outputs and the steps' shape."""
    waiting = deque(_Seq(i, p) for i, p in enumerate(prompts))
    running: list[_Seq] = []
    done: dict[int, list[int]] = {}
    steps = batch_sum = 0
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(waiting.popleft())
        entries: list[StepEntry] = []
        budget = step_tokens
        for s in running:  # decodes first, then prompt chunks in arrival order
            if s.fed >= len(s.prompt):
                entries.append(
                    StepEntry(s.seq_id, [s.out[-1]], len(s.prompt) + len(s.out) - 1, True)
                )
                budget -= 1
        for s in running:
            if s.fed < len(s.prompt) and budget > 0:
                chunk = s.prompt[s.fed : s.fed + budget]
                last = s.fed + len(chunk) == len(s.prompt)
                entries.append(StepEntry(s.seq_id, chunk, s.fed, last))
                budget -= len(chunk)
        sampled = ex.step(entries)
        steps += 1
        batch_sum += len(entries)
        for e in entries:
            s = next(r for r in running if r.seq_id == e.seq_id)
            if s.fed < len(s.prompt):
                s.fed += len(e.tokens)
            if e.seq_id in sampled:
                s.out.append(sampled[e.seq_id])
        for s in [r for r in running if len(r.out) >= output]:
            running.remove(s)
            ex.free(s.seq_id)
            done[s.seq_id] = s.out
    return [done[i] for i in range(len(prompts))], {"steps": steps, "mean_batch": batch_sum / steps}


def run_padded(
    model: Any, prompts: list[list[int]], output: int, max_batch: int
) -> list[list[int]]:
    """The other design, for comparison: continuous batching with one DynamicCache per
    sequence: each prompt prefilled alone (batch 1), the decodes batched by left-padding
    every layer's K/V to the longest context each step (a 2-D attention mask hides the
    padding, ``position_ids`` keep each sequence's positions), the caches split back after."""
    import torch
    from transformers import DynamicCache

    layers = model.config.num_hidden_layers
    waiting = deque(range(len(prompts)))
    running: list[int] = []
    kv: dict[int, list[tuple[Any, Any]]] = {}
    out: dict[int, list[int]] = {}
    done: dict[int, list[int]] = {}
    with torch.inference_mode():
        while waiting or running:
            while waiting and len(running) < max_batch:
                i = waiting.popleft()
                cache = DynamicCache(config=model.config)
                ids = torch.tensor([prompts[i]])
                res = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                kv[i] = [(cache.layers[li].keys, cache.layers[li].values) for li in range(layers)]
                out[i] = [int(res.logits[0, -1].argmax())]
                running.append(i)
            lens = [kv[i][0][0].shape[2] for i in running]
            longest = max(lens)
            cache = DynamicCache(config=model.config)
            for li in range(layers):
                ks = [torch.nn.functional.pad(kv[i][li][0], (0, 0, longest - n, 0)) for i, n in
                      zip(running, lens, strict=True)]  # fmt: skip
                vs = [torch.nn.functional.pad(kv[i][li][1], (0, 0, longest - n, 0)) for i, n in
                      zip(running, lens, strict=True)]  # fmt: skip
                cache.update(torch.cat(ks), torch.cat(vs), li)
            mask = torch.zeros(len(running), longest + 1, dtype=torch.long)
            for row, n in enumerate(lens):
                mask[row, longest - n :] = 1
            res = model(
                input_ids=torch.tensor([[out[i][-1]] for i in running]),
                attention_mask=mask,
                position_ids=torch.tensor([[n] for n in lens]),
                cache=cache,
                use_cache=True,
            )
            nxt = res.logits[:, -1].argmax(-1).tolist()
            for row, (i, n) in enumerate(zip(running, lens, strict=True)):
                kv[i] = [
                    (cache.layers[li].keys[row : row + 1, :, longest - n :],
                     cache.layers[li].values[row : row + 1, :, longest - n :])
                    for li in range(layers)
                ]  # fmt: skip
                out[i].append(nxt[row])
            for i in [r for r in running if len(out[r]) >= output]:
                running.remove(i)
                done[i] = out.pop(i)[:output]
                del kv[i]
    return [done[i] for i in range(len(prompts))]


def run_generate(model: Any, prompts: list[list[int]], output: int) -> list[list[int]]:
    import torch

    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=output,
                min_new_tokens=output, do_sample=False, pad_token_id=PAD,
            )  # fmt: skip
            outs.append(out[0, len(p) :].tolist())
    return outs


def run_generate_batch(
    model: Any, prompts: list[list[int]], output: int, max_batch: int, step_tokens: int
) -> list[list[int]] | str:
    """transformers' own continuous batching, sized as the executor's loop (blocks of 16
    tokens for ``max_batch`` of the longest sequences, the same step budget and batch cap:
    left to size itself on a CPU it takes tens of seconds); its outputs, or why it did not
    run. The time includes its manager's start and stop (a thread per call)."""
    if not hasattr(model, "generate_batch"):
        return "transformers has no generate_batch"
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    longest = max(len(p) for p in prompts) + output
    cb = ContinuousBatchingConfig(
        page_size=16, num_blocks=max_batch * (longest // 16 + 2), max_batch_tokens=step_tokens,
        max_requests_per_batch=max_batch, use_cuda_graph=False, use_async_batching=False,
    )  # fmt: skip

    gen = GenerationConfig(
        max_new_tokens=output, do_sample=False, eos_token_id=None, pad_token_id=PAD,
    )  # fmt: skip
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        result = model.generate_batch(
            inputs=prompts, generation_config=gen, continuous_batching_config=cb,
            max_new_tokens=output, warmup=False,
        )  # fmt: skip
    except Exception as exc:  # report, do not hide: the other modes still stand
        return f"{type(exc).__name__}: {exc}"
    outs = [list(r.generated_tokens) for r in result.values()]
    if len(outs) != len(prompts):
        return f"generate_batch returned {len(outs)} of {len(prompts)} results"
    return outs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompt-min", type=int, default=32)
    ap.add_argument("--prompt-max", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--step-tokens", type=int, default=256)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared host)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="modes to leave out, comma-separated")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = PRESETS[args.preset]
    params = LlmTorchParams(config=cfg, seed=args.seed, max_seqs=args.max_batch)
    ex = build_executor(Path("."), params)
    reference = copy.deepcopy(ex.model)
    reference.set_attn_implementation("sdpa")
    reference.generation_config.eos_token_id = None
    ps = prompts(args.n, args.prompt_min, args.prompt_max, args.seed)
    total = args.n * args.output
    skip = set(filter(None, args.skip.split(",")))
    report: dict[str, Any] = {
        "preset": args.preset,
        "parameters": parameter_count(cfg),
        "sequences": args.n,
        "prompt_tokens": sum(len(p) for p in ps),
        "output_tokens_each": args.output,
        "max_batch": args.max_batch,
        "step_tokens": args.step_tokens,
        "torch_threads": torch.get_num_threads(),
        "modes": {},
    }
    # warm-up: one short sequence through each path
    run_one_at_a_time(ex, ps[:1], 2)
    run_generate(reference, ps[:1], 2)
    outputs: dict[str, list[list[int]]] = {}

    def timed(name: str, fn: Any) -> None:
        if name in skip:
            return
        t0 = time.perf_counter()
        result = fn()
        took = time.perf_counter() - t0
        extra: dict[str, Any] = {}
        if isinstance(result, tuple):
            result, extra = result
        if isinstance(result, str):
            report["modes"][name] = {"error": result}
            return
        outputs[name] = result
        report["modes"][name] = {
            "seconds": round(took, 3),
            "tokens_s": round(total / took, 1),
            **extra,
        }

    timed("generate", lambda: run_generate(reference, ps, args.output))
    timed("executor-1", lambda: run_one_at_a_time(ex, ps, args.output))
    timed(
        "executor-cb", lambda: run_continuous(ex, ps, args.output, args.max_batch, args.step_tokens)
    )
    timed("padded-dynamic", lambda: run_padded(reference, ps, args.output, args.max_batch))
    timed(
        "generate-batch",
        lambda: run_generate_batch(
            copy.deepcopy(reference), ps, args.output, args.max_batch, args.step_tokens
        ),
    )
    base = report["modes"].get("generate", {}).get("tokens_s")
    for name, m in report["modes"].items():
        if "tokens_s" in m and base:
            m["vs_generate"] = round(m["tokens_s"] / base, 2)
        if name in outputs and "generate" in outputs and name != "generate":
            m["same_tokens_as_generate"] = sum(
                a == b for a, b in zip(outputs[name], outputs["generate"], strict=True)
            )
    print(f"{args.preset}: {report['parameters'] / 1e6:.2f}M parameters, {args.n} sequences, "
          f"{report['prompt_tokens']} prompt tokens, {args.output} output tokens each, "
          f"{report['torch_threads']} threads")  # fmt: skip
    for name, m in report["modes"].items():
        if "error" in m:
            print(f"  {name:15s} did not run: {m['error']}")
            continue
        same = m.get("same_tokens_as_generate")
        print(
            f"  {name:15s} {m['tokens_s']:9.1f} tok/s  {m['seconds']:7.2f} s"
            + (f"  x{m['vs_generate']:.2f}" if "vs_generate" in m else "")
            + (f"  same tokens {same}/{args.n}" if same is not None else "")
            + (f"  ({m['steps']} steps, mean batch {m['mean_batch']:.1f})" if "steps" in m else "")
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
