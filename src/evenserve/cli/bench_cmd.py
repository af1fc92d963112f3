"""``evenserve bench`` (load-test a live target or a scenario's arms) and ``evenserve report``.

Options are parsed here; the runs, the figures and the report are the experiment layer's
(``evenserve.experiment``: ``scenario_bench``, ``target_bench``, ``report``; an LLM
scenario's ``llm_live``, an LLM pool scenario's ``llm_pool_live``). Theory of operation of a
scenario bench and what the time scale K does: ``experiment.scenario_bench`` and
``experiment.scaling``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from evenserve.cli.app import console, err_console, fail
from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.experiment.scaling import DEFAULT_TIME_SCALE
from evenserve.sim.llm_pool_scenario import is_llm_pool_scenario
from evenserve.sim.llm_scenario import is_llm_scenario

#: An LLM scenario's default time scale (``experiment.llm_live``; a pool's too,
#: ``experiment.llm_pool_live``).
LLM_TIME_SCALE = 5.0

if TYPE_CHECKING:
    from evenserve.workload import Arrival


def parse_duration(text: str, what: str) -> float:
    """``60s``, ``2m``, ``1h``, ``500ms`` or a bare number of seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ConfigError(f"{what} {text!r}: expected a duration like 60s, 2m, 500ms")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"]
    return value


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{what} {item!r}: expected NAME=VALUE")
        out[k.strip()] = v.strip()
    return out


def bench(
    target: Annotated[
        str | None, typer.Argument(help="KServe v2 base URL (a gateway or a worker).")
    ] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(help="Bench every arm of this scenario on a local emulated cluster."),
    ] = None,
    users: Annotated[int | None, typer.Option(help="Closed loop: concurrent users.")] = None,
    think_ms: Annotated[
        float, typer.Option(help="Closed loop: mean exponential think time, ms.")
    ] = 0.0,
    rate: Annotated[float | None, typer.Option(help="Open loop: Poisson rate, req/s.")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Replay a JSONL trace (the simulator's format).")
    ] = None,
    mix: Annotated[
        str | None, typer.Option(help="Models and weights: resnet50=0.85,bert-base=0.15.")
    ] = None,
    duration: Annotated[str | None, typer.Option(help="Run length: 60s, 2m ...")] = None,
    warmup: Annotated[
        str | None, typer.Option(help="Left out of the figures at the start (e.g. 5s).")
    ] = None,
    payload: Annotated[
        list[str] | None,
        typer.Option(help="MODEL=FILE: a KServe v2 JSON request to send for MODEL."),
    ] = None,
    var_dim: Annotated[int, typer.Option(help="Size of variable (-1) input dims.")] = 1,
    encoding: Annotated[
        str,
        typer.Option(
            help="Bodies made from model metadata: binary (the binary tensor extension) or "
            "json (tensors as JSON lists, as tritonclient sends them with binary data off)."
        ),
    ] = "binary",
    slo: Annotated[
        list[str] | None, typer.Option(help="MODEL=MS: SLO for the attainment figures.")
    ] = None,
    scrape: Annotated[
        list[str] | None,
        typer.Option(help="NAME=URL of a backend to scrape (load endpoint, /metrics)."),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="EVENSERVE_ADMIN_TOKEN",
            help="Gateway admin token: scrape the backends the gateway lists.",
        ),
    ] = None,
    max_requests: Annotated[int, typer.Option(help="Hard cap on requests sent.")] = 1_000_000,
    timeout: Annotated[float, typer.Option(help="Per-request time limit, seconds.")] = 30.0,
    seed: Annotated[int | None, typer.Option(help="Seed (default: scenario's, or 0).")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for the run (default: out/...).")] = None,
    allow_remote: Annotated[
        bool, typer.Option(help="Allow a target that is not a loopback address.")
    ] = False,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    progress: Annotated[bool, typer.Option(help="Show live progress.")] = True,
    arms: Annotated[
        str | None, typer.Option(help="Scenario: only these arms (comma-separated).")
    ] = None,
    repeats: Annotated[int, typer.Option(help="Scenario: runs per arm.")] = 1,
    time_scale: Annotated[
        float | None,
        typer.Option(
            help="Scenario: K; batches, think and inter-arrival times K times longer "
            f"(default {DEFAULT_TIME_SCALE:g}; an LLM scenario's {LLM_TIME_SCALE:g})."
        ),
    ] = None,
    repo: Annotated[
        Path, typer.Option(help="Scenario: model repository the models' inputs come from.")
    ] = Path("examples/models/emulated"),
    fidelity_check: Annotated[
        bool, typer.Option("--fidelity/--no-fidelity", help="Scenario: also simulate it.")
    ] = True,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Scenario: override a field, key.path=value (repeatable)."),
    ] = None,
    level: Annotated[
        str | None,
        typer.Option(
            "--level",
            help="Scenario: run at this named load level (its open-loop phases, time-scaled).",
        ),
    ] = None,
    realtime: Annotated[
        bool,
        typer.Option(
            "--realtime/--no-realtime",
            help="Run the sending thread at real-time priority when permitted (else nice -10).",
        ),
    ] = True,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Scenario: also write the summary JSON here."),
    ] = None,
    rate_scale: Annotated[
        float | None,
        typer.Option(
            help="LLM scenario (kind: llm or llm-pool): every open-loop rate times this, "
            "live and simulated alike."
        ),
    ] = None,
) -> None:
    """Load-test a live KServe v2 target, or every arm of a scenario on a local cluster."""
    # Imported here: the other commands (worker, gateway) start without the load generator,
    # the experiment layer and matplotlib.
    from evenserve.experiment.scenario_bench import ScenarioBench, run_scenario_bench
    from evenserve.experiment.target_bench import TargetBench, run_target_bench
    from evenserve.loadgen.spec import LoadSpec
    from evenserve.loadgen.target import check_url
    from evenserve.workload import parse_mix, read_trace

    try:
        if (target is None) == (scenario is None):
            raise ConfigError("give a TARGET_URL or --scenario FILE (one of them)")
        if level is not None and scenario is None:
            raise ConfigError("--level: only with --scenario (a load level of the scenario)")
        if json_path is not None and scenario is None:
            raise ConfigError("--json: only with --scenario (the target bench writes --out)")
        if scenario is not None and is_llm_pool_scenario(scenario):
            raise typer.Exit(_llm_bench(scenario, arms, duration, warmup, time_scale,
                                        max_requests, json_path, seed, set_, level,
                                        rate_scale, pool=True))  # fmt: skip
        if scenario is not None and is_llm_scenario(scenario):
            raise typer.Exit(_llm_bench(scenario, arms, duration, warmup, time_scale,
                                        max_requests, json_path, seed, set_, level,
                                        rate_scale))  # fmt: skip
        if rate_scale is not None:
            raise ConfigError("--rate-scale: only with an LLM scenario (kind: llm or llm-pool)")
        if time_scale is None:
            time_scale = DEFAULT_TIME_SCALE
        if scenario is not None:
            res = run_scenario_bench(
                ScenarioBench(
                    scenario,
                    overrides=set_ or [],
                    level=level,
                    arms=None if arms is None else [a.strip() for a in arms.split(",") if a],
                    repeats=repeats,
                    time_scale=time_scale,
                    duration_s=parse_duration(duration, "--duration") if duration else None,
                    warmup_s=None if warmup is None else parse_duration(warmup, "--warmup"),
                    repo=repo,
                    seed=seed,
                    out=out,
                    plots=plots,
                    progress=progress,
                    fidelity=fidelity_check,
                    max_requests=max_requests,
                    timeout_s=timeout,
                    realtime=realtime,
                ),
                console,
                err_console,
            )
            if json_path is not None:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(res.summary, indent=2) + "\n")
            return
        assert target is not None
        url = check_url(target, allow_remote)
        entries: list[Arrival] | None = None
        if trace is not None:
            entries = read_trace(trace)
            if not entries:
                raise ConfigError(f"--trace {trace}: no requests in the trace")
        if mix is None and entries is None:
            raise ConfigError(
                "--mix: which models to send (e.g. --mix resnet50=0.85,bert-base=0.15)"
            )
        weights = parse_mix(mix) if mix is not None else {}
        if users is None and rate is None and entries is None:
            raise ConfigError("give --users N (closed loop), --rate R (open loop) or --trace FILE")
        dur = parse_duration(duration or "60s", "--duration")
        wu = parse_duration(warmup or "0s", "--warmup")
        payload_files = {m: Path(p) for m, p in _pairs(payload, "--payload").items()}
        slos = {}
        for m, v in _pairs(slo, "--slo").items():
            try:
                slos[m] = float(v)
            except ValueError:
                raise ConfigError(f"--slo {m}={v}: not a number of milliseconds") from None
        spec = LoadSpec(
            target=url,
            mix=weights,
            duration_s=dur,
            warmup_s=wu,
            users=users,
            think_s=think_ms / 1000.0,
            rate_rps=rate,
            trace=entries,
            max_requests=max_requests,
            timeout_s=timeout,
            seed=seed or 0,
            var_dim=var_dim,
            encoding=encoding,
            payload_files=payload_files,
        )
        done = run_target_bench(
            TargetBench(
                spec,
                slo_ms=slos,
                scrape=_pairs(scrape, "--scrape"),
                admin_token=admin_token,
                allow_remote=allow_remote,
                out=out,
                plots=plots,
                progress=progress,
                realtime=realtime,
                trace_path=trace,
            ),
            console,
            err_console,
        )
    except EvenserveError as exc:
        fail(str(exc))
    if done.ok == 0:
        raise typer.Exit(1)


