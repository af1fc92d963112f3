"""An LLM scenario live on an emulated worker, side by side with the simulator.

For each arm of an LLM scenario (``kind: llm``, default ``scenarios/llm-mix.yaml``), this
starts ``evenserve worker --device emulated:<the scenario's profile set>`` on 127.0.0.1 with
a repository written for the arm, drives it with the very requests the simulator offers, and
prints the live figures next to ``sim.llm.run_arm``'s on a copy of the scenario with the same
duration, warm-up and rates.

The arm on the worker. The LLM folder's ``model.yaml`` (``kind: llm``, ``runtime: emulated``)
holds the scenario's ``llm.engine`` merged with the arm's ``engine`` overrides, with the
defaults the simulator fills in (``sim.llm.engine_setup``: the step budget, max_num_seqs,
prefix caching, no waiting-queue bound), the tightest workload TPOT (the interleaving's bound,
as the simulator sets it) and, as its class, the class the workloads' requests carry (the
streaming client sends none; the simulator interleaves by the requests' class). The classic
models (arms with ``classic``) get the scenario's batching, batch size, SLO and class; their
batch times come from the device's profile set by model name, as the simulated ones do. Their
tensors are tiny (four floats): the profile, not the payload, decides a batch's time, and a
ResNet-50 image in JSON would make the HTTP path, not the device, the bottleneck on a small
host.

The load. LLM workloads: ``workload.llm.iter_llm_open_loop`` with the simulator's seeds
(``seed + 1000 x k`` for workload ``k``), sent by ``loadgen.openai_client.run_open_loop``
(streamed ``/v1/completions``, prompts as token ids, ``ignore_eos``; TTFT counts from the
scheduled time, so a late send shows); closed-loop workloads by ``run_closed_loop``. Classic
models: the simulator's Poisson streams (``arrivals_rng(seed, "classic:<model>")``), each
request a KServe v2 JSON POST, its latency from its scheduled time to the answer. Arrivals
stop at ``--duration``; what arrived is answered (at most ``--drain`` more seconds). Both
sides' figures are ``sim.llm.summarize_arm``'s over ``[--warmup, --duration)``: the live
records go through the same code.

Prompt ids. The emulated LLM's tokenizer is the built-in byte-level one, which refuses ids
past its vocabulary (259); the scenario's workloads draw ids below ``vocab`` (32000 by
default). Both sides therefore draw them below ``--vocab`` (256): the request shapes (lengths,
prefix groups, arrivals) are drawn on their own streams and do not change, and the simulator
reads ids only through the prefix cache's block hashes, where a chance match of 16 random ids
is as unlikely with 256 values as with 32000.

Time scale K (``--time-scale``, default 5). A live run pays what the simulator does not: the
HTTP round trip of every classic request (about 5 ms on a shared 2-core host, where the H100
profiles' batches take 0.3 to 5 ms), the worker's Python around each engine step, and the
host's late wake-ups. So both sides run the scenario K times slower: every profile time (the
classic profiles' batch latencies; the step profile's c0, per-token, per-sequence, per-KV-token
and CPU terms) K times longer, every rate K times lower, phases, SLOs, TTFT/TPOT targets,
think times and batching windows (every ``*_ms`` of a classic entry's ``batching``) K times
longer, ``--duration`` and ``--warmup`` given in scenario seconds (the run takes K x
``--duration``). The simulator's figures scale exactly (its figures at K, divided by K, are
its figures at 1), so the comparison is printed in the scenario's own units (times / K, rates
x K) and the fixed live overheads shrink K times against them. ``--rate-scale`` multiplies
every open-loop rate on both sides alike besides.

The comparison: each figure's ratio live / sim; a mean (and a classic P50, and a goodput)
within 5 %, a P99 within 10 % (the issue's bound). Reported with it, to tell a mismatch from
contention: the process CPU of the worker and of this client over the run, the client's send
lateness, and how late the emulated runtime's precise sleep wakes on this host right after the
run (a sleep of the step profile's c0).

    evenserve bench --scenario scenarios/llm-mix.yaml --arms continuous-chunked,colocated \\
        --duration 20 --warmup 4 --time-scale 10 [--json out/llm-live.json]

Measured (2 shared cores; ``evenserve bench --scenario scenarios/llm-mix.yaml --arms
continuous-chunked,colocated --duration 20s --warmup 4s --time-scale 10``: the whole
scenario's rates, 114 LLM requests and about 9,400 classic ones in the 16 s window, about 4
minutes an arm; the worker and this client each under 0.1 core): ``continuous-chunked`` every
figure within its bound (live / sim: TTFT mean 1.020, P99 1.022; TPOT 1.008, 1.010; ITL
1.008, 1.018; end-to-end 1.009, 1.007; goodput 1.000). ``colocated``: TPOT 1.026 / 1.025, ITL
1.025 / 1.032, end-to-end 1.027 / 1.032, goodput 1.000 within; TTFT mean 1.061 (P99 1.065)
just over the 5 %; the classic models' goodput 1.00 and P99 1.045 / 1.050 within, P50 1.09 /
1.11 not: every classic request's HTTP round trip and the worker's Python around each batch
and step, which the time scale shrinks but does not remove. At K = 1 (rates x 0.25)
``continuous-chunked`` is 25 to 28 % slower live and ``classic-solo``'s P50 3 times the
simulator's: the host's late wake-ups and the HTTP path weigh as much as the H100's steps and
batches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evenserve.core.clock import RealClock
from evenserve.core.llm import GenerationRecord, load_step_profiles
from evenserve.core.wire import PRIORITY_CLASSES
from evenserve.loadgen.openai_client import run_closed_loop, run_open_loop
from evenserve.sched.engine import EngineSetup
from evenserve.sim.llm import (
    ArmFigures,
    ArmRun,
    LlmSimRequest,
    engine_setup,
    run_arm,
    summarize_arm,
)
from evenserve.sim.llm_scenario import LlmScenario, load_llm_scenario
from evenserve.workload.llm import DEFAULT_PRIORITY, LlmRequest, iter_llm_open_loop, llm_users
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng

ROOT = Path.cwd()
CLI = [sys.executable, "-m", "evenserve"]
MEAN_BOUND, P99_BOUND = 0.05, 0.10
#: Prompt ids the emulated LLM's byte-level tokenizer takes as ids (its 256 bytes).
BYTE_VOCAB = 256
#: A step profile's time terms (all K times longer under ``--time-scale``).
STEP_TIME_KEYS = (
    "c0_ms",
    "prefill_us_per_token",
    "decode_us_per_seq",
    "kv_us_per_token",
    "cpu_ms_per_output_token",
)
CLASSIC_BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}
).encode()

console = Console(stderr=True)


# -- the scenario as both sides run it ----------------------------------------------------
def scale_profile_set(src: Path, dst: Path, k: float) -> Path:
    """The profile set ``src`` with every time K times longer, written to ``dst``: a classic
    profile's batch latencies, a step profile's per-step, per-token and CPU terms."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if isinstance(raw, dict) and raw.get("kind") == "llm-step":
            for key in STEP_TIME_KEYS:
                if raw.get(key) is not None:
                    raw[key] = float(raw[key]) * k
        elif isinstance(raw, dict):
            for point in raw.get("points") or []:
                point["latency_ms"] = float(point["latency_ms"]) * k
        (dst / path.name).write_text(yaml.safe_dump(raw, sort_keys=False))
    return dst


