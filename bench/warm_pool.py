"""The host's warm pool on emulated workers: cold and warm load times, and its memory.

Two ``evenserve worker`` processes (emulated devices, explicit model control) share one
host pool (``--host-pool``, a directory under /dev/shm where it exists) of ``--pool-gib``
GiB; three models of ``--weights-mib`` MiB each (a synthetic profile set), so the pool
holds two of them. The steps:

1. A loads ``a``: cold (from the repository), its entry written to the pool;
2. A unloads ``a``, B loads it: warm (from the pool);
3. B loads ``b``: cold, the pool holds a and b;
4. B loads ``c``: cold, beyond the capacity: ``a`` (least recently used) is deleted;
5. A loads ``a`` again: cold (it was evicted).

For each step: the source the worker's reply gives, the seconds it measured, the POST's
wall time, the figure expected (the simulator's defaults: cold = weights / 2 GB/s + 50 ms,
warm = weights / 12 GB/s + 5 ms), and the pool's bytes after it: the sum of its entry
files' allocated blocks and the tmpfs's used bytes (statvfs) above what they were before
the workers started. Figures of this machine, quoted in docs/design/0009-placement.md,
never asserted in a test.

``--placement ROUNDS``: then also ``evenserve up`` with the gateway's placement (lru) on two
emulated devices that hold one model each, four models of 60 MiB, a host pool of
``--placement-pool-mib`` (three entries' worth), and ROUNDS rounds of one request per model in
turn (most of them misses): the controller's planned cold and warm loads against what the
workers' load replies said (``/admin/placement``).

    python bench/warm_pool.py [--weights-mib 400] [--pool-gib 1] [--placement 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from evenserve.core.profile import MB
from evenserve.core.scenario import default_load_times_s
from evenserve.experiment.cluster import free_port
from evenserve.runtime.host_pool import SUFFIX, default_pool_parent

CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
MODELS = ("a", "b", "c")


def write_repo(
    repo: Path, pset: Path, weights_mib: float, models: tuple[str, ...] = MODELS
) -> tuple[Path, Path]:
    """A repository of emulated models (batches of one, 2 ms) and their profile set."""
    pset.mkdir(parents=True)
    for m in models:
        (repo / m).mkdir(parents=True)
        (repo / m / "model.yaml").write_text(
            yaml.safe_dump(
                {
                    "runtime": "emulated",
                    "max_batch_size": 1,
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                }
            )
        )
        (pset / f"{m}.yaml").write_text(
            yaml.safe_dump(
                {
                    "model": m,
                    "device": "bench (synthetic)",
                    "runtime": "emulated",
                    "precision": "fp16",
                    "source": "Synthetic figures for the warm-pool bench (not a measurement).",
                    "weights_mb": weights_mib,
                    "points": [{"batch": 1, "latency_ms": 2.0}],
                }
            )
        )
    return repo, pset


def start_worker(name: str, args: list[str], root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = root / f"{name}.port"
    log = (root / f"{name}.log").open("wb")
    cmd = [*CLI, "worker", "--port", "0", "--port-file", str(port_file), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker {name} exited: {(root / f'{name}.log').read_text()}")
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"worker {name} did not become ready")


def tmpfs_used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def entry_bytes(pool: Path) -> tuple[int, list[str]]:
    """Allocated bytes of the pool's entry files, and the models they are for."""
    files = sorted(pool.glob(f"*{SUFFIX}"))
    return sum(f.stat().st_blocks * 512 for f in files), [f.name.split("-")[0] for f in files]


