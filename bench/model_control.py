"""Model control under load: does an unload give the memory back, and is no request lost?

A worker subprocess (``evenserve worker --model-control explicit --load-model em``) serves an
emulated model ``em`` under steady load from client threads; a torch model ``big`` (an MLP of
random weights, ``--mb`` MB of FP32 parameters, built here as TorchScript in a temporary
repository: nothing is downloaded) is loaded and unloaded ``--cycles`` times while client
threads send to both models. The worker's RSS (``VmRSS`` of ``/proc/PID/status``) is read
before the first load, after each load and after each unload (each once the worker is idle
of model-control work; inference keeps running), with the difference against the first.

The worker imports torch at startup (``--no-preimport`` to not): otherwise the library's own
memory (hundreds of MB that no unload can give back) would count as the model's.

Every request sent is answered: 200, or 503 (``unloading``/``loading``/``not loaded``) or 404
(``not served``) for ``big`` while it is not loaded; ``lost`` counts requests that got no
HTTP answer (a transport error), and must be 0.

    python bench/model_control.py [--mb 300] [--cycles 3] [--json PATH]

Linux only (reads /proc). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = 4096
IN, OUT = 256, 16
EM_PROFILE = {
    "model": "em",
    "device": "bench (synthetic)",
    "runtime": "emulated",
    "precision": "fp32",
    "source": "Synthetic figures for the bench (not a measurement).",
    "points": [{"batch": 1, "latency_ms": 2.0}, {"batch": 8, "latency_ms": 4.0}],
}


def build_repo(root: Path, mb: float) -> Path:
    import torch

    layers = max(1, round(mb * 1024 * 1024 / (HIDDEN * HIDDEN * 4)))
    mods: list[torch.nn.Module] = [torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU()]
    for _ in range(layers):
        mods += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(HIDDEN, OUT))
    net = torch.nn.Sequential(*mods).eval()
    repo = root / "repo"
    big = repo / "big"
    big.mkdir(parents=True)
    torch.jit.script(net).save(str(big / "model.pt"))
    (big / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "torch",
                "torch": {"file": "model.pt"},
                "max_batch_size": 8,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [IN]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [OUT]}],
            }
        )
    )
    em = repo / "em"
    em.mkdir()
    (em / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "emulated",
                "max_batch_size": 8,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                "emulated": {"profile": "profile.yaml"},
            }
        )
    )
    (em / "profile.yaml").write_text(yaml.safe_dump(EM_PROFILE))
    params = sum(p.numel() for p in net.parameters()) * 4
    print(f"built big: {layers} hidden layers, {params / 2**20:.0f} MB", file=sys.stderr)
    return repo


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


class Load:
    """Client threads sending to one model until stopped, counting answers by status."""

    def __init__(self, url: str, model: str, body: dict[str, Any], threads: int) -> None:
        self.url, self.model, self.body = url, model, body
        self.sent = 0
        self.answers: Counter[str] = Counter()
        self.lost = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as c:
            while not self.stop.is_set():
                with self.lock:
                    self.sent += 1
                try:
                    r = c.post(f"/v2/models/{self.model}/infer", json=self.body)
                except httpx.HTTPError:
                    with self.lock:
                        self.lost += 1
                    continue
                key = str(r.status_code)
                if r.status_code != 200:
                    key += " " + r.json().get("error", "")
                with self.lock:
                    self.answers[key] += 1
                if r.status_code != 200:
                    self.stop.wait(0.005)  # not served now: do not spin

    def served(self) -> int:
        with self.lock:
            return self.answers["200"]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join()
        answered = sum(self.answers.values())
        return {
            "sent": self.sent,
            "answered": answered,
            "by_status": dict(sorted(self.answers.items())),
            "lost": self.sent - answered,
        }


def wait_served(load: Load, more: int) -> None:
    """Until ``more`` requests more of ``load`` have been answered 200."""
    target = load.served() + more
    while load.served() < target:
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=300.0, help="MB of parameters of big")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="client threads per model")
    ap.add_argument("--no-preimport", action="store_true", help="do not import torch first")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evenserve-mc-") as tmp:
        root = Path(tmp)
        repo = build_repo(root, args.mb)
        port_file = root / "port"
        # The library's one-time state (its import, the intra-op thread pool, oneDNN's first
        # primitives) is no model's memory: set up before the baseline unless --no-preimport.
        pre = (
            ""
            if args.no_preimport
            else (
                "import torch; torch.set_num_threads(4); "
                "torch.nn.Linear(256, 64)(torch.zeros(8, 256)); "
            )
        )
        code = f"{pre}from evenserve.cli.main import main; main()"
        cmd = [sys.executable, "-c", code, "worker", "--repo", str(repo), "--port", "0"]
        cmd += ["--port-file", str(port_file), "--model-control", "explicit"]
        cmd += ["--load-model", "em", "--cpu-threads", "4", "--drain-timeout-s", "30"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None:
                    raise SystemExit(f"worker exited with {proc.returncode}")
                time.sleep(0.05)
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            with httpx.Client(base_url=url, timeout=300) as c:
                while not _ready(c):
                    time.sleep(0.05)
                em = Load(url, "em", {"inputs": [_inp(4)]}, args.threads)
                big = Load(url, "big", {"inputs": [_inp(IN)]}, args.threads)
                em.start()
                big.start()
                wait_served(em, 200)
                before = rss_mb(proc.pid)
                cycles = []
                for i in range(args.cycles):
                    t0 = time.perf_counter()
                    r = c.post("/v2/repository/models/big/load")
                    assert r.status_code == 200, r.text
                    load_s = time.perf_counter() - t0
                    wait_served(big, 50)  # both models under load with big loaded
                    wait_served(em, 50)
                    loaded = rss_mb(proc.pid)
                    t0 = time.perf_counter()
                    r = c.post("/v2/repository/models/big/unload")
                    assert r.status_code == 200, r.text
                    unload_s = time.perf_counter() - t0
                    wait_served(em, 100)  # em keeps serving after the unload
                    unloaded = rss_mb(proc.pid)
                    cycles.append(
                        {
                            "cycle": i + 1,
                            "load_s": round(load_s, 3),
                            "unload_s": round(unload_s, 3),
                            "rss_after_load_mb": round(loaded, 1),
                            "rss_after_unload_mb": round(unloaded, 1),
                            "after_load_vs_before_pct": round(100 * (loaded - before) / before, 1),
                            "after_unload_vs_before_pct": round(
                                100 * (unloaded - before) / before, 1
                            ),
                        }
                    )
                index = c.post("/v2/repository/index").json()
                em_res, big_res = em.finish(), big.finish()
        finally:
            proc.terminate()
            proc.wait(60)
    out = {
        "big_parameters_mb": args.mb,
        "torch_preimported": not args.no_preimport,
        "rss_before_first_load_mb": round(before, 1),
        "cycles": cycles,
        "max_after_unload_vs_before_pct": max(c["after_unload_vs_before_pct"] for c in cycles),
        # Later cycles against the first unload: growth here would be a per-cycle leak.
        "growth_since_first_unload_mb": round(
            cycles[-1]["rss_after_unload_mb"] - cycles[0]["rss_after_unload_mb"], 1
        ),
        "index_at_end": index,
        "requests": {"em": em_res, "big": big_res},
        "lost": em_res["lost"] + big_res["lost"],
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


def _ready(c: httpx.Client) -> bool:
    """The port file is written once bound, before the server listens: connection refused
    means not yet."""
    try:
        return c.get("/v2/health/ready").status_code == 200
    except httpx.ConnectError:
        return False


def _inp(n: int) -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": [1, n], "data": [0.5] * n}


if __name__ == "__main__":
    main()