def _scale_ms(d: dict[str, Any], k: float) -> None:
    for key, v in d.items():
        if key.endswith("_ms") and isinstance(v, int | float) and not isinstance(v, bool):
            d[key] = float(v) * k


def scaled(
    sc: LlmScenario,
    duration_s: float,
    warmup_s: float,
    rate_scale: float,
    vocab: int,
    time_scale: float = 1.0,
    profile_dir: Path | None = None,
) -> LlmScenario:
    """``sc`` with another duration and warm-up (scenario seconds), every open-loop rate
    times ``rate_scale``, prompt ids drawn below ``vocab``, and slowed down ``time_scale``
    times (module docstring) on the profile set ``profile_dir`` (already scaled)."""
    k = time_scale
    raw = sc.doc.model_dump()
    raw.update(duration_s=duration_s * k, warmup_s=warmup_s * k, drain_s=raw["drain_s"] * k)
    if profile_dir is not None:
        raw["device"]["profiles"] = str(profile_dir)
    if raw.get("llm") is not None:
        for w in raw["llm"]["workloads"]:
            if w.get("rate_rps") is not None:
                w["rate_rps"] = float(w["rate_rps"]) * rate_scale / k
            w["vocab"] = min(int(w.get("vocab", vocab)), vocab)
            for ph in w.get("phases") or []:
                ph["start_s"] = float(ph["start_s"]) * k
                ph["end_s"] = float(ph["end_s"]) * k
            _scale_ms(w, k)
            for c in w.get("classes") or []:
                _scale_ms(c, k)
    for c in raw["classic"]:
        c["rate_rps"] *= rate_scale / k
        _scale_ms(c, k)
        _scale_ms(c["batching"], k)
    return LlmScenario(type(sc.doc).model_validate(raw), sc.source, sc.base_dir)


