"""An LLM pool scenario live on emulated engines behind the gateway, side by side with the
simulator.

For each arm of a pool scenario (``kind: llm-pool``, default ``scenarios/llm-pool.yaml``),
this starts one ``evenserve worker --device emulated:<the device's profile set>`` per device
of the scenario on 127.0.0.1 and one ``evenserve gateway`` in front of them whose
``gateway.llm_routing`` is the arm's routing, drives them with the very requests the
simulator offers, and prints the live figures next to ``sim.llm_pool.run_pool_arm``'s on the
same settings (both sides summarized by ``sim.llm_pool.summarize_pool_arm``). It is
``experiment.llm_live`` (one device, ``kind: llm``) for a pool: read that module's docstring
for the time scale K, the prompt ids below the byte tokenizer's vocabulary and the units of
the comparison; what differs is said here.

The workers (``write_device_repo``). Device ``d``'s repository holds the LLM
(``kind: llm``, ``runtime: emulated``, the byte-level tokenizer) with the scenario's
``llm.engine`` merged with ``d.engine`` and the defaults the simulator fills in
(``sim.llm.engine_setup``), its ``num_blocks``, the tightest workload TPOT (the interleaving's
bound, as the simulator sets it) and ``llm.priority`` as the class of requests that bring none;
and each classic model ``d`` hosts, as ``experiment.llm_live`` writes them (tiny tensors: the
profile, not the payload, sets a batch's time). Its device is its own profile set, K times
slower.

The gateway (``write_gateway_cluster``). The workers are KServe backends (their load reports
carry each engine's figures and step profile, as the simulator's router knows them);
``gateway.llm_routing`` is the arm's routing (its parameters in seconds K times longer),
``gateway.seed`` the scenario's (the router's tie-breaks draw as the simulator's do). The
LLM's signals are the workers' load reports, polled every ``signals.scrape_s`` (x K):
``gateway.signals.interval_ms`` and ``idle_interval_ms`` both that period, ``stale_after_ms``
three of them. Requests are sent as token ids (below 256: the byte tokenizer's ids), which
the gateway names in blocks of ``gateway.llm.prefix_block_tokens`` ids: that is set to the
engines' KV block size (16), so each name the router's prefix index keeps is one block of the
engines' cache, as the simulator's (``sched.engine.prompt_hashes``). ``gateway.llm.
prefix_max_blocks`` is the router's default, the simulator's. No retries
(``forward.retries: 0``) and no gateway overload admission (``overload.enabled: false``): the
simulator has neither; a request the router refuses is answered 429 with ``x-evenserve-reason:
ttft-unreachable`` and recorded with that outcome, as the simulator records it.

The load. The LLM workloads' requests are the simulator's (``iter_llm_open_loop`` with
``seed + 1000 x k``, rates x the arm's ``rate_scale``; closed-loop users likewise), each sent
through the gateway by ``loadgen.openai_client`` (streamed ``/v1/completions``, prompt as ids,
``ignore_eos``) with its class (``x-evenserve-priority``) and its targets
(``x-evenserve-ttft-ms``, ``x-evenserve-tpot-ms``), TTFT counted from its scheduled time.
Both sides end at one horizon, the duration plus ``--drain`` from the start: the simulator's
drain stops there, and the client reads no stream past it (``send``'s ``deadline_s``); a
request not answered by then is ``unfinished`` on both sides, not completed. The classic
models' requests go straight to the workers, not through the gateway: the simulator gives
each device hosting a model its own Poisson stream at the model's rate / the hosts
(``arrivals_rng(seed, "classic:<model>:<device>")``) with no router between, so sending
those same streams to each worker reproduces its arrivals exactly, where the gateway's
classic router would choose the device itself (another experiment) and add a hop of HTTP on
the host for every classic request.

Stale arms (``signals.stale_s`` > 0): the simulator hands the router each sample
``stale_s`` after it was read, with the time it was read, so the router can tell its age
and compare it with its own counts of then; the gateway does the same with
``gateway.llm.signal_delay_ms`` = ``stale_s`` x K (each load report is stamped when it is
received and handed to the router that much later), and its ``llm.stale_after_ms`` is set
above the delay plus a period so that the held samples' corrections are not dropped (the
simulator drops none).

Figures. The live run's records go through ``summarize_pool_arm``, as the simulator's: the
LLM's figures overall and per workload (unfinished requests among them), among the completed
ones the worst TTFT over its target, the classic models' P50, P99 and goodput. Per device,
the routed requests, preemptions and prefix-cache hit rate are read from each worker's
``/metrics`` at the end; its utilization and KV use are not measured live (None). The
comparison (``compare``): each figure's ratio live / sim, within 15 % (the issue's bound) or
not; reported with it, the CPU of the workers, the gateway and this client over the run, the
send lateness and how late the emulated runtime's precise sleep wakes on this host.

    evenserve bench --scenario scenarios/llm-pool.yaml --arms round-robin,kv-load,predicted-ttft \\
        --duration 90s --warmup 15s --time-scale 5 [--rate-scale 0.5] [--json out/pool-live.json]

Measured (2 shared cores, the first 90 s of the scenario at its rates, K = 5, about 10
minutes an arm): design note 0021, section "Live": round robin within 6 % on every figure;
predicted-ttft within 15 % on goodput, TTFT and TPOT but chat's TTFT P90; kv-load within on
goodput, TPOT and the overall TTFT, not on some per-workload TTFT figures (what differs,
measured, is said there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import math
import os
import signal
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
from rich.table import Table

from evenserve.core.clock import RealClock
from evenserve.core.llm import UNFINISHED, GenerationRecord, load_step_profiles
from evenserve.experiment.llm_live import (
    BYTE_VOCAB,
    CLASSIC_BODY,
    CLI,
    _scale_ms,
    cpu_seconds,
    engine_section,
    free_port,
    host_timing,
    scale_profile_set,
)
from evenserve.loadgen.openai_client import OpenAiStreamClient
from evenserve.policy.llm_routing import LlmRouter
from evenserve.sim.llm import ArmRun, LlmSimRequest, engine_setup
from evenserve.sim.llm_pool import PoolFigures, PoolRun, run_pool_arm, summarize_pool_arm
from evenserve.sim.llm_pool_scenario import LlmPoolScenario, load_llm_pool_scenario
from evenserve.workload.llm import LlmRequest, LlmUser, iter_llm_open_loop, llm_users
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng

ROOT = Path.cwd()
#: The issue's bound: live within 15 % of the simulator.
BOUND = 0.15
#: The outcome the simulator gives a request the router refuses (the gateway's reason).
REFUSED = "ttft-unreachable"
#: The router's prefix index size, as the simulator builds it (``LlmRouter.build`` default).
PREFIX_MAX_BLOCKS: int = (
    inspect.signature(LlmRouter.__init__).parameters["prefix_max_blocks"].default
)

#: The gateway's gauge of each LLM engine's signal age (``metrics.names``; NaN before the
#: first sample): the experiment layer reads it by name, it does not import the metrics.
SIGNAL_AGE = "evenserve_gateway_llm_engine_signal_age_seconds"

console = Console(stderr=True)


# -- the scenario as both sides run it ----------------------------------------------------
def scale_routing(spec: Any, k: float) -> Any:
    """A routing spec with its parameters in seconds (``*_s``, ``*_s_per_*``) K times
    longer (a name alone has none)."""
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    for key, v in spec.items():
        timed = key.endswith("_s") or "_s_per_" in key
        if timed and isinstance(v, int | float) and not isinstance(v, bool):
            out[key] = float(v) * k
    return out


def scaled_pool(
    sc: LlmPoolScenario,
    duration_s: float,
    warmup_s: float,
    rate_scale: float,
    vocab: int,
    time_scale: float = 1.0,
    profile_dirs: dict[str, Path] | None = None,
    drain_s: float | None = None,
) -> LlmPoolScenario:
    """``sc`` with another duration and warm-up (scenario seconds), every open-loop rate
    (LLM workloads and classic models) times ``rate_scale``, prompt ids drawn below
    ``vocab``, and slowed down ``time_scale`` times (``experiment.llm_live``): durations,
    phases, signal periods and staleness, targets, batching windows and the routing
    parameters in seconds K times longer, rates K times lower; each device's profile set
    replaced by ``profile_dirs[its set]`` (already scaled); ``drain_s`` (scenario seconds;
    None: the scenario's)."""
    k = time_scale
    raw = sc.doc.model_dump()
    drain = raw["drain_s"] if drain_s is None else drain_s
    raw.update(duration_s=duration_s * k, warmup_s=warmup_s * k, drain_s=drain * k)
    raw["signals"] = {key: float(v) * k for key, v in raw["signals"].items()}
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
    for d in raw["devices"]:
        if profile_dirs is not None:
            d["profiles"] = str(profile_dirs[d["profiles"]])
    for a in raw["arms"].values():
        a["routing"] = scale_routing(a["routing"], k)
        sig = a.get("signals")
        if sig is not None:
            a["signals"] = {key: None if v is None else float(v) * k for key, v in sig.items()}
    return LlmPoolScenario(type(sc.doc).model_validate(raw), sc.source, sc.base_dir)


def stale_s(sc: LlmPoolScenario, arm: str) -> float:
    """How stale the arm's samples reach the router (its override, else the scenario's)."""
    a = sc.doc.arms[arm]
    if a.signals is not None and a.signals.stale_s is not None:
        return a.signals.stale_s
    return sc.doc.signals.stale_s


def scrape_s(sc: LlmPoolScenario, arm: str) -> float:
    a = sc.doc.arms[arm]
    if a.signals is not None and a.signals.scrape_s:
        return a.signals.scrape_s
    return sc.doc.signals.scrape_s


def write_device_repo(sc: LlmPoolScenario, device: str, folder: Path) -> Path:
    """Device ``device``'s worker repository (module docstring: what each model.yaml holds)."""
    doc = sc.doc
    d = next(x for x in doc.devices if x.name == device)
    llm = doc.llm
    repo = folder / f"repo-{device}"
    profile = load_step_profiles(sc.profile_dir(d.profiles))[llm.model]
    tpots = [w.tpot_ms for _, w in sc.workloads if w.tpot_ms is not None]
    spec = llm.engine.merged(d.engine)
    setup = engine_setup(spec, profile, min(tpots) / 1e3 if tpots else None)
    _write_model(
        repo / llm.model,
        {
            "kind": "llm",
            "runtime": "emulated",
            "description": f"{llm.model} on {device} of {doc.name} (emulated engine steps)",
            "tokenizer": "byte",
            "priority": llm.priority,
            "tpot_ms": min(tpots) if tpots else None,
            "engine": engine_section(setup, spec.num_blocks),
        },
    )
    by_model = {c.model: c for c in doc.classic}
    for m in d.classic:
        c = by_model[m]
        _write_model(
            repo / m,
            {
                "runtime": "emulated",
                "description": f"{m} (emulated; tiny tensors: the profile sets the time)",
                "max_batch_size": c.max_batch_size,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                "batching": {**c.batching, "max_batch_size": c.max_batch_size},
                "slo_ms": c.slo_ms,
                "priority": c.priority,
            },
        )
    return repo


def _write_model(folder: Path, cfg: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def gateway_cluster(
    sc: LlmPoolScenario, arm: str, backends: dict[str, str], port: int
) -> dict[str, Any]:
    """The gateway's cluster file for ``arm`` in front of ``backends`` (device name -> URL)
    (module docstring)."""
    doc = sc.doc
    block = {
        load_step_profiles(sc.profile_dir(d.profiles))[doc.llm.model].block_tokens
        for d in doc.devices
    }
    if len(block) != 1:
        raise ValueError("devices: every engine of one pool must use the same block size")
    period_ms = scrape_s(sc, arm) * 1e3
    delay_ms = stale_s(sc, arm) * 1e3
    timeout_s = doc.duration_s + doc.drain_s
    return {
        "name": f"{doc.name}-{arm}",
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "llm_routing": doc.arms[arm].routing,
            "seed": doc.seed,
            "llm": {
                "chars_per_token": 1.0,
                "prefix_block_tokens": block.pop(),
                "prefix_max_blocks": PREFIX_MAX_BLOCKS,
                "stale_after_ms": max(10_000.0, 4 * period_ms, 2 * (delay_ms + period_ms)),
                "signal_delay_ms": delay_ms,
            },
            "signals": {
                "interval_ms": period_ms,
                "idle_interval_ms": period_ms,
                "stale_after_ms": 3 * period_ms,
                "timeout_ms": max(500.0, min(period_ms, 5000.0)),
            },
            "health": {"interval_ms": 1000.0, "misses": 3, "timeout_ms": 2000.0},
            "forward": {"retries": 0, "request_timeout_s": timeout_s},
            "overload": {"enabled": False},
        },
        "backends": [{"name": name, "url": url} for name, url in backends.items()],
    }


def llm_requests(sc: LlmPoolScenario, arm: str) -> list[tuple[LlmRequest, str]]:
    """Every open-loop LLM request of the arm (its ``rate_scale`` applied), with its
    workload's name, as the simulator draws them, in time order."""
    doc = sc.doc
    a = doc.arms[arm]
    out: list[tuple[LlmRequest, str]] = []
    for k, (name, wl) in enumerate(sc.workloads):
        if wl.closed_loop:
            continue
        spec = wl if a.rate_scale == 1.0 else wl.model_copy(
            update={"rate_rps": (wl.rate_rps or 0.0) * a.rate_scale}
        )  # fmt: skip
        out.extend((r, name) for r in iter_llm_open_loop(spec, doc.seed + 1000 * k, doc.duration_s))
    return sorted(out, key=lambda x: x[0].arrival_s)


def classic_arrivals(sc: LlmPoolScenario) -> list[tuple[float, str, str, int]]:
    """The classic streams (time, device, model, class): each device hosting a model its own
    Poisson stream at the model's rate / its hosts, seeded as the simulator's."""
    doc = sc.doc
    by_model = {c.model: c for c in doc.classic}
    out: list[tuple[float, str, str, int]] = []
    for d in doc.devices:
        for m in d.classic:
            c = by_model[m]
            hosts = sum(1 for x in doc.devices if m in x.classic)
            proc = PoissonProcess(
                c.rate_rps / hosts, [], arrivals_rng(doc.seed, f"classic:{m}:{d.name}")
            )
            t = proc.next_after(0.0)
            while t < doc.duration_s:
                out.append((t, d.name, m, c.priority))
                t = proc.next_after(t)
    return sorted(out)


# -- the live processes -------------------------------------------------------------------
def wait_ready(procs: list[tuple[subprocess.Popen[bytes], str, Path]], path: str) -> None:
    import httpx

    deadline = time.monotonic() + 180.0
    left = list(procs)
    while left:
        proc, url, log = left[0]
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited early:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + path, timeout=2).status_code == 200:
                left.pop(0)
                continue
        if time.monotonic() > deadline:
            raise RuntimeError(f"{log.name}: not ready in 180 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def live_pool(sc: LlmPoolScenario, arm: str, tmp: Path) -> Iterator[LivePool]:
    """The arm's workers and gateway on 127.0.0.1, ready (the gateway has heard every
    engine); stopped at the end (SIGTERM, then kill)."""
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        workers: list[tuple[subprocess.Popen[bytes], str, Path]] = []
        (tmp / arm).mkdir(parents=True, exist_ok=True)
        for d in sc.doc.devices:
            repo = write_device_repo(sc, d.name, tmp / arm)
            port = free_port()
            log = tmp / arm / f"worker-{d.name}.log"
            cmd = [*CLI, "worker", "--repo", str(repo), "--device",
                   f"emulated:{sc.profile_dir(d.profiles)}", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "warning"]  # fmt: skip
            with log.open("wb") as out:
                p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            procs.append(p)
            workers.append((p, f"http://127.0.0.1:{port}", log))
        wait_ready(workers, "/v2/health/ready")
        backends = {d.name: url for d, (_, url, _) in zip(sc.doc.devices, workers, strict=True)}
        gport = free_port()
        cluster = tmp / arm / "cluster.yaml"
        cluster.write_text(
            yaml.safe_dump(gateway_cluster(sc, arm, backends, gport), sort_keys=False)
        )
        glog = tmp / arm / "gateway.log"
        with glog.open("wb") as out:
            g = subprocess.Popen(
                [*CLI, "gateway", "--config", str(cluster), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        procs.append(g)
        gurl = f"http://127.0.0.1:{gport}"
        wait_ready([(g, gurl, glog)], "/v2/health/ready")
        _wait_engines(gurl, len(sc.doc.devices), 3 * scrape_s(sc, arm) + 30.0, glog)
        pids = {d.name: p.pid for d, (p, _, _) in zip(sc.doc.devices, workers, strict=True)}
        yield LivePool(gurl, backends, pids, g.pid)
    finally:
        for p in reversed(procs):
            stop_process(p)


def _wait_engines(url: str, n: int, within_s: float, log: Path) -> None:
    """Until the gateway's LLM router has a sample of ``n`` engines (its signal-age gauge)."""
    import httpx

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            text = httpx.get(url + "/metrics", timeout=2).text
            ages = [
                line for line in text.splitlines()
                if line.startswith(SIGNAL_AGE + "{") and "NaN" not in line
            ]  # fmt: skip
            if len(ages) >= n:
                return
        time.sleep(0.5)
    raise RuntimeError(
        f"the gateway heard fewer than {n} LLM engines in {within_s:.0f} s:\n"
        f"{log.read_text()[-3000:]}"
    )


@dataclass
class LivePool:
    gateway_url: str
    #: Device name -> its worker's URL, and pid.
    workers: dict[str, str]
    worker_pids: dict[str, int]
    gateway_pid: int


@dataclass
class LiveRun:
    """What the live run saw."""

    records: list[GenerationRecord] = field(default_factory=list)
    workload_of: dict[int, str] = field(default_factory=dict)
    #: The device that answered each request (the gateway's ``x-evenserve-backend``).
    engine_of: dict[int, str] = field(default_factory=dict)
    #: Device -> model -> its classic requests.
    classic: dict[str, dict[str, list[LlmSimRequest]]] = field(default_factory=dict)
    refused: int = 0
    lateness_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    client_cpu_s: float = math.nan


async def drive(sc: LlmPoolScenario, arm: str, pool: LivePool, drain_s: float) -> LiveRun:
    """Send the arm's load (module docstring) and collect what came back."""
    doc = sc.doc
    clock = RealClock()
    run = LiveRun()
    for d in doc.devices:
        run.classic[d.name] = {m: [] for m in d.classic}
    ids = iter(range(1, 1 << 62))
    client = OpenAiStreamClient(
        pool.gateway_url, clock, timeout_s=doc.duration_s + drain_s, target_headers=True
    )
    start = clock.now()
    client.origin_s = start
    # The run's horizon, as the simulator's drain ends: what is not answered by then is
    # ``unfinished`` on both sides.
    horizon_s = doc.duration_s + drain_s

    async def send(r: LlmRequest, due_s: float, wl: str) -> None:
        rid = next(ids)
        run.workload_of[rid] = wl
        reply = await client.send(r, due_s, horizon_s)
        rec = reply.record
        rec.request_id = rid
        if reply.status == 429 and reply.reason == REFUSED:
            rec.outcome = REFUSED
            run.refused += 1
        if reply.backend is not None:
            run.engine_of[rid] = reply.backend
        run.records.append(rec)

    async def open_loop() -> None:
        tasks = []
        for r, wl in llm_requests(sc, arm):
            delay = start + r.arrival_s - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            run.lateness_s.append(clock.now() - start - r.arrival_s)
            tasks.append(asyncio.create_task(send(r, r.arrival_s, wl)))
        await asyncio.gather(*tasks)

    async def closed_loop(user: LlmUser, wl: str) -> None:
        due = user.think_s()
        while due < doc.duration_s:
            delay = start + due - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await send(user.next_request(due), due, wl)
            due = clock.now() - start + user.think_s()

    async def classic(session: aiohttp.ClientSession) -> None:
        async def one(url: str, r: LlmSimRequest) -> None:
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

        tasks = []
        for t, dev, model, prio in classic_arrivals(sc):
            delay = start + t - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            run.lateness_s.append(clock.now() - start - t)
            r = LlmSimRequest(next(ids), model, t, prio, None, 1)
            run.classic[dev][model].append(r)
            tasks.append(asyncio.create_task(one(pool.workers[dev], r)))
        await asyncio.gather(*tasks)

    users = [
        (u, name)
        for k, (name, wl) in enumerate(sc.workloads)
        if wl.closed_loop
        for u in llm_users(wl, doc.seed + 1000 * k)
    ]
    t_cpu = time.process_time()
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=doc.duration_s + drain_s)
    try:
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await asyncio.gather(
                open_loop(), classic(session), *(closed_loop(u, n) for u, n in users)
            )
    finally:
        await client.close()
    run.wall_s = clock.now() - start
    run.client_cpu_s = time.process_time() - t_cpu
    return run


def engine_counters(text: str, model: str) -> dict[str, float]:
    """A worker's ``/metrics`` text: the LLM's requests (all outcomes), preemptions and
    prefix-cache queries and hits (tokens)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"requests": 0.0, "preemptions": 0.0, "prefix_queries": 0.0, "prefix_hits": 0.0}
    wanted = {
        "evenserve_worker_llm_requests": "requests",
        "vllm:num_preemptions": "preemptions",
        "vllm:prefix_cache_queries": "prefix_queries",
        "vllm:prefix_cache_hits": "prefix_hits",
    }
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:  # by the sample's name: the parser may not fold ``_total``
            key = wanted.get(s.name.removesuffix("_total"))
            if key is None or s.labels.get("model_name", model) != model:
                continue
            out[key] += float(s.value)
    return out


def live_pool_run(sc: LlmPoolScenario, arm: str, live: LiveRun,
                  counters: dict[str, dict[str, float]]) -> PoolRun:  # fmt: skip
    """The live run as a ``PoolRun`` (what ``summarize_pool_arm`` reads)."""
    out = PoolRun(arm, records=live.records, workload_of=live.workload_of,
                  engine_of=live.engine_of, end_s=live.wall_s, refused=live.refused)  # fmt: skip
    for d in sc.doc.devices:
        ar = ArmRun(d.name, classic=live.classic.get(d.name, {}), end_s=live.wall_s)
        c = counters.get(d.name, {})
        ar.preemptions = int(c.get("preemptions", 0))
        ar.prefix_query_tokens = int(c.get("prefix_queries", 0))
        ar.prefix_hit_tokens = int(c.get("prefix_hits", 0))
        spec = sc.doc.llm.engine.merged(d.engine)
        ar.kv_blocks = spec.num_blocks or 0
        out.devices[d.name] = ar
        out.routed[d.name] = int(c.get("requests", 0))
    return out


def live_figures(sc: LlmPoolScenario, run: PoolRun) -> dict[str, Any]:
    """The live run's figures (``summarize_pool_arm``), the devices' utilization and KV use
    unmeasured (None)."""
    f = summarize_pool_arm(sc, run).to_dict()
    for dv in f["devices"].values():
        dv["utilization"] = dv["kv_usage"] = None
    return f


def request_rows(run: PoolRun) -> list[list[Any]]:
    """Each LLM request of a run, for the JSON (the scaled run's seconds): workload, class,
    scheduled time, TTFT (None: no token), outcome, the device that served it, output tokens,
    and its last token's time after the first (None: fewer than two tokens)."""
    rows: list[list[Any]] = []
    for r in sorted(run.records, key=lambda x: x.scheduled_s):
        t = r.token_times_s or []
        rows.append([
            run.workload_of.get(r.request_id), r.priority, round(r.scheduled_s, 6),
            round(t[0] - r.scheduled_s, 6) if t else None, r.outcome,
            run.engine_of.get(r.request_id), len(t),
            round(t[-1] - t[0], 6) if len(t) > 1 else None,
        ])  # fmt: skip
    return rows


# -- the comparison -----------------------------------------------------------------------
def _get(d: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = d
    for p in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return None if cur is None else float(cur)


def compare(sim: dict[str, Any], live: dict[str, Any], k: float = 1.0,
            bound: float = BOUND) -> list[dict[str, Any]]:  # fmt: skip
    """Rows: figure, sim, live, ratio, bound, within (None where a side has none or the
    simulator's is 0); times divided by the time scale ``k`` and rates times it (the
    scenario's own units). The LLM's goodput, TTFT (mean, P50, P90, P99), TPOT (mean, P90)
    and completed and unfinished requests, overall and per workload; router refusals; among
    the completed requests, the largest TTFT over its target and how many went over; each
    device's routed requests and prefix-cache hit rate; each classic model's P50, P99 and
    goodput."""
    rows: list[dict[str, Any]] = []

    def row(name: str, path: tuple[str, ...], default: float | None = None) -> None:
        a, b = _get(sim, *path), _get(live, *path)
        if default is not None:
            a = default if a is None else a
            b = default if b is None else b
        unit = 1.0 / k if name.endswith(" ms") else k if name.endswith(" rps") else 1.0
        a = None if a is None else a * unit
        b = None if b is None else b * unit
        ratio = None if a is None or b is None or a == 0 else b / a
        ok = None if ratio is None else abs(ratio - 1.0) <= bound
        if a == 0 and b == 0:
            ok = True
        rows.append({"figure": name, "sim": a, "live": b, "ratio": ratio, "bound": bound,
                     "within": ok})  # fmt: skip

    def llm(prefix: str, base: tuple[str, ...]) -> None:
        row(f"{prefix}goodput rps", (*base, "goodput_rps"))
        row(f"{prefix}completed", (*base, "completed"))
        row(f"{prefix}unfinished", (*base, "refused", UNFINISHED), 0.0)
        for q in ("mean", "p50", "p90", "p99"):
            row(f"{prefix}TTFT {q} ms", (*base, "ttft_ms", q))
        for q in ("mean", "p90"):
            row(f"{prefix}TPOT {q} ms", (*base, "tpot_ms", q))

    llm("LLM ", ("llm",))
    row("router refusals", ("refused_by_router",))
    row("admitted: worst TTFT / target", ("admitted", "worst_ttft_over_target"))
    row("admitted over TTFT target", ("admitted", "over_target"))
    for wl in sim.get("by_workload", {}):
        llm(f"{wl}: ", ("by_workload", wl))
    for dev in sim.get("devices", {}):
        row(f"{dev}: routed", ("devices", dev, "routed"))
        row(f"{dev}: prefix hit rate", ("devices", dev, "prefix_cache_hit_rate"))
    for model in sim.get("classic", {}):
        row(f"{model} P50 ms", ("classic", model, "p50_ms"))
        row(f"{model} P99 ms", ("classic", model, "p99_ms"))
        row(f"{model} goodput rps", ("classic", model, "goodput_rps"))
    return rows


def comparison_table(arm: str, rows: list[dict[str, Any]], note: str) -> Table:
    t = Table(title=f"arm {arm}: live vs simulated ({note})")
    for h in ("figure", "sim", "live", "live/sim", "within"):
        t.add_column(h, justify="left" if h == "figure" else "right")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    for r in rows:
        ok = r["within"]
        mark = "-" if ok is None else ("[green]yes[/]" if ok else "[red]no[/]")
        t.add_row(r["figure"], f(r["sim"]), f(r["live"]), f(r["ratio"]), mark)
    return t


def run_one(sc: LlmPoolScenario, arm: str, drain_s: float, tmp: Path, k: float) -> dict[str, Any]:
    """One arm: simulated, then live (unless its samples are stale: simulated only)."""
    sim_run = run_pool_arm(sc, arm)
    sim: PoolFigures = summarize_pool_arm(sc, sim_run)
    res: dict[str, Any] = {"sim": sim.to_dict(), "requests": {"sim": request_rows(sim_run)}}
    import httpx

    with live_pool(sc, arm, tmp) as pool:
        pids = {**{f"worker {n}": p for n, p in pool.worker_pids.items()},
                "gateway": pool.gateway_pid}  # fmt: skip
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        console.print(f"arm {arm}: sending for {sc.doc.duration_s:.0f} s ...", highlight=False)
        live = asyncio.run(drive(sc, arm, pool, drain_s))
        cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
        counters = {
            name: engine_counters(httpx.get(url + "/metrics", timeout=10).text, sc.doc.llm.model)
            for name, url in pool.workers.items()
        }
    lrun = live_pool_run(sc, arm, live, counters)
    lf = live_figures(sc, lrun)
    res["requests"]["live"] = request_rows(lrun)
    late = np.asarray(live.lateness_s) if live.lateness_s else np.zeros(1)
    wall = live.wall_s or math.nan
    res.update(
        live=lf,
        comparison=compare(res["sim"], lf, k),
        live_run={
            "wall_s": live.wall_s,
            "cores": {**{n: c / wall for n, c in cpu.items()}, "client": live.client_cpu_s / wall},
            "send_lateness_ms": {
                "p50": float(np.percentile(late, 50)) * 1e3,
                "p99": float(np.percentile(late, 99)) * 1e3,
                "max": float(late.max()) * 1e3,
            },
        },
    )
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-pool.yaml")
    ap.add_argument("--arm", action="append", help="an arm (repeat; default: round-robin, "
                    "kv-load and predicted-ttft)")  # fmt: skip
    ap.add_argument("--duration", type=float, default=60.0, help="scenario seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=10.0, help="scenario seconds left out")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="every open-loop rate x")
    ap.add_argument("--time-scale", type=float, default=5.0, help="K: every time K times "
                    "longer, every rate K times lower (a run takes K x --duration)")  # fmt: skip
    ap.add_argument("--vocab", type=int, default=BYTE_VOCAB, help="prompt ids below this, "
                    "both sides (the emulated LLM's byte tokenizer takes 0..258)")  # fmt: skip
    ap.add_argument("--drain", type=float, default=60.0, help="most scenario seconds to wait "
                    "for answers after the last arrival, both sides: an LLM request not "
                    "answered by then is 'unfinished'")  # fmt: skip
    ap.add_argument("--max-requests", type=int, default=20000,
                    help="refuse a run offering more requests than this (both kinds)")  # fmt: skip
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
    if args.drain < 0:
        ap.error("--drain: must be >= 0")
    base = load_llm_pool_scenario(args.scenario)
    arms = args.arm or ["round-robin", "kv-load", "predicted-ttft"]
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
        "bound": BOUND,
        "units": "sim, live and requests: the scaled run's (times K x); comparison: the scenario's",
        "request_columns": [
            "workload",
            "class",
            "scheduled_s",
            "ttft_s",
            "outcome",
            "device",
            "tokens",
            "last_after_first_s",
        ],
        "arms": {},
    }
    with tempfile.TemporaryDirectory(prefix="llm-pool-live-") as tmp_name:
        tmp = Path(tmp_name)
        sets = sorted({d.profiles for d in base.doc.devices})
        pdirs = {s: scale_profile_set(base.profile_dir(s), tmp / "profiles" / s, k) for s in sets}
        sc = scaled_pool(base, args.duration, args.warmup, args.rate_scale, args.vocab, k, pdirs,
                         args.drain)  # fmt: skip
        offered = max(len(llm_requests(sc, a)) for a in arms) + len(classic_arrivals(sc))
        if offered > args.max_requests:
            ap.error(f"--max-requests: the run offers {offered} requests; lower --rate-scale "
                     "or --duration, or raise --max-requests")  # fmt: skip
        c0 = min(load_step_profiles(p)[sc.doc.llm.model].c0_s for p in pdirs.values())
        for a in arms:
            res = run_one(sc, a, args.drain * k, tmp, k)
            out["arms"][a] = res
            if args.json is not None:  # after each arm: a run cut short keeps what it did
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(out, indent=2) + "\n")
            res["host_timing"] = host_timing(c0)
            console.print(comparison_table(a, res["comparison"], note))
            lr, ht = res["live_run"], res["host_timing"]
            cores = ", ".join(f"{n} {c:.2f}" for n, c in lr["cores"].items())
            console.print(
                f"  live run: cores: {cores}; send lateness P50 "
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
