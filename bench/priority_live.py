"""Priority burst, live: online vs offline classes on emulated workers, next to the simulator.

The shape of scenarios/priority-burst.yaml, scaled so a 2-core machine can drive it:
- ``--devices`` emulated T4-class devices (default 1; the scenario has 2), each hosting the
  ResNet-50 ``resnet50`` (online: SLO 100 ms, deadline 200 ms) and ``resnet50-batch``
  (offline: SLO 60 s) models, with the published T4 framework fp32 profile slowed down
  ``--slowdown`` times (default 2). Slowing every batch k times and dividing every rate by k
  (and multiplying SLOs, deadlines and the starvation bound by k, dividing the queue bound
  by k) is the same system on a k times slower clock: the device runs at the scenario's
  70 % / 100 % load with k times fewer requests per second for the HTTP stack to carry.
- Online arrivals at 30 % of capacity, doubled for 10 s (the burst); offline at 40 %
  throughout; open loop, Poisson, seeded; ``--duration-s`` (default 36 s: warm-up 4 s,
  burst 14-24 s, 12 s after it).
- Two configurations, the scenario's two arms: ``classes`` (online first; offline only in
  the capacity online leaves, class headroom 0.6; lowest class shed first at the queue
  bound; starvation bound) and ``fifo`` (the same queue bound, both models in one class).

The simulator runs the same scaled scenario (``sim.cluster.simulate``, same policies, same
options); the live run starts one ``evenserve worker`` per device (with ``--devices`` > 1,
``evenserve up`` and its gateway, routing least-expected-work as the scenario does) and
sends requests with a small aiohttp open-loop sender. Figures, over arrivals in
[warm-up, end] (a request's latency is measured by the sender):
- online SLO attainment: completed within the SLO / decided, overall and for arrivals in
  the burst; offline too;
- refusals by class and reason (queue-full, shed, deadline-infeasible, deadline-expired);
- offline after the burst: completions / arrivals in [burst end, end] (>= 1: it catches up
  on what queued during the burst) and offline requests unfinished at the end.

    python bench/priority_live.py [--devices 1] [--slowdown 2] [--duration-s 36] [--seed 1]
        [--arms classes,fifo] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.scenario import OpenLoop, Phase
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario
from evenserve.workload import open_loop_arrivals

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
ONLINE, OFFLINE = "resnet50", "resnet50-batch"
CLASS_OF = {ONLINE: "online", OFFLINE: "offline"}
BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
).encode()


@dataclass
class Shape:
    """The scaled priority-burst scenario."""

    devices: int
    slowdown: float
    duration_s: float
    seed: int
    warmup_s: float = field(init=False)
    burst: tuple[float, float] = field(init=False)

    def __post_init__(self) -> None:
        self.warmup_s = round(self.duration_s / 9.0, 3)
        start = round(self.duration_s * 14.0 / 36.0, 3)
        self.burst = (start, start + 10.0)

    # The scenario's figures (per 2 devices) scaled to ``devices`` and ``slowdown``.
    def rate(self, model: str) -> float:
        per_device = {ONLINE: 214.0 / 2, OFFLINE: 285.0 / 2}[model]
        return per_device * self.devices / self.slowdown

    @property
    def slo_ms(self) -> dict[str, float]:
        return {ONLINE: 100.0 * self.slowdown, OFFLINE: 60000.0 * self.slowdown}

    @property
    def deadline_ms(self) -> float:
        return 200.0 * self.slowdown

    @property
    def max_queue(self) -> int:
        return max(1, round(400 / self.slowdown))

    @property
    def starvation_ms(self) -> float:
        return 30000.0 * self.slowdown

    def phases(self, model: str) -> list[Phase]:
        if model != ONLINE:
            return []
        return [Phase(start_s=self.burst[0], end_s=self.burst[1], multiplier=2.0)]


def write_profile(shape: Shape, folder: Path) -> Path:
    """The slowed T4 profile set: the same figures for both models (one network, two
    deployments), so the gateway's least-expected-work and the workers read them by name."""
    src = yaml.safe_load((ROOT / "profiles" / "t4-framework-fp32" / "resnet50.yaml").read_text())
    k = shape.slowdown
    src["points"] = [{**p, "latency_ms": p["latency_ms"] * k} for p in src["points"]]
    src["device"] = f"{src['device']} (emulated {k:g}x slower: bench/priority_live.py)"
    folder.mkdir(parents=True, exist_ok=True)
    for model in (ONLINE, OFFLINE):
        (folder / f"{model}.yaml").write_text(
            yaml.safe_dump({**src, "model": model}, sort_keys=False)
        )
    return folder


