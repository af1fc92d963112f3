"""``evenserve tune``: search an arm's parameters in the simulator (experiment.tune)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evenserve.cli.app import console, err_console, fail
from evenserve.cli.sim_cmd import SetOpt
from evenserve.core.errors import EvenserveError
from evenserve.experiment import tune as tuning
from evenserve.experiment.tune import DEFAULT_BUDGET, GOODPUT_TOLERANCE, GRID, TuneResult, figures
from evenserve.sim.loader import load_scenario

HELP = (
    "Search routing (queue-aware weights, overload thresholds), batching per model "
    "(fixed-window window and cap) and class headroom in the simulator, with optuna's TPE "
    "sampler (seeded).\n\n"
    "Objective: minimise P99 latency subject to goodput >= the current arm's goodput x "
    f"(1 - {GOODPUT_TOLERANCE}); the best is never worse than the current arm. Regret is "
    "(tuned P99 - sweep best P99) / sweep best P99 over a 3 x 3 x 3 grid (utilization "
    "weight, memory weight, one window for every model).\n\n"
    "SCENARIO_OR_TRACE is a scenario YAML, or a JSONL trace (.jsonl) replayed on "
    "--scenario's placement."
)


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _is_trace(path: Path) -> bool:
    return path.suffix in (".jsonl", ".ndjson")


def tune(
    source: Annotated[
        Path, typer.Argument(metavar="SCENARIO_OR_TRACE", help="Scenario YAML or JSONL trace.")
    ],
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Write {current, best, params, evaluations, regret} here."),
    ] = None,
    arm: Annotated[str | None, typer.Option(help="Arm to tune (default: the first).")] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(help="With a trace: the scenario whose placement, SLOs and arms to use."),
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(help="With a trace: a cluster file (not supported yet: use --scenario)."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    budget: Annotated[
        int, typer.Option(help="Simulator evaluations of the search.")
    ] = DEFAULT_BUDGET,
    sweep: Annotated[
        bool, typer.Option("--sweep/--no-sweep", help="Run the grid sweep for the regret.")
    ] = True,
    seeds: Annotated[int, typer.Option(help="Held-out seeds to evaluate current and best on.")] = 0,
    set_: SetOpt = None,
) -> None:
    if not source.exists():
        fail(f"SCENARIO_OR_TRACE: file not found: {source}")
    if budget < 1:
        fail(f"--budget: must be at least 1 (got {budget})")
    if seeds < 0:
        fail(f"--seeds: must be at least 0 (got {seeds})")
    try:
        if _is_trace(source):
            if cluster is not None:
                fail(
                    "--cluster: building a scenario from a cluster file is not supported "
                    "yet; pass --scenario S to replay the trace on S's placement"
                )
            if scenario is None:
                fail("--scenario: a trace needs a scenario (its placement, SLOs and arms)")
            loaded = tuning.replay_trace(load_scenario(scenario, set_ or []), source)
        else:
            if cluster is not None or scenario is not None:
                which = "--cluster" if cluster is not None else "--scenario"
                fail(f"{which}: only with a trace (SCENARIO_OR_TRACE is a scenario here)")
            loaded = load_scenario(source, set_ or [])
        sc = loaded.scenario
        name = arm or next(iter(sc.arms))
        if name not in sc.arms:
            fail(f"--arm: unknown arm {name!r} (arms: {', '.join(sc.arms)})")
        quiet = json_path is not None and str(json_path) == "-"
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} evaluations"),
            TimeElapsedColumn(),
            console=err_console,
            disable=quiet,
            transient=True,
        ) as progress:
            grid = 1
            for v in GRID.values():
                grid *= len(v)
            total = budget + (grid if sweep else 0) + 2 * seeds
            task = progress.add_task(f"tuning {sc.name} / {name}", total=total)

            def step(phase: str, done: int, of: int) -> None:
                progress.update(task, description=f"{sc.name} / {name}: {phase} {done}/{of}")
                progress.advance(task, 2 if phase == "held-out" else 1)

            result = tuning.tune(
                loaded,
                name,
                seed=seed,
                budget=budget,
                sweep=sweep,
                held_out_seeds=seeds,
                progress=step,
            )
    except EvenserveError as exc:
        fail(str(exc))
        return
    if json_path is not None:
        _write_json(json_path, result.to_json())
    if json_path is None or str(json_path) != "-":
        print_result(result)


tune.__doc__ = HELP


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_result(r: TuneResult) -> None:
    cur = figures(r.current.summary)
    best = figures(r.best.summary)
    rows: list[tuple[str, dict[str, Any]]] = [("current", cur), ("best", best)]
    sb = r.sweep_best
    if sb is not None:
        rows.append((f"sweep best ({len(r.sweep)} grid points)", figures(sb.summary)))
    t = Table(title=f"tune {r.scenario} / {r.arm} (seed {r.seed}, {r.evaluations} evaluations)")
    for col in ("", "goodput rps", "SLO met", "P50 ms", "P99 ms", "P99 vs current"):
        t.add_column(col, justify="left" if not col else "right")
    for label, f in rows:
        cut = (f["p99_ms"] - cur["p99_ms"]) / cur["p99_ms"] if cur["p99_ms"] else None
        t.add_row(
            label,
            _fmt(f["goodput_rps"], ".1f"),
            _fmt(f["slo_attainment"], ".2%"),
            _fmt(f["p50_ms"], ".2f"),
            _fmt(f["p99_ms"], ".2f"),
            _fmt(cut, "+.1%"),
        )
    console.print(t)
    regret = r.regret
    console.print(
        "regret vs the sweep: "
        + ("- (no sweep)" if sb is None else _fmt(regret, "+.1%"))
        + f"; goodput floor {r.current.score.goodput_floor_rps:.1f} rps"
    )
    if r.held_out:
        h = Table(title="held-out seeds")
        for col in ("seed", "current goodput", "best goodput", "current P99", "best P99"):
            h.add_column(col, justify="right")
        for row in r.held_out:
            c, b = row["current"], row["best"]
            h.add_row(
                str(row["seed"]),
                _fmt(c["goodput_rps"], ".1f"),
                _fmt(b["goodput_rps"], ".1f"),
                _fmt(c["p99_ms"], ".2f"),
                _fmt(b["p99_ms"], ".2f"),
            )
        console.print(h)
    print_params(r.best.params)


def print_params(params: dict[str, Any] | None) -> None:
    if params is None:
        console.print("best: the current arm (not expressible as params)")
        return
    p = Table(title="best params")
    p.add_column("parameter")
    p.add_column("value", justify="right")
    for k, v in params["routing"].items():
        p.add_row(f"routing.{k}", v if isinstance(v, str) else f"{v:.3f}")
    for m, b in params["batching_per_model"].items():
        p.add_row(f"batching_per_model.{m}.max_batch_size", str(b["max_batch_size"]))
        p.add_row(f"batching_per_model.{m}.max_batch_delay_ms", f"{b['max_batch_delay_ms']:.2f}")
    h = params["class_headroom"]
    p.add_row("class_headroom", "null" if h is None else f"{h:.3f}")
    console.print(p)