def report(
    runs: Annotated[list[Path], typer.Argument(help="Bench folders (or single run folders).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write (default: RUN/report of the first).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
) -> None:
    """Tables, plots and an HTML report from saved bench runs (figures recomputed from raw)."""
    from evenserve.experiment.report import rebuild_report

    try:
        rebuild_report(runs, out, plots, console)
    except EvenserveError as exc:
        fail(str(exc))


def _llm_bench(
    scenario: Path,
    arms: str | None,
    duration: str | None,
    warmup: str | None,
    time_scale: float | None,
    max_requests: int,
    json_path: Path | None,
    seed: int | None,
    set_: list[str] | None,
    level: str | None,
    rate_scale: float | None = None,
    *,
    pool: bool = False,
) -> int:
    """An LLM scenario's arms live next to the simulator (``experiment.llm_live``; a pool
    scenario's: ``experiment.llm_pool_live``)."""
    if pool:
        from evenserve.experiment.llm_pool_live import main as live
    else:
        from evenserve.experiment.llm_live import main as live

    if seed is not None or set_ or level:
        raise ConfigError("--seed, --set and --level apply to classic scenarios, not an LLM one")
    argv = ["--scenario", str(scenario), "--time-scale", str(time_scale or LLM_TIME_SCALE)]
    if rate_scale is not None:
        argv += ["--rate-scale", str(rate_scale)]
    for a in (arms or "").split(","):
        if a.strip():
            argv += ["--arm", a.strip()]
    if duration:
        argv += ["--duration", str(parse_duration(duration, "--duration"))]
    if warmup:
        argv += ["--warmup", str(parse_duration(warmup, "--warmup"))]
    argv += ["--max-requests", str(max_requests)]
    if json_path is not None:
        argv += ["--json", str(json_path)]
    return live(argv)