def write_scenario(shape: Shape, tmp: Path) -> Path:
    write_profile(shape, tmp / "profiles")
    batching = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0}
    sc = {
        "name": "priority-burst-scaled",
        "seed": shape.seed,
        "duration_s": shape.duration_s,
        "warmup_s": shape.warmup_s,
        "profile_sets": {"t4slow": "profiles"},
        "devices": [
            {"name": "gpu", "count": shape.devices, "memory_gb": 16, "models": [ONLINE, OFFLINE]}
        ],
        "models": {
            ONLINE: {
                "slo_ms": shape.slo_ms[ONLINE],
                "priority": 10,
                "deadline_ms": shape.deadline_ms,
            },
            OFFLINE: {"slo_ms": shape.slo_ms[OFFLINE], "priority": 0},
        },
        "workload": {
            "type": "open-loop",
            "streams": [
                {
                    "model": ONLINE,
                    "rate_rps": shape.rate(ONLINE),
                    "phases": [p.model_dump() for p in shape.phases(ONLINE)],
                },
                {"model": OFFLINE, "rate_rps": shape.rate(OFFLINE)},
            ],
        },
        "arms": {
            "classes": {
                "routing": "least-expected-work",
                "batching": batching,
                "max_queue_per_model": shape.max_queue,
                "starvation_ms": shape.starvation_ms,
                "class_headroom": 0.6,
            },
            "fifo": {
                "routing": "least-expected-work",
                "batching": batching,
                "max_queue_per_model": shape.max_queue,
                "ignore_priority": True,
            },
        },
    }
    path = tmp / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc, sort_keys=False))
    return path


# -- figures ------------------------------------------------------------------------------
@dataclass
class Outcome:
    model: str
    arrival_s: float
    finish_s: float = math.nan  # NaN: not completed
    reason: str | None = None  # refused / dropped with this reason


def figures(shape: Shape, outcomes: list[Outcome]) -> dict[str, Any]:
    w0, end = shape.warmup_s, shape.duration_s
    b0, b1 = shape.burst
    out: dict[str, Any] = {}
    for model, cls in CLASS_OF.items():
        slo_s = shape.slo_ms[model] / 1000.0
        mine = [o for o in outcomes if o.model == model and w0 <= o.arrival_s < end]

        def attainment(rs: list[Outcome], slo_s: float = slo_s) -> float | None:
            met = sum(
                1 for r in rs if not math.isnan(r.finish_s) and r.finish_s - r.arrival_s <= slo_s
            )
            decided = sum(
                1
                for r in rs
                if not math.isnan(r.finish_s) or r.reason is not None or end - r.arrival_s > slo_s
            )
            return met / decided if decided else None

        in_burst = [o for o in mine if b0 <= o.arrival_s < b1]
        refused: dict[str, int] = {}
        for o in mine:
            if o.reason is not None:
                refused[o.reason] = refused.get(o.reason, 0) + 1
        after_arrived = sum(1 for o in outcomes if o.model == model and b1 <= o.arrival_s < end)
        after_done = sum(1 for o in outcomes if o.model == model and b1 <= o.finish_s < end)
        unfinished = sum(
            1
            for o in outcomes
            if o.model == model
            and o.reason is None
            and not (o.finish_s < end)
            and o.arrival_s < end
        )
        out[cls] = {
            "arrived": len(mine),
            "slo_attainment": attainment(mine),
            "slo_attainment_burst": attainment(in_burst),
            "refused": refused,
            "after_burst_completed_per_arrived": after_done / after_arrived
            if after_arrived
            else None,
            "unfinished_at_end": unfinished,
        }
    return out


def sim_run(shape: Shape, scenario: Path, arm: str) -> tuple[list[Outcome], dict[str, float]]:
    rec = simulate(load_scenario(scenario), arm)
    log = rec.requests
    sizes = [n for d in rec.devices for n in d.batch_sizes]
    outcomes = [
        Outcome(log.model[i], log.arrival_s[i], log.finish_s[i], log.drop_reason[i])
        for i in range(len(log))
    ]
    return outcomes, {"batches": len(sizes), "mean_batch_size": sum(sizes) / max(1, len(sizes))}


