"""``evenserve tune``: search an arm's parameters in the simulator (experiment.tune)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from evenserve.cli.app import console, counted_progress, fail, write_json
from evenserve.cli.bench_cmd import parse_duration
from evenserve.cli.params_cmd import TokenFile, read_token
from evenserve.cli.sim_cmd import SetOpt
from evenserve.core.errors import EvenserveError
from evenserve.experiment import tune as tuning
from evenserve.experiment.cluster_scenario import replay_on_cluster
from evenserve.experiment.tune import DEFAULT_BUDGET, GOODPUT_TOLERANCE, GRID, TuneResult, figures
from evenserve.experiment.watch import (
    HttpWatchClient,
    SimPredictor,
    WatchEvent,
    WatchPolicy,
    run_watch,
)
from evenserve.httpio.params_client import ParamsAPIError, get_params, push_params
from evenserve.sim.loader import load_scenario

HELP = (
    "Search routing (queue-aware weights, overload thresholds), batching per model "
    "(fixed-window window and cap), class headroom and learn_profiles in the simulator, "
    "with optuna's TPE sampler (seeded).\n\n"
    "Objective: minimise P99 latency subject to goodput >= the current arm's goodput x "
    f"(1 - {GOODPUT_TOLERANCE}); the best is never worse than the current arm. Regret is "
    "(tuned P99 - sweep best P99) / sweep best P99 over a 3 x 3 x 3 x 2 grid (utilization "
    "weight, memory weight, one window for every model, learn_profiles off/on).\n\n"
    "SCENARIO_OR_TRACE is a scenario YAML, or a JSONL trace (.jsonl) replayed on "
    "--scenario's placement, or on --cluster's: a cluster file read back as a scenario of one "
    "arm (its devices and profile sets, each model's SLO and batching from its model.yaml, the "
    "gateway's routing and overload refusal, the workers' --learn-profiles).\n\n"
    "--push URL applies the best parameters to a running gateway (PUT /admin/params against "
    "the version read just before). --watch URL --every 5m loops on a running gateway (with "
    "recording on): every window it replays the window's recorded requests on the scenario's "
    "placement, applies a candidate only when predicted at least --margin better in P99 "
    "(goodput no lower), judges each change over the next window and rolls it back when live "
    "P99 exceeds the calibrated prediction by more than 15 %; at most one change per window "
    "(design note 0011)."
)


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
        typer.Option(
            help="With a trace: the cluster file whose devices, models and gateway to use "
            "(instead of --scenario)."
        ),
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
    push: Annotated[
        str | None, typer.Option(help="Apply the best parameters to this running gateway.")
    ] = None,
    watch: Annotated[
        str | None,
        typer.Option(help="Watch this running gateway: tune every --every, apply, roll back."),
    ] = None,
    every: Annotated[str, typer.Option(help="--watch: the window (60s, 5m, ...).")] = "5m",
    windows: Annotated[
        int | None, typer.Option(help="--watch: stop after this many windows (default: never).")
    ] = None,
    margin: Annotated[
        float, typer.Option(help="--watch: apply only if predicted P99 is this much lower.")
    ] = 0.10,
    token_file: TokenFile = None,
) -> None:
    if watch is not None:
        args = (every, windows, margin, budget, arm, seed, set_, token_file, json_path)
        _watch(source, watch, *args)
        return
    if not source.exists():
        fail(f"SCENARIO_OR_TRACE: file not found: {source}")
    push_token = None
    if push is not None:  # before a search that may take minutes: the gateway answers
        push_token = read_token(token_file)
        try:
            get_params(push, push_token)
        except ParamsAPIError as exc:
            fail(f"--push: {exc}")
    if budget < 1:
        fail(f"--budget: must be at least 1 (got {budget})")
    if seeds < 0:
        fail(f"--seeds: must be at least 0 (got {seeds})")
    try:
        if _is_trace(source):
            if cluster is not None and scenario is not None:
                fail("--cluster, --scenario: give one (the placement to replay the trace on)")
            if cluster is not None:
                if set_:
                    fail("--set: only with --scenario (edit the cluster file instead)")
                if not cluster.exists():
                    fail(f"--cluster: file not found: {cluster}")
                loaded = replay_on_cluster(cluster, source)
            elif scenario is None:
                fail(
                    "--scenario: a trace needs a scenario (its placement, SLOs and arms) or "
                    "--cluster (a cluster file)"
                )
            else:
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
        with counted_progress("evaluations", quiet) as progress:
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
    out = result.to_json()
    if push is not None and push_token is not None:
        out["push"] = _push(push, push_token, result)
    if json_path is not None:
        write_json(json_path, out)
    if json_path is None or str(json_path) != "-":
        print_result(result)
        if push is not None:
            console.print(f"pushed to {push}: {out['push']['status']}", highlight=False)


def _push(url: str, token: str, result: TuneResult) -> dict[str, Any]:
    """PUT the best parameters on ``url`` against the version read just before."""
    if result.best.params is None:
        fail("--push: the best is the current arm, which is not expressible as params")
    assert result.best.params is not None
    if result.best is result.current:
        return {"status": "nothing to push: the current parameters are the best found"}
    try:
        cur = get_params(url, token)
        reply = push_params(
            url,
            token,
            result.best.params,
            expected_version=int(cur["version"]),
            note=f"evenserve tune {result.scenario}/{result.arm} seed {result.seed}",
        )
    except ParamsAPIError as exc:
        fail(f"--push: {exc}")
        raise
    return {"status": f"version {reply['version']}", "reply": reply}


def _watch(
    source: Path,
    url: str,
    every: str,
    windows: int | None,
    margin: float,
    budget: int,
    arm: str | None,
    seed: int | None,
    set_: list[str] | None,
    token_file: Path | None,
    json_path: Path | None,
) -> None:
    if not source.exists() or _is_trace(source):
        fail("SCENARIO_OR_TRACE: --watch needs a scenario (the cluster's placement, SLOs, arm)")
    if budget < 2:
        fail(f"--budget: --watch needs at least 2 evaluations per window (got {budget})")
    if windows is not None and windows < 1:
        fail(f"--windows: must be at least 1 (got {windows})")
    if not 0.0 <= margin < 1.0:
        fail(f"--margin: must be in [0, 1) (got {margin})")
    try:
        every_s = parse_duration(every, "--every")
        if every_s <= 0:
            fail("--every: must be positive")
        loaded = load_scenario(source, set_ or [])
    except EvenserveError as exc:
        fail(str(exc))
        return
    sc = loaded.scenario
    name = arm or next(iter(sc.arms))
    if name not in sc.arms:
        fail(f"--arm: unknown arm {name!r} (arms: {', '.join(sc.arms)})")
    token = read_token(token_file)
    client = HttpWatchClient(url, token)
    try:  # the gateway answers, the token is right and it records: else say so now
        client.get_params()
        client.pull_log(time.time())
    except EvenserveError as exc:
        fail(f"--watch: {exc}")
    predictor = SimPredictor(loaded, name, budget=budget, seed=sc.seed if seed is None else seed)
    policy = WatchPolicy(
        slo_ms={m: v.slo_ms for m, v in sc.models.items()}, window_s=every_s, margin=margin
    )

    def show(ev: WatchEvent) -> None:
        console.print(f"window {ev.window}: {ev.action}: {ev.reason}", highlight=False)
        if json_path is not None:
            write_json(json_path, {"events": [e.as_dict() for e in policy.events]})

    console.print(
        f"watching {url} every {every_s:g} s on {sc.name} / {name} (budget {budget} a window)",
        highlight=False,
    )
    try:
        run_watch(
            client,
            predictor,
            policy,
            now=time.time,
            sleep=time.sleep,
            windows=windows,
            on_event=show,
        )
    except KeyboardInterrupt:
        console.print("stopped")
    except EvenserveError as exc:
        fail(str(exc))


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
    lp = params.get("learn_profiles")
    p.add_row("learn_profiles", "null" if lp is None else str(lp).lower())
    console.print(p)