def request_class(sc: LlmScenario) -> int:
    """The class the worker gives the LLM's requests: the class the workloads' requests
    carry (the streaming client sends none, so the model's class stands in for it; the
    simulator's engine orders and interleaves by the requests' class, not ``llm.priority``)."""
    classes = {_class_value(w.priority) for w in sc.workloads}
    classes |= {_class_value(c.priority) for w in sc.workloads for c in w.classes if c.priority}
    if len(classes) > 1:
        console.print(
            f"[yellow]warning[/]: the LLM workloads carry classes {sorted(classes)}; the live "
            f"requests all get {max(classes)} (the client sends no class)"
        )
    return max(classes) if classes else DEFAULT_PRIORITY


def _class_value(p: int | str) -> int:
    return p if isinstance(p, int) else PRIORITY_CLASSES[p]


def write_repo(sc: LlmScenario, arm: str, folder: Path) -> Path:
    """The worker's repository for ``arm`` (module docstring: what each model.yaml holds)."""
    doc = sc.doc
    a = doc.arms[arm]
    repo = folder / f"repo-{arm}"
    if a.llm and doc.llm is not None:
        llm = doc.llm
        profile = load_step_profiles(sc.profile_dir())[llm.model]
        tpots = [w.tpot_ms for w in sc.workloads if w.tpot_ms is not None]
        ttfts = [w.ttft_ms for w in sc.workloads if w.ttft_ms is not None]
        spec = llm.engine.merged(a.engine)
        setup = engine_setup(spec, profile, min(tpots) / 1e3 if tpots else None)
        cfg: dict[str, Any] = {
            "kind": "llm",
            "runtime": "emulated",
            "description": f"{llm.model}, arm {arm} of {doc.name} (emulated engine steps)",
            "tokenizer": "byte",
            "priority": request_class(sc),
            "ttft_ms": min(ttfts) if ttfts else None,
            "tpot_ms": min(tpots) if tpots else None,
            "engine": engine_section(setup, spec.num_blocks),
        }
        _write_model(repo / llm.model, cfg)
    if a.classic:
        for c in doc.classic:
            batching = {**c.batching, "max_batch_size": c.max_batch_size}
            _write_model(
                repo / c.model,
                {
                    "runtime": "emulated",
                    "description": f"{c.model} (emulated; tiny tensors: the profile sets the time)",
                    "max_batch_size": c.max_batch_size,
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                    "batching": batching,
                    "slo_ms": c.slo_ms,
                    "priority": c.priority,
                },
            )
    return repo


def engine_section(setup: EngineSetup, num_blocks: int | None) -> dict[str, Any]:
    """A ``kind: llm`` folder's ``engine:`` section for an emulated worker, as the simulator
    sets its engine up (``sim.llm.engine_setup``'s figures; ``num_blocks``: None, from the
    step profile)."""
    return {
        "mode": setup.mode,
        "max_num_seqs": setup.max_num_seqs,
        "max_num_batched_tokens": setup.max_num_batched_tokens,
        "chunk_tokens": setup.chunk_tokens,
        "prefix_caching": setup.prefix_caching,
        "max_waiting": setup.max_waiting,
        "num_blocks": num_blocks,
    }