# -- the live cluster ---------------------------------------------------------------------
def write_repo(shape: Shape, tmp: Path, arm: str) -> Path:
    repo = tmp / f"repo-{arm}"
    for model in (ONLINE, OFFLINE):
        d = repo / model
        d.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, Any] = {
            "runtime": "emulated",
            "description": "ResNet-50 on an emulated, slowed T4 (tiny tensors: timing only)",
            "max_batch_size": 8,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            "batching": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0},
            "slo_ms": shape.slo_ms[model],
            "priority": CLASS_OF[model],
        }
        if model == ONLINE:
            cfg["deadline_ms"] = shape.deadline_ms
        (d / "model.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return repo


def worker_options(shape: Shape, arm: str) -> tuple[DeviceOptions, QueueOptions]:
    """The scenario's device and arm options (the fifo arm serves every class alike)."""
    if arm == "classes":
        queue = QueueOptions(
            max_queue_per_model=shape.max_queue,
            starvation_ms=shape.starvation_ms,
            class_headroom=0.6,
        )
    else:
        queue = QueueOptions(max_queue_per_model=shape.max_queue, ignore_priority=True)
    return DeviceOptions(memory_gb=16), queue


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited early:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"not ready after {timeout_s} s:\n{log.read_text()[-3000:]}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def live_cluster(shape: Shape, tmp: Path, arm: str) -> Any:
    repo = write_repo(shape, tmp, arm)
    device = f"emulated:{write_profile(shape, tmp / 'profiles')}"
    log = tmp / f"{arm}.log"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if shape.devices == 1:
        port = free_port()
        cmd = [*CLI, "worker", "--repo", str(repo), "--device", device, "--port", str(port)]
        run, queue = worker_options(shape, arm)
        cmd += ["--log-level", "warning", *run.flags(), *queue.flags()]
        url = f"http://127.0.0.1:{port}"
        workers = [url]
    else:
        port = free_port()
        base = free_port()
        cluster = {
            "name": f"priority-live-{arm}",
            "gateway": {
                "host": "127.0.0.1",
                "port": port,
                "routing": "least-expected-work",
                "admin": {"token": "bench-" + "x" * 16},
            },
            "workers": {
                "repo": str(repo),
                "base_port": base,
                "devices": [
                    {
                        "name": f"gpu{i}",
                        "device": device,
                        **worker_options(shape, arm)[0].model_dump(),
                        **worker_options(shape, arm)[1].model_dump(exclude_none=True),
                    }
                    for i in range(shape.devices)
                ],
            },
        }
        cfile = tmp / f"cluster-{arm}.yaml"
        cfile.write_text(yaml.safe_dump(cluster, sort_keys=False))
        cmd = [*CLI, "up", str(cfile)]
        url = f"http://127.0.0.1:{port}"
        workers = [f"http://127.0.0.1:{base + i}" for i in range(shape.devices)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(url, proc, log, 120.0)
        yield url, workers
    finally:
        proc.send_signal(signal.SIGINT if shape.devices > 1 else signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def schedule(scenario: Path) -> list[tuple[float, str]]:
    """The scaled scenario's arrivals, both Poisson streams merged: the simulator's own (the
    workload module's streams, seeded as the simulator seeds them)."""
    sc = load_scenario(scenario).scenario
    assert isinstance(sc.workload, OpenLoop)
    return [(a.t_s, a.model) for a in open_loop_arrivals(sc.workload, sc.seed, sc.duration_s)]


async def send_all(url: str, arrivals: list[tuple[float, str]], drain_s: float) -> list[Outcome]:
    outcomes: list[Outcome] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=drain_s)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.perf_counter() + 0.2

        async def one(t: float, model: str) -> None:
            o = Outcome(model, t)
            outcomes.append(o)
            try:
                async with session.post(
                    f"{url}/v2/models/{model}/infer",
                    data=BODY,
                    headers={"content-type": "application/json"},
                ) as resp:
                    await resp.read()
                    done = time.perf_counter() - t0
                    if resp.status == 200:
                        o.finish_s = done
                    else:
                        o.reason = resp.headers.get("x-evenserve-reason") or f"http-{resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                o.reason = f"client-{type(exc).__name__}"

        tasks = []
        for t, model in arrivals:
            delay = t0 + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(t, model)))
        await asyncio.gather(*tasks)
    return outcomes


