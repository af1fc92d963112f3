"""``evenserve diagnose``: findings from a run, with changes verified in the simulator."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from evenserve.cli.app import console, counted_progress, fail, write_json
from evenserve.cli.bench_cmd import parse_duration
from evenserve.cli.params_cmd import TokenFile, read_token
from evenserve.core.errors import EvenserveError
from evenserve.experiment import diagnose as dx
from evenserve.experiment.live_diagnose import collect_live, push_recommendation
from evenserve.httpio.params_client import ParamsAPIError, get_params

HELP = (
    "Name what holds a run back, with the evidence: slow-device (batches slower than the "
    "profile), hot-node (a queue over 3x the others'), scheduling-imbalance (work waits on "
    "one host of a model while another idles), overload-shedding, transfer-stall (input "
    "staging), memory-pressure (batches near the 85 % cap), compute-bound-waiting, "
    "window-too-long, static-batch-wait, batching-sawtooth (one request at a time while "
    "batching would pay), memory-bound-small-batches, slo-at-risk.\n\n"
    "RUN is a summary JSON that simulate, compare or bench wrote; --live URL --window 60s "
    "measures a running gateway's cluster instead (its workers' counters and the gateway's "
    "histograms; latency percentiles are histogram estimates). Each finding's candidate "
    "changes are replayed in the simulator on the run's arrivals (the scenario a simulate/"
    "compare summary names, or --scenario [--trace] for a live run), and the best one "
    "(lowest P99 at goodput no lower) is the recommendation, with its predicted change in "
    "P99, goodput, SLO attainment and utilization spread. --apply URL pushes the best "
    "recommendation that is a parameter change through the gateway's /admin/params "
    "(design note 0012)."
)


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        fail(f"RUN: file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"RUN: {path}: not JSON ({exc})")
    if not isinstance(data, dict):
        fail(f"RUN: {path}: expected a summary object")
    return data


@contextlib.contextmanager
def _null() -> Iterator[None]:
    yield


def _pct(ch: dict[str, Any]) -> str:
    b, a, p = ch["before"], ch["after"], ch["change_pct"]
    if b is None or a is None:
        return "-"
    return f"{b:.4g} -> {a:.4g}" + (f" ({p:+.1f} %)" if p is not None else "")


def _print(run: str, arm: str, findings: list[dict[str, Any]], verified: bool) -> None:
    if not findings:
        console.print(f"[bold]{run}[/] / {arm}: no findings")
        return
    t = Table(title=f"{run} / {arm}: {len(findings)} findings", title_justify="left")
    for col in ("severity", "finding", "where", "what"):
        t.add_column(col, overflow="fold")
    for f in findings:
        where = " / ".join(x for x in (f["device"], f["model"]) if x) or "-"
        t.add_row(f["severity"], f["kind"], where, f["summary"])
    console.print(t)
    if not verified:
        return
    for f in findings:
        rec = f.get("recommendation")
        where = " / ".join(x for x in (f["device"], f["model"]) if x)
        head = f"{f['kind']}{' (' + where + ')' if where else ''}"
        if rec is None:
            tried = len(f.get("tried") or [])
            console.print(f"  {head}: no change tried ({tried}) was better in the simulator")
            continue
        p = rec["predicted"]
        console.print(
            f"  {head}: [bold]{rec['change']}[/]{'' if rec['pushable'] else ' (not pushable)'}"
            f"\n     P99 ms {_pct(p['p99_ms'])}, goodput rps {_pct(p['goodput_rps'])}, "
            f"SLO {_pct(p['slo_attainment'])}, spread pts {_pct(p['utilization_spread_pts'])}"
        )


def _print_combined(c: dict[str, Any] | None) -> None:
    if c is None:
        return
    if "error" in c:
        console.print(f"  together: {c['error']}")
        return
    p = c["predicted"]
    console.print(
        f"  [bold]{c['change']}[/]\n     P99 ms {_pct(p['p99_ms'])}, goodput rps "
        f"{_pct(p['goodput_rps'])}, SLO {_pct(p['slo_attainment'])}, spread pts "
        f"{_pct(p['utilization_spread_pts'])}"
    )


def best_pushable(
    all_findings: list[dict[str, Any]], combined: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Among every finding's recommendation that is a parameter change, and the combined
    changes that beat their replay, the lowest predicted P99."""
    recs = [
        f["recommendation"]
        for f in all_findings
        if f.get("recommendation") and f["recommendation"]["pushable"]
    ]
    recs += [c for c in combined if c.get("better")]
    return min(recs, key=lambda r: r["predicted"]["p99_ms"]["after"], default=None)