def _write_model(folder: Path, cfg: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def llm_requests(sc: LlmScenario) -> list[LlmRequest]:
    """Every open-loop LLM request of the run, as the simulator draws them, in time order."""
    out: list[LlmRequest] = []
    for k, wl in enumerate(sc.workloads):
        if not wl.closed_loop:
            out.extend(iter_llm_open_loop(wl, sc.doc.seed + 1000 * k, sc.doc.duration_s))
    return sorted(out, key=lambda r: r.arrival_s)


def classic_arrivals(sc: LlmScenario) -> list[tuple[float, str, int]]:
    """The classic models' arrivals (time, model, class), the simulator's streams merged."""
    out: list[tuple[float, str, int]] = []
    for c in sc.doc.classic:
        proc = PoissonProcess(c.rate_rps, [], arrivals_rng(sc.doc.seed, f"classic:{c.model}"))
        t = proc.next_after(0.0)
        while t < sc.doc.duration_s:
            out.append((t, c.model, c.priority))
            t = proc.next_after(t)
    return sorted(out)


# -- the live worker ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def live_worker(repo: Path, profile_dir: Path, log: Path) -> Iterator[tuple[str, int]]:
    """``evenserve worker`` on 127.0.0.1 serving ``repo``; stopped (SIGTERM, then kill)."""
    import httpx

    port = free_port()
    cmd = [*CLI, "worker", "--repo", str(repo), "--device", f"emulated:{profile_dir}",
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120.0
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker was not ready in 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class LiveRun:
    """What the live run saw, beside the records."""

    records: list[GenerationRecord] = field(default_factory=list)
    classic: list[LlmSimRequest] = field(default_factory=list)
    #: Seconds each send came after its scheduled time (LLM and classic).
    lateness_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    worker_cpu_s: float = math.nan
    client_cpu_s: float = math.nan


async def drive(
    sc: LlmScenario, url: str, drain_s: float, progress: Progress, task: Any
) -> LiveRun:
    """Send the arm's load to ``url`` (module docstring) and collect what came back."""
    doc = sc.doc
    clock = RealClock()
    run = LiveRun()
    reqs = llm_requests(sc) if sc.workloads and doc.llm is not None else []
    arrivals = classic_arrivals(sc)
    sent = {"llm": 0, "classic": 0, "classic_done": 0}
    start = clock.now()

    async def wait_llm(t_s: float) -> None:
        delay = t_s - clock.now()
        if delay > 0:
            await asyncio.sleep(delay)
        run.lateness_s.append(clock.now() - t_s)
        sent["llm"] += 1

    async def classic(session: aiohttp.ClientSession) -> None:
        async def one(r: LlmSimRequest) -> None:
            try:
                async with session.post(
                    f"{url}/v2/models/{r.model}/infer",
                    data=CLASSIC_BODY,
                    headers={"content-type": "application/json"},
                ) as resp:
                    await resp.read()
                    r.done_s = clock.now() - start
                    r.outcome = "completed" if resp.status == 200 else (
                        resp.headers.get("x-evenserve-reason") or f"http-{resp.status}"
                    )  # fmt: skip
            except (aiohttp.ClientError, TimeoutError) as exc:
                r.done_s = clock.now() - start
                r.outcome = f"client-{type(exc).__name__}"
            sent["classic_done"] += 1

        tasks = []
        for i, (t, model, prio) in enumerate(arrivals):
            delay = start + t - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            run.lateness_s.append(clock.now() - start - t)
            r = LlmSimRequest(i, model, t, prio, None, 1)
            run.classic.append(r)
            sent["classic"] += 1
            tasks.append(asyncio.create_task(one(r)))
        await asyncio.gather(*tasks)

    async def ticker() -> None:
        while True:
            el = clock.now() - start
            phase = "sending" if el < doc.duration_s else "draining"
            progress.update(
                task,
                completed=min(el, doc.duration_s),
                description=f"{phase}: {sent['llm']} LLM, {sent['classic']} classic sent",
            )
            await asyncio.sleep(0.25)

    async def llm_side() -> list[GenerationRecord]:
        out: list[GenerationRecord] = []
        if reqs:
            out += await run_open_loop(url, reqs, clock, wait_until=wait_llm, timeout_s=drain_s)
        for k, wl in enumerate(sc.workloads):
            if wl.closed_loop:
                users = llm_users(wl, doc.seed + 1000 * k)
                out += await run_closed_loop(url, users, clock, doc.duration_s, timeout_s=drain_s)
        return out

    t_cpu = time.process_time()
    tick = asyncio.create_task(ticker())
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=doc.duration_s + drain_s)
    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            run.records, _ = await asyncio.gather(llm_side(), classic(session))
    finally:
        tick.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick
    run.wall_s = clock.now() - start
    run.client_cpu_s = time.process_time() - t_cpu
    return run


def live_figures(sc: LlmScenario, arm: str, live: LiveRun) -> ArmFigures:
    """The live run's figures, through the simulator's own summary."""
    ar = ArmRun(arm, records=live.records)
    for c in sc.doc.classic if sc.doc.arms[arm].classic else []:
        ar.classic[c.model] = [r for r in live.classic if r.model == c.model]
    return summarize_arm(sc, ar)


# -- the comparison -----------------------------------------------------------------------
def _get(d: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = d
    for p in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return None if cur is None else float(cur)


def compare(sim: ArmFigures, live: ArmFigures, k: float = 1.0) -> list[dict[str, Any]]:
    """Rows: figure, sim, live, ratio, bound, within (None where a side has none); times
    divided by the time scale ``k`` and rates times it (the scenario's own units)."""
    s, lv = sim.to_dict(), live.to_dict()
    rows: list[dict[str, Any]] = []

    def row(name: str, path: tuple[str, ...], bound: float) -> None:
        a, b = _get(s, *path), _get(lv, *path)
        unit = 1.0 / k if name.endswith(" ms") else k if name.endswith(" rps") else 1.0
        a = None if a is None else a * unit
        b = None if b is None else b * unit
        ratio = None if a is None or b is None or a == 0 else b / a
        ok = None if ratio is None else abs(ratio - 1.0) <= bound
        rows.append({"figure": name, "sim": a, "live": b, "ratio": ratio, "bound": bound,
                     "within": ok})  # fmt: skip

    if s["llm"] is not None:
        for fig in ("ttft", "tpot", "itl", "e2e"):
            row(f"LLM {fig.upper()} mean ms", ("llm", f"{fig}_ms", "mean"), MEAN_BOUND)
            row(f"LLM {fig.upper()} P99 ms", ("llm", f"{fig}_ms", "p99"), P99_BOUND)
        row("LLM goodput rps", ("llm", "goodput_rps"), MEAN_BOUND)
        row("LLM completed", ("llm", "completed"), MEAN_BOUND)
    for model in s["classic"]:
        row(f"{model} P50 ms", ("classic", model, "p50_ms"), MEAN_BOUND)
        row(f"{model} P99 ms", ("classic", model, "p99_ms"), P99_BOUND)
        row(f"{model} goodput rps", ("classic", model, "goodput_rps"), MEAN_BOUND)
    return rows


def comparison_table(arm: str, rows: list[dict[str, Any]], note: str) -> Table:
    t = Table(title=f"arm {arm}: live vs simulated ({note})")
    for h in ("figure", "sim", "live", "live/sim", "bound", "within"):
        t.add_column(h, justify="left" if h == "figure" else "right")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    for r in rows:
        ok = r["within"]
        mark = "-" if ok is None else ("[green]yes[/]" if ok else "[red]no[/]")
        t.add_row(r["figure"], f(r["sim"]), f(r["live"]), f(r["ratio"]),
                  f"±{100 * r['bound']:.0f}%", mark)  # fmt: skip
    return t


def host_timing(sleep_s: float, n: int = 100) -> dict[str, float]:
    """How late the emulated runtime's precise sleep wakes on this host now: ``n`` sleeps of
    ``sleep_s`` (the LLM's fixed step cost), the overshoot's mean and P99 as a fraction."""
    from evenserve.runtime.emulated import PreciseSleeper

    sleeper = PreciseSleeper()
    over = []
    for _ in range(n):
        t = time.perf_counter()
        sleeper.sleep_until(t + sleep_s)
        over.append(time.perf_counter() - t - sleep_s)
    a = np.asarray(over) / sleep_s
    return {"sleep_ms": sleep_s * 1e3, "mean": float(a.mean()), "p99": float(np.percentile(a, 99))}


def run_one(sc: LlmScenario, arm: str, drain_s: float, tmp: Path, k: float = 1.0) -> dict[str, Any]:
    """One arm: simulated, then live; both figures, the comparison, the live run's CPU."""
    sim = summarize_arm(sc, run_arm(sc, arm))
    repo = write_repo(sc, arm, tmp)
    with live_worker(repo, sc.profile_dir(), tmp / f"worker-{arm}.log") as (url, pid):
        cpu0 = cpu_seconds(pid)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(f"arm {arm}", total=sc.doc.duration_s)
            live = asyncio.run(drive(sc, url, drain_s, progress, task))
        live.worker_cpu_s = cpu_seconds(pid) - cpu0
    lf = live_figures(sc, arm, live)
    late = np.asarray(live.lateness_s) if live.lateness_s else np.zeros(1)
    return {
        "sim": sim.to_dict(),
        "live": lf.to_dict(),
        "comparison": compare(sim, lf, k),
        "live_run": {
            "wall_s": live.wall_s,
            "worker_cores": live.worker_cpu_s / live.wall_s if live.wall_s else None,
            "client_cores": live.client_cpu_s / live.wall_s if live.wall_s else None,
            "send_lateness_ms": {
                "p50": float(np.percentile(late, 50)) * 1e3,
                "p99": float(np.percentile(late, 99)) * 1e3,
                "max": float(late.max()) * 1e3,
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-mix.yaml")
    ap.add_argument("--arm", action="append", help="an arm (repeat; default: "
                    "continuous-chunked and colocated)")  # fmt: skip
    ap.add_argument("--duration", type=float, default=30.0, help="scenario seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=5.0, help="scenario seconds left out")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="every open-loop rate x")
    ap.add_argument("--time-scale", type=float, default=5.0, help="K: every time K times "
                    "longer, every rate K times lower (a run takes K x --duration)")  # fmt: skip
    ap.add_argument("--vocab", type=int, default=BYTE_VOCAB, help="prompt ids below this, "
                    "both sides (the emulated LLM's byte tokenizer takes 0..258)")  # fmt: skip
    ap.add_argument("--drain", type=float, default=120.0, help="most seconds to wait for "
                    "answers after the last arrival")  # fmt: skip
    ap.add_argument(
        "--max-requests",
        type=int,
        default=20000,
        help="refuse a run offering more requests than this (both kinds)",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.rate_scale <= 0:
        ap.error("--rate-scale: must be > 0")
    if args.time_scale < 1:
        ap.error("--time-scale: must be >= 1")
    if not 2 <= args.vocab <= BYTE_VOCAB:
        ap.error(f"--vocab: must be in [2, {BYTE_VOCAB}]")
    if not 0 <= args.warmup < args.duration:
        ap.error("--warmup: must be in [0, --duration)")
    base = load_llm_scenario(args.scenario)
    arms = args.arm or ["continuous-chunked", "colocated"]
    for a in arms:
        if a not in base.doc.arms:
            ap.error(f"--arm: unknown arm {a!r} (arms: {', '.join(base.doc.arms)})")
    k = args.time_scale
    note = (f"{args.duration:g} s, warm-up {args.warmup:g} s, rates x{args.rate_scale:g}, "
            f"time scale {k:g}, seed {base.doc.seed}; scenario units")  # fmt: skip
    out: dict[str, Any] = {
        "scenario": base.doc.name,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "rate_scale": args.rate_scale,
        "time_scale": k,
        "vocab": args.vocab,
        "seed": base.doc.seed,
        "bounds": {"mean": MEAN_BOUND, "p99": P99_BOUND},
        "units": "sim and live: the scaled run's (times K x); comparison: the scenario's",
        "arms": {},
    }
    with tempfile.TemporaryDirectory(prefix="llm-live-") as tmp_name:
        tmp = Path(tmp_name)
        pdir = base.profile_dir()
        if k != 1:
            pdir = scale_profile_set(pdir, tmp / "profiles", k)
        sc = scaled(base, args.duration, args.warmup, args.rate_scale, args.vocab, k, pdir)
        offered = len(llm_requests(sc)) + len(classic_arrivals(sc))
        if offered > args.max_requests:
            ap.error(f"--max-requests: the run offers {offered} requests; lower --rate-scale "
                     "or --duration, or raise --max-requests")  # fmt: skip
        c0 = 5e-3
        if sc.doc.llm is not None:
            c0 = load_step_profiles(pdir)[sc.doc.llm.model].c0_s
        for a in arms:
            res = run_one(sc, a, args.drain * k, tmp, k)
            res["host_timing"] = host_timing(c0)
            out["arms"][a] = res
            console.print(comparison_table(a, res["comparison"], note))
            lr, ht = res["live_run"], res["host_timing"]
            console.print(
                f"  live run: worker {lr['worker_cores']:.2f} cores, client "
                f"{lr['client_cores']:.2f} cores; send lateness P50 "
                f"{lr['send_lateness_ms']['p50']:.2f} ms, P99 {lr['send_lateness_ms']['p99']:.2f}"
                f" ms, max {lr['send_lateness_ms']['max']:.1f} ms; host: a "
                f"{ht['sleep_ms']:.1f} ms sleep wakes {100 * ht['mean']:.1f} % late on average "
                f"(P99 {100 * ht['p99']:.1f} %)",
                highlight=False,
            )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
