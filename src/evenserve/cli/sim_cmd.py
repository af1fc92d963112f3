"""``evenserve simulate``, ``compare`` and ``policies``: scenarios in the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from evenserve.cli.app import console, counted_progress, fail, write_json
from evenserve.cli.llm_placement_sim import is_llm_placement_scenario, simulate_llm_placement
from evenserve.cli.llm_sim import simulate_llm, simulate_llm_pool
from evenserve.core.errors import EvenserveError
from evenserve.policy.batching import BATCHING
from evenserve.policy.routing import ROUTING
from evenserve.report.summary import run_summary, summarize
from evenserve.report.table import arm_table, compare_rows, compare_table, device_table
from evenserve.sim.cluster import simulate as run_arm
from evenserve.sim.llm_pool_scenario import is_llm_pool_scenario
from evenserve.sim.llm_scenario import is_llm_scenario
from evenserve.sim.loader import load_scenario, with_level


def _source(
    scenario: Path, arm: str | None, seed: int, set_: list[str] | None, level: str | None
) -> dict[str, Any]:
    """What a summary came from, so ``diagnose`` can replay its arrivals."""
    return {
        "scenario": str(scenario.resolve()),
        "arm": arm,
        "seed": seed,
        "set": list(set_ or []),
        "level": level,
        "trace": None,
        "duration_s": None,
    }


LevelOpt = Annotated[
    str | None, typer.Option("--level", help="Run at a named load level of the scenario.")
]
ScenarioArg = Annotated[Path, typer.Argument(help="Scenario YAML file.")]
SeedOpt = Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")]
JsonOpt = Annotated[
    Path | None, typer.Option("--json", help="Write the run summary JSON here ('-': stdout).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a scenario field: key.path=value (repeatable)."),
]


def simulate(
    scenario: ScenarioArg,
    arm: Annotated[
        str | None,
        typer.Option(help="Arm to run (default: the first; an LLM scenario: every arm)."),
    ] = None,
    set_: SetOpt = None,
    level: LevelOpt = None,
    seed: SeedOpt = None,
    json_path: JsonOpt = None,
) -> None:
    """Simulate one arm of a scenario and print its figures (an LLM scenario, kind: llm,
    llm-pool or llm-placement: every arm unless --arm)."""
    if is_llm_pool_scenario(scenario):
        if set_ or level:
            fail("--set and --level apply to classic scenarios, not an LLM one (kind: llm-pool)")
        simulate_llm_pool(scenario, arm, seed, json_path)
        return
    if is_llm_placement_scenario(scenario):
        if set_ or level:
            fail("--set and --level apply to classic scenarios, not kind: llm-placement")
        simulate_llm_placement(scenario, arm, seed, json_path)
        return
    if is_llm_scenario(scenario):
        if set_ or level:
            fail("--set and --level apply to classic scenarios, not an LLM one (kind: llm)")
        simulate_llm(scenario, arm, seed, json_path)
        return
    try:
        loaded = with_level(load_scenario(scenario, set_ or []), level)
        sc = loaded.scenario
        name = arm or next(iter(sc.arms))
        if name not in sc.arms:
            fail(f"--arm: unknown arm {name!r} (arms: {', '.join(sc.arms)})")
        s = seed if seed is not None else sc.seed
        with console.status(f"simulating {sc.name} / {name} ..."):
            summary_arm = summarize(run_arm(loaded, name, s))
    except EvenserveError as exc:
        fail(str(exc))
        return
    summary = run_summary(sc.name, s, {name: summary_arm})
    summary["source"] = _source(scenario, name, s, set_, level)
    if json_path is not None:
        write_json(json_path, summary)
    if json_path is None or str(json_path) != "-":
        console.print(arm_table(name, summary["arms"][name]))
        console.print(device_table(summary["arms"][name]))
        a = summary["arms"][name]
        r = a["requests"]
        console.print(
            f"spread {a['utilization_spread_pts']:.1f} pts, max queue depth "
            f"{a['max_queue_depth']:.0f}; requests: {r['arrived']} arrived = {r['completed']} "
            f"completed + {r['dropped']} dropped + {r['in_flight']} in flight"
        )


def compare(
    scenario: ScenarioArg,
    set_: SetOpt = None,
    level: LevelOpt = None,
    seed: SeedOpt = None,
    json_path: JsonOpt = None,
    plots: Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")] = None,
) -> None:
    """Run every arm of a scenario with the same seed; print them side by side."""
    if is_llm_pool_scenario(scenario):
        if set_ or level or plots:
            fail("--set, --level and --plots apply to classic scenarios, not an LLM one")
        simulate_llm_pool(scenario, None, seed, json_path)
        return
    if is_llm_placement_scenario(scenario):
        if set_ or level or plots:
            fail("--set, --level and --plots apply to classic scenarios, not kind: llm-placement")
        simulate_llm_placement(scenario, None, seed, json_path)
        return
    if is_llm_scenario(scenario):
        if set_ or level or plots:
            fail("--set, --level and --plots apply to classic scenarios, not an LLM one")
        simulate_llm(scenario, None, seed, json_path)
        return
    try:
        loaded = with_level(load_scenario(scenario, set_ or []), level)
        sc = loaded.scenario
        s = seed if seed is not None else sc.seed
        arms: dict[str, Any] = {}
        quiet = json_path is not None and str(json_path) == "-"
        with counted_progress("arms", quiet) as progress:
            task = progress.add_task(f"simulating {sc.name}", total=len(sc.arms))
            for name in sc.arms:
                progress.update(task, description=f"simulating {sc.name} / {name}")
                arms[name] = summarize(run_arm(loaded, name, s))
                progress.advance(task)
    except EvenserveError as exc:
        fail(str(exc))
        return
    summary = run_summary(sc.name, s, arms)
    summary["source"] = _source(scenario, None, s, set_, level)
    summary["comparison"] = compare_rows(summary)
    if json_path is not None:
        write_json(json_path, summary)
    if json_path is None or str(json_path) != "-":
        console.print(compare_table(summary))
    if plots is not None:
        from evenserve.report.plots import write_plots  # matplotlib: only when plotting

        paths = write_plots(summary, plots)
        if json_path is None or str(json_path) != "-":
            console.print("plots: " + ", ".join(str(p) for p in paths))


def policies(
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """List the routing and batching policies and their parameters."""
    data: dict[str, Any] = {"routing": {}, "batching": {}}
    for kind, reg in (("routing", ROUTING), ("batching", BATCHING)):
        for n in reg.names():
            e = reg.entry(n)
            data[kind][n] = {
                "summary": e.summary,
                "params": {
                    k: (None if f.default is None else f.default)
                    for k, f in e.params_model.model_fields.items()
                    if not callable(f.default_factory)
                },
            }
    data["routing"]["central-queue"] = {
        "summary": "simulator reference arm: shared per-model queues, late binding",
        "params": {},
    }
    if json_out:
        write_json(Path("-"), data)
        return
    for kind in ("routing", "batching"):
        console.print(f"[bold]{kind}[/]")
        for n, v in data[kind].items():
            params = ", ".join(f"{k}={val}" for k, val in v["params"].items())
            console.print(f"  {n:22s} {v['summary']}" + (f"  [dim]({params})[/]" if params else ""))