def diagnose(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(metavar="[RUN...]", help="Summary JSON files (or --live URL)."),
    ] = None,
    live: Annotated[
        str | None,
        typer.Option(
            help="Measure this running gateway's cluster for --window instead of reading RUN."
        ),
    ] = None,
    window: Annotated[
        str, typer.Option(help="--live: how long to measure (30s, 2m, ...).")
    ] = "60s",
    save: Annotated[
        Path | None, typer.Option(help="--live: also write the measured summary JSON here.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the findings here ('-': stdout).")
    ] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(help="The scenario to replay on (a live run's; default: the run's own)."),
    ] = None,
    arm: Annotated[
        list[str] | None, typer.Option(help="Diagnose only this arm (repeatable).")
    ] = None,
    replay_arm: Annotated[
        str | None,
        typer.Option(help="With --scenario: the arm the run ran (default: the summary's arm)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the replay (default: the run's).")
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="With --scenario: a recorded trace (JSONL) to replay on its placement."),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option("--verify/--no-verify", help="Try each finding's changes in the simulator."),
    ] = True,
    verify_s: Annotated[
        float | None,
        typer.Option(help="Replay only the first this many seconds (default: the whole run)."),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Simulator runs at once (default: cores).")
    ] = None,
    plots: Annotated[
        Path | None,
        typer.Option(help="Write a diagnosis PNG per arm into this folder."),
    ] = None,
    apply: Annotated[
        str | None,
        typer.Option(help="Push the best parameter-change recommendation to this gateway."),
    ] = None,
    token_file: TokenFile = None,
) -> None:
    t_start = time.perf_counter()
    quiet = json_path is not None and str(json_path) == "-"
    sources: list[tuple[str, dict[str, Any]]] = []
    if live is not None:
        if runs:
            fail("RUN, --live: give one (files to read, or a gateway to measure)")
        try:
            window_s = parse_duration(window, "--window")
        except EvenserveError as exc:
            fail(str(exc))
        live_token = read_token(token_file)
        try:
            with (
                console.status(f"measuring {live} for {window_s:g} s ...") if not quiet else _null()
            ):
                measured = collect_live(live, window_s, live_token)
        except EvenserveError as exc:
            fail(f"--live: {exc}")
        if save is not None:
            write_json(save, measured)
        sources.append((live, measured))
    elif not runs:
        fail("RUN: give one or more summary JSON files, or --live URL")
    else:
        if save is not None:
            fail("--save: only with --live")
        sources = [(str(p), _read(p)) for p in runs]
    token = None
    if apply is not None:
        if not verify:
            fail("--apply: needs --verify (only a change verified in the simulator is pushed)")
        token = read_token(token_file)
        try:
            get_params(apply, token)
        except ParamsAPIError as exc:
            fail(f"--apply: {exc}")
    if verify_s is not None and verify_s <= 0:
        fail(f"--verify-s: must be > 0 (got {verify_s})")
    if trace is not None and scenario is None:
        fail("--trace: needs --scenario (the placement to replay it on)")
    report: dict[str, Any] = {"runs": []}
    every: list[dict[str, Any]] = []
    combined: list[dict[str, Any]] = []
    for path, summary in sources:
        t_read = time.perf_counter()
        try:
            per_arm = dx.diagnose_summary(summary)
            names = dx.arms_to_verify(summary, arm)
        except EvenserveError as exc:
            fail(f"{path}: {exc}")
        read_s = time.perf_counter() - t_read
        entry: dict[str, Any] = {"run": path, "read_s": round(read_s, 3), "arms": {}}
        own = dx.replay_of(summary)
        for name in names:
            findings = per_arm[name]
            item: dict[str, Any] = {"findings": findings, "verified": False}
            if verify and findings:
                replay = None
                if scenario is not None:
                    replay = dx.Replay(
                        scenario, replay_arm or name, seed, (), None, trace, verify_s
                    )
                elif own is not None:
                    replay = dataclasses.replace(
                        own,
                        arm=own.arm or name,
                        seed=own.seed if seed is None else seed,
                        duration_s=verify_s,
                    )
                if replay is None:
                    item["not_verified"] = (
                        "the summary names no scenario (a live run): give --scenario to verify"
                    )
                else:
                    item.update(_verify(findings, replay, replay.arm or name, jobs, quiet))
            entry["arms"][name] = item
            if plots is not None:
                from evenserve.report.plots import plot_diagnosis  # matplotlib: only here

                plots.mkdir(parents=True, exist_ok=True)
                label = f"{Path(path).stem}-{name}" if len(sources) > 1 else name
                item["plot"] = str(plot_diagnosis(label, summary["arms"][name], findings, plots))
            every += findings
            if item.get("combined"):
                combined.append(item["combined"])
            if not quiet:
                _print(path, name, findings, item["verified"])
                _print_combined(item.get("combined"))
                if "not_verified" in item:
                    console.print(f"  [dim]not verified: {item['not_verified']}[/]")
        report["runs"].append(entry)
    if apply is not None:
        report["applied"] = _apply(apply, token or "", every, combined, quiet)
    report["elapsed_s"] = round(time.perf_counter() - t_start, 3)
    if json_path is not None:
        write_json(json_path, report)


def _verify(
    findings: list[dict[str, Any]], replay: dx.Replay, arm: str, jobs: int | None, quiet: bool
) -> dict[str, Any]:
    t0 = time.perf_counter()
    with counted_progress("simulator runs", quiet) as progress:
        task = progress.add_task(f"verifying on {replay.scenario.name} / {arm}", total=None)

        def step(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            v = dx.verify(findings, replay, arm, jobs=jobs, progress=step)
        except EvenserveError as exc:
            fail(f"verify: {exc}")
    return {
        "verified": True,
        "combined": v.combined,
        "replay": v.replay,
        "replayed": v.baseline,
        "simulator_runs": v.runs,
        "verify_s": round(time.perf_counter() - t0, 3),
    }


def _apply(
    url: str,
    token: str,
    findings: list[dict[str, Any]],
    combined: list[dict[str, Any]],
    quiet: bool,
) -> dict[str, Any]:
    rec = best_pushable(findings, combined)
    if rec is None:
        if not quiet:
            console.print("--apply: no verified parameter change to push")
        return {"pushed": False, "reason": "no verified parameter change"}
    try:
        version = push_recommendation(url, rec["params"], token)
    except EvenserveError as exc:
        fail(f"--apply: {exc}")
    if not quiet:
        console.print(f"--apply: pushed {rec['change']!r} as version {version}")
    return {"pushed": True, "change": rec["change"], "params": rec["params"], "version": version}


diagnose.__doc__ = HELP