def scrape_batches(workers: list[str]) -> dict[str, dict[str, float]]:
    """Per model, over the workers: batches, mean batch size, mean compute ms per batch."""
    import httpx

    sums: dict[tuple[str, str], float] = {}
    for w in workers:
        for line in httpx.get(w + "/metrics", timeout=5).text.splitlines():
            for metric in (
                "evenserve_worker_batch_size_sum",
                "evenserve_worker_batch_size_count",
                "evenserve_worker_compute_time_seconds_sum",
            ):
                if line.startswith(metric + "{"):
                    model = line.split('model="', 1)[1].split('"', 1)[0]
                    key = (metric, model)
                    sums[key] = sums.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    out: dict[str, dict[str, float]] = {}
    for model in (ONLINE, OFFLINE):
        n = sums.get(("evenserve_worker_batch_size_count", model), 0.0)
        if n:
            out[CLASS_OF[model]] = {
                "batches": n,
                "mean_batch_size": sums[("evenserve_worker_batch_size_sum", model)] / n,
                "mean_compute_ms": 1000.0
                * sums[("evenserve_worker_compute_time_seconds_sum", model)]
                / n,
            }
    return out


# -- report -------------------------------------------------------------------------------
def fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.2f} %" if pct else f"{x:.2f}"


def table(shape: Shape, results: dict[str, dict[str, Any]]) -> str:
    cols = list(results)
    rows: list[tuple[str, list[str]]] = []
    for cls in ("online", "offline"):
        rows.append((f"{cls} arrived", [str(results[c][cls]["arrived"]) for c in cols]))
        rows.append((f"{cls} SLO met", [fmt(results[c][cls]["slo_attainment"]) for c in cols]))
        rows.append(
            (
                f"{cls} SLO met, burst arrivals",
                [fmt(results[c][cls]["slo_attainment_burst"]) for c in cols],
            )
        )
        rows.append(
            (
                f"{cls} refused",
                [
                    ", ".join(f"{k} {v}" for k, v in sorted(results[c][cls]["refused"].items()))
                    or "0"
                    for c in cols
                ],
            )
        )
    rows.append(
        (
            "offline after burst: done/arrived",
            [fmt(results[c]["offline"]["after_burst_completed_per_arrived"], False) for c in cols],
        )
    )
    rows.append(
        (
            "offline unfinished at end",
            [str(results[c]["offline"]["unfinished_at_end"]) for c in cols],
        )
    )
    w = max(len(r[0]) for r in rows)
    cw = [max(len(c), *(len(r[1][i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [
        f"priority-burst scaled: {shape.devices} device(s), T4 profile x{shape.slowdown:g} "
        f"slower, rates /{shape.slowdown:g}, {shape.duration_s:g} s (burst "
        f"{shape.burst[0]:g}-{shape.burst[1]:g} s, warm-up {shape.warmup_s:g} s), seed "
        f"{shape.seed}",
        "figure".ljust(w) + "  " + "  ".join(c.rjust(cw[i]) for i, c in enumerate(cols)),
    ]
    for name, cells in rows:
        lines.append(name.ljust(w) + "  " + "  ".join(v.rjust(cw[i]) for i, v in enumerate(cells)))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=4.0)
    ap.add_argument("--duration-s", type=float, default=36.0)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--arms", default="classes,fifo")
    ap.add_argument("--sim-only", action="store_true", help="skip the live runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.duration_s < 20:
        ap.error("--duration-s: at least 20 (the burst alone is 10 s)")
    shape = Shape(args.devices, args.slowdown, args.duration_s, args.seed)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="priority-live-") as d:
        tmp = Path(d)
        scenario = write_scenario(shape, tmp)
        for arm in arms:
            outcomes, batches = sim_run(shape, scenario, arm)
            results[f"sim {arm}"] = figures(shape, outcomes)
            results[f"sim {arm}"]["batches"] = {"all": batches}
        if not args.sim_only:
            arrivals = schedule(scenario)
            print(
                f"live: {len(arrivals)} requests over {shape.duration_s:g} s "
                f"(peak {shape.rate(ONLINE) * 2 + shape.rate(OFFLINE):.0f}/s)",
                file=sys.stderr,
            )
            for arm in arms:
                with live_cluster(shape, tmp, arm) as (url, workers):
                    drain_s = shape.duration_s + 60.0
                    outcomes = asyncio.run(send_all(url, arrivals, drain_s))
                    batches = scrape_batches(workers)
                results[f"live {arm}"] = figures(shape, outcomes)
                results[f"live {arm}"]["batches"] = batches
    order = [k for a in arms for k in (f"sim {a}", f"live {a}") if k in results]
    print(table(shape, {k: results[k] for k in order}))
    for k in order:
        for cls, b in results[k].get("batches", {}).items():
            compute = (
                f", mean compute {b['mean_compute_ms']:.1f} ms" if "mean_compute_ms" in b else ""
            )
            print(
                f"{k}, {cls} models: {b['batches']:.0f} batches, mean size "
                f"{b['mean_batch_size']:.2f}{compute}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
