"""The LLM scenario's must-show figures in the simulator (``scenarios/llm-mix.yaml``).

    .venv/bin/python bench/llm_mix_sim.py                       # every arm, seed of the file
    .venv/bin/python bench/llm_mix_sim.py --seeds 1,2,3 --json out/llm-mix.json

Runs each arm (``sim.llm``: one device's scheduler with the LLM engine and, per arm, ResNet-50
and BERT) and prints, per seed:
- continuous batching's goodput over request-level's, at the same TTFT/TPOT targets (target
  >= 2), and continuous-chunked's: at the file's rates (where request-level batching may meet
  no target at all: the ratio is then shown as ``-``) and, with ``--sweep``, each arm's best
  goodput over a range of rates (every open-loop rate scaled alike);
- the P99 inter-token latency over its median with chunked prefill through the burst of long
  prompts (target <= 1.5), next to unchunked continuous batching's;
- co-location: ResNet-50's and BERT's goodput co-located over solo (target >= 0.95 each) and
  the LLM's (target >= 0.90).
Goodput: completed requests per second that met both their TTFT and TPOT targets (the LLM),
or were answered within the SLO (ResNet-50, BERT), over the measured window.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evenserve.sim.llm import run_arm, summarize_arm
from evenserve.sim.llm_scenario import load_llm_scenario

ROOT = Path(__file__).resolve().parents[1]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def figures(path: Path, seed: int) -> dict[str, Any]:
    sc = load_llm_scenario(path)
    arms = {a: summarize_arm(sc, run_arm(sc, a, seed)) for a in sc.doc.arms}

    def llm(arm: str) -> Any:
        s = arms[arm].llm
        assert s is not None
        return s

    out: dict[str, Any] = {"seed": seed}
    out["goodput_rps"] = {a: llm(a).goodput_rps for a in arms if arms[a].llm is not None}
    out["continuous_over_request_level"] = ratio(
        llm("continuous").goodput_rps, llm("request-level").goodput_rps
    )
    out["chunked_over_request_level"] = ratio(
        llm("continuous-chunked").goodput_rps, llm("request-level").goodput_rps
    )
    out["itl_p99_over_p50"] = {
        a: llm(a).itl_p99_over_p50 for a in ("continuous", "continuous-chunked", "colocated")
    }
    co, solo = arms["colocated"], arms["classic-solo"]
    out["classic_colocated_over_solo"] = {
        m: ratio(co.classic[m]["goodput_rps"], solo.classic[m]["goodput_rps"]) for m in solo.classic
    }
    out["llm_colocated_over_solo"] = ratio(
        llm("colocated").goodput_rps, llm("llm-solo").goodput_rps
    )
    out["arms"] = {a: f.to_dict() for a, f in arms.items()}
    return out


def sweep(path: Path, seed: int, scales: list[float]) -> dict[str, dict[float, float | None]]:
    """Each batching arm's LLM goodput with every open-loop rate times each of ``scales``:
    request-level batching is judged at the load where it does best, not only at the file's."""
    out: dict[str, dict[float, float | None]] = {}
    for arm in ("request-level", "continuous", "continuous-chunked"):
        out[arm] = {}
        for k in scales:
            sc = load_llm_scenario(path)
            sc.workloads = [
                w.model_copy(update={"rate_rps": None if w.rate_rps is None else w.rate_rps * k})
                for w in sc.workloads
            ]
            s = summarize_arm(sc, run_arm(sc, arm, seed)).llm
            out[arm][k] = None if s is None else s.goodput_rps
    return out


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-mix.yaml")
    ap.add_argument("--seeds", default=None, help="comma-separated (default: the file's)")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--sweep",
        default="0.05,0.1,0.25,0.5,1,1.5",
        help="rate scales for the best-goodput comparison (comma-separated; '' to skip)",
    )
    args = ap.parse_args()
    sc = load_llm_scenario(args.scenario)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [sc.doc.seed]
    con = Console()
    results = []
    for seed in seeds:
        with con.status(f"simulating {sc.doc.name}, seed {seed} ..."):
            results.append(figures(args.scenario, seed))
    t = Table(title=f"{sc.doc.name}: the must-show figures (simulated)")
    t.add_column("figure")
    t.add_column("target")
    for r in results:
        t.add_column(f"seed {r['seed']}", justify="right")
    rows: list[tuple[str, str, list[str]]] = [
        ("goodput continuous / request-level", ">= 2",
         [fmt(r["continuous_over_request_level"]) for r in results]),
        ("goodput chunked / request-level", ">= 2",
         [fmt(r["chunked_over_request_level"]) for r in results]),
        ("ITL P99/P50 continuous (no chunks)", "",
         [fmt(r["itl_p99_over_p50"]["continuous"]) for r in results]),
        ("ITL P99/P50 continuous-chunked", "<= 1.5",
         [fmt(r["itl_p99_over_p50"]["continuous-chunked"]) for r in results]),
        ("ITL P99/P50 colocated (chunked)", "",
         [fmt(r["itl_p99_over_p50"]["colocated"]) for r in results]),
        *[(f"{m} goodput colocated / solo", ">= 0.95",
           [fmt(r["classic_colocated_over_solo"][m], ".3f") for r in results])
          for m in results[0]["classic_colocated_over_solo"]],
        ("LLM goodput colocated / solo", ">= 0.90",
         [fmt(r["llm_colocated_over_solo"], ".3f") for r in results]),
    ]  # fmt: skip
    for label, target, vals in rows:
        t.add_row(label, target, *vals)
    con.print(t)
    g = Table(title="LLM goodput, requests/s meeting TTFT and TPOT")
    g.add_column("arm")
    for r in results:
        g.add_column(f"seed {r['seed']}", justify="right")
    for arm in results[0]["goodput_rps"]:
        g.add_row(arm, *[fmt(r["goodput_rps"][arm]) for r in results])
    con.print(g)
    doc: dict[str, Any] = {"seeds": results}
    if args.sweep:
        scales = [float(x) for x in args.sweep.split(",")]
        with con.status("sweeping the LLM's rate ..."):
            sw = sweep(args.scenario, seeds[0], scales)
        w = Table(title=f"LLM goodput by rate scale (seed {seeds[0]}): best of each arm")
        w.add_column("arm")
        for k in scales:
            w.add_column(f"x{k:g}", justify="right")
        w.add_column("best", justify="right")
        best = {a: max((v for v in r.values() if v is not None), default=None)
                for a, r in sw.items()}  # fmt: skip
        for arm, r in sw.items():
            w.add_row(arm, *[fmt(r[k]) for k in scales], fmt(best[arm]))
        con.print(w)
        con.print(
            f"best goodput continuous / request-level: "
            f"{fmt(ratio(best['continuous'], best['request-level']))} (target >= 2); "
            f"chunked / request-level: "
            f"{fmt(ratio(best['continuous-chunked'], best['request-level']))}"
        )
        doc["sweep"] = {a: {str(k): v for k, v in r.items()} for a, r in sw.items()}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