def placement_run(rounds: int, pool_mib: float, root: Path) -> dict[str, Any]:
    """``evenserve up`` with placement and a host pool, models asked for in turn; the counts."""
    token = "warm-pool-bench-token-0123"
    models = ("m1", "m2", "m3", "m4")
    repo, tiny = write_repo(root / "prepo", root / "tiny", 60, models)
    taken: set[int] = set()
    ports = [free_port(taken) for _ in range(3)]  # three different ports
    cluster = {
        "gateway": {
            "port": ports[0],
            "admin": {"token": token},
            "placement": {
                "policy": "lru",
                "interval_ms": 1000,
                "load_wait_ms": 30_000,
                "host_memory_gb": pool_mib / 1024.0,
            },
        },
        "workers": {
            "repo": str(repo),
            "devices": [
                {
                    "name": f"d{i}",
                    "device": f"emulated:{tiny}",
                    "models": [models[i]],
                    "memory_gb": 0.1,
                    "port": ports[i + 1],
                }
                for i in range(2)
            ],
        },
    }
    cfg = root / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(cluster))
    ready = root / "ready.json"
    log = (root / "up.log").open("wb")
    up = subprocess.Popen(
        [*CLI, "up", str(cfg), "--log-dir", str(root / "logs"), "--ready-file", str(ready)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if up.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"evenserve up failed: {(root / 'up.log').read_text()}")
            time.sleep(0.2)
        url = json.loads(ready.read_text())["gateway"]["url"]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
        order = [m for _ in range(rounds) for m in (*models[2:], *models[:2])]
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
            for m in order:
                c.post(f"/v2/models/{m}/infer", json=body).raise_for_status()
            view = c.get("/admin/placement", headers={"authorization": f"Bearer {token}"})
            counts: dict[str, Any] = view.json()["counts"]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        log.close()
    return {"requests": len(order), "pool_mib": pool_mib, **counts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights-mib", type=float, default=400.0)
    ap.add_argument("--pool-gib", type=float, default=1.0)
    ap.add_argument("--placement", type=int, default=0, help="rounds of the placement run")
    ap.add_argument("--placement-pool-mib", type=float, default=200.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    opts = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="warm-pool-bench-"))
    pool = Path(tempfile.mkdtemp(prefix="evenserve-pool-bench-", dir=default_pool_parent()))
    weights = opts.weights_mib * MB
    cold_s, warm_s = default_load_times_s(weights)
    base_used = tmpfs_used(pool)
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    try:
        repo, pset = write_repo(root / "repo", root / "set", opts.weights_mib)
        flags = ["--repo", str(repo), "--device", f"emulated:{pset}"]
        flags += ["--model-control", "explicit", "--log-level", "warning"]
        flags += ["--host-pool", str(pool), "--host-pool-gb", f"{opts.pool_gib:g}"]
        a, url_a = start_worker("A", flags, root)
        procs.append(a)
        b, url_b = start_worker("B", flags, root)
        procs.append(b)
        urls = {"A": url_a, "B": url_b}
        with httpx.Client(timeout=120, trust_env=False) as c:

            def step(what: str, worker: str, action: str, model: str) -> None:
                t0 = time.perf_counter()
                r = c.post(f"{urls[worker]}/v2/repository/models/{model}/{action}")
                wall = time.perf_counter() - t0
                r.raise_for_status()
                if action != "load":
                    return
                doc = r.json()
                files, held = entry_bytes(pool)
                source = doc["load_source"]
                rows.append(
                    {
                        "step": what,
                        "worker": worker,
                        "model": model,
                        "source": source,
                        "load_s": doc["load_seconds"],
                        "wall_s": round(wall, 6),
                        "expected_s": round(warm_s if source == "host" else cold_s, 6),
                        "pool_files_bytes": files,
                        "tmpfs_used_bytes": tmpfs_used(pool) - base_used,
                        "pool_holds": held,
                    }
                )

            step("1 cold", "A", "load", "a")
            step("", "A", "unload", "a")
            step("2 warm on the other worker", "B", "load", "a")
            step("3 cold", "B", "load", "b")
            step("4 cold, evicts the LRU", "B", "load", "c")
            step("5 cold again (evicted)", "A", "load", "a")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        shutil.rmtree(pool, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    released = tmpfs_used(default_pool_parent()) - base_used
    mib = 1024.0 * 1024.0
    print(
        f"host pool {opts.pool_gib:g} GiB at {default_pool_parent()}, 3 models of "
        f"{opts.weights_mib:g} MiB; expected cold {cold_s:.3f} s, warm {warm_s:.3f} s"
    )
    print()
    print("| step | worker | model | source | load s | wall s | expected s | pool files MiB "
          "| tmpfs used MiB | pool holds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['step']} | {r['worker']} | {r['model']} | {r['source']} | {r['load_s']:.3f} "
            f"| {r['wall_s']:.3f} | {r['expected_s']:.3f} | {r['pool_files_bytes'] / mib:.0f} "
            f"| {r['tmpfs_used_bytes'] / mib:.0f} | {', '.join(r['pool_holds'])} |"
        )
    print()
    print(f"after the run (pool removed): tmpfs used {released / mib:+.0f} MiB vs before")
    placed: dict[str, Any] | None = None
    if opts.placement > 0:
        proot = Path(tempfile.mkdtemp(prefix="warm-pool-bench-up-"))
        try:
            placed = placement_run(opts.placement, opts.placement_pool_mib, proot)
        finally:
            shutil.rmtree(proot, ignore_errors=True)
        print()
        print(
            f"placement (lru, 2 devices of one model, 4 models of 60 MiB, pool "
            f"{opts.placement_pool_mib:g} MiB, {placed['requests']} requests, models in turn, "
            f"{placed['loads']} loads, {placed['evictions']} evictions):"
        )
        print()
        print("| loads | planned (controller) | live (workers' replies) |")
        print("|---|---|---|")
        print(f"| cold | {placed['cold_loads']} | {placed['live_cold_loads']} |")
        print(f"| warm | {placed['warm_loads']} | {placed['live_warm_loads']} |")
    if opts.json is not None:
        doc = {
            "pool_gib": opts.pool_gib,
            "weights_mib": opts.weights_mib,
            "expected_cold_s": cold_s,
            "expected_warm_s": warm_s,
            "steps": rows,
            "tmpfs_used_after_bytes": released,
            "placement": placed,
        }
        opts.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
