"""Kill one worker during a load test: every request is answered (a response or a clear 503),
the worker is ejected fast and readmitted once it is back.

    .venv/bin/python bench/kill_worker.py                   # 20 s load, SIGKILL gpu0 at 5 s

Runs ``evenserve up`` on the seed cluster (ports moved to free ones), drives an open loop of
mixed resnet50 (binary tensor extension) and bert-base (JSON) requests through the gateway,
SIGKILLs one worker's process mid-run (``up`` restarts it, as it does any worker that dies),
and reports: answers by status, requests that got no answer at all, and from the gateway's
admin event log the ejection and readmission times relative to the kill. Times are measured
on CLOCK_MONOTONIC, which the gateway process and this one share on Linux.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resnet_body() -> tuple[bytes, dict[str, str]]:
    data = np.random.rand(1, 3, 224, 224).astype(np.float32).tobytes()
    spec = {
        "name": "pixel_values",
        "datatype": "FP32",
        "shape": [1, 3, 224, 224],
        "parameters": {"binary_data_size": len(data)},
    }
    header = json.dumps({"inputs": [spec]}).encode()
    return header + data, {
        "inference-header-content-length": str(len(header)),
        "content-type": "application/octet-stream",
    }


def bert_body() -> tuple[bytes, dict[str, str]]:
    ids = np.random.randint(0, 30522, 128).tolist()
    body = {"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 128], "data": ids},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 128], "data": [1] * 128},
    ]}  # fmt: skip
    return json.dumps(body).encode(), {"content-type": "application/json"}


def start_cluster(cluster: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    raw = yaml.safe_load(cluster.read_text())
    raw["gateway"]["port"] = free_port()
    w = raw["workers"]
    w["repo"] = str((cluster.parent / w["repo"]).resolve())
    w["restart"] = True
    for d in w["devices"]:
        d["port"] = free_port()
        name = d["device"].split(":", 1)[1]
        d["device"] = f"emulated:{(ROOT / 'profiles' / name).resolve()}"
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    ready = tmp / "ready.json"
    up = subprocess.Popen([*EVENSERVE, "up", str(cfg), "--log-dir", str(tmp / "logs"),
                           "--ready-file", str(ready)], cwd=ROOT,
                          stdout=open(tmp / "up.out", "wb"), stderr=subprocess.STDOUT)  # fmt: skip  # noqa: SIM115
    deadline = time.monotonic() + 120
    while not ready.exists():
        if up.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"evenserve up did not get ready: {(tmp / 'up.out').read_text()}")
        time.sleep(0.2)
    return up, json.loads(ready.read_text())


async def load(
    gw: str, rate: float, duration_s: float, kill_at_s: float, victim_pid: int, victim_url: str
) -> dict[str, Any]:
    rn, rn_h = resnet_body()
    bt, bt_h = bert_body()
    statuses: Counter[str] = Counter()
    by_backend: Counter[str] = Counter()
    errors_503: Counter[str] = Counter()
    no_answer: list[str] = []
    t: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as s:

        async def one(i: int) -> None:
            model, body, hdr = ("bert-base", bt, bt_h) if i % 10 < 3 else ("resnet50", rn, rn_h)
            try:
                async with s.post(f"{gw}/v2/models/{model}/infer", data=body, headers=hdr) as r:
                    await r.read()
                    statuses[f"{model} {r.status}"] += 1
                    by_backend[r.headers.get("x-evenserve-backend", "none")] += 1
                    if r.status == 503:
                        errors_503[(await r.json())["error"][:120]] += 1
            except Exception as exc:  # no answer at all: what this test must never see
                no_answer.append(f"{model}: {type(exc).__name__}: {exc}")

        async def kill_then_watch() -> None:
            await asyncio.sleep(kill_at_s)
            t["kill"] = time.monotonic()
            os.kill(victim_pid, signal.SIGKILL)
            # when does the restarted worker answer ready again (for readmission delay)?
            while True:
                await asyncio.sleep(0.05)
                try:
                    async with s.get(victim_url + "/v2/health/ready") as r:
                        if r.status == 200:
                            t["victim_ready_again"] = time.monotonic()
                            return
                except aiohttp.ClientError:
                    pass

        watcher = asyncio.create_task(kill_then_watch())
        n = int(rate * duration_s)
        t0 = time.monotonic()
        tasks = []
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        t["load_end"] = time.monotonic()
        await asyncio.wait_for(watcher, 60)
    return {
        "sent": n,
        "answered": sum(statuses.values()),
        "no_answer": len(no_answer),
        "no_answer_examples": no_answer[:5],
        "statuses": dict(sorted(statuses.items())),
        "served_by": dict(sorted(by_backend.items())),
        "503_messages": dict(errors_503),
        "t": t,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, default=ROOT / "examples" / "cluster-seed.yaml")
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second")
    ap.add_argument("--kill-at-s", type=float, default=5.0)
    ap.add_argument("--victim", default="gpu0")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evenserve-kill-"))
    up, info = start_cluster(args.cluster, tmp)
    try:
        gw = info["gateway"]["url"]
        token = info["admin_token"]
        victim = next(w for w in info["workers"] if w["name"] == args.victim)
        res = asyncio.run(load(gw, args.rate, args.duration_s, args.kill_at_s, victim["pid"],
                               victim["url"]))  # fmt: skip
        import httpx

        tk = res["t"]["kill"]
        auth = {"authorization": f"Bearer {token}"}

        def events_since_kill() -> list[dict[str, Any]]:
            ev = httpx.get(f"{gw}/admin/events", headers=auth, timeout=30).json()
            return [e for e in ev["events"] if e["backend"] == args.victim and e["t_s"] > tk - 1]

        # The watcher returns when the restarted worker answers ready; the gateway readmits
        # it at its next poll after that. On a slow machine the restart can end after the
        # load does, so wait (up to 60 s) for the readmission rather than read the log early.
        mine = events_since_kill()
        give_up = time.monotonic() + 60
        while (
            "victim_ready_again" in res["t"]
            and not any(e["event"] == "admitted" for e in mine)
            and time.monotonic() < give_up
        ):
            time.sleep(0.1)
            mine = events_since_kill()
        metrics = httpx.get(f"{gw}/metrics").text.splitlines()
        res["gateway_retries"] = sum(
            float(ln.rsplit(" ", 1)[1])
            for ln in metrics
            if ln.startswith("evenserve_gateway_retries_total{")
        )
        res["gateway_ejections"] = [
            ln for ln in metrics if ln.startswith("evenserve_gateway_backend_ejections_total{")
        ]
        ejected = next((e for e in mine if e["event"] == "ejected"), None)
        admitted = next((e for e in mine if e["event"] == "admitted"), None)
        ready_again = res["t"].get("victim_ready_again")
        res["victim"] = args.victim
        res["ejected_after_kill_s"] = None if ejected is None else round(ejected["t_s"] - tk, 4)
        res["ejection_reason"] = None if ejected is None else ejected["reason"]
        res["worker_ready_again_after_kill_s"] = (
            None if ready_again is None else round(ready_again - tk, 3)
        )
        res["readmitted_after_kill_s"] = (
            None if admitted is None else round(admitted["t_s"] - tk, 3)
        )
        res["readmitted_after_worker_ready_s"] = (
            None if admitted is None or ready_again is None
            else round(admitted["t_s"] - ready_again, 3)
        )  # fmt: skip
        del res["t"]
    finally:
        up.send_signal(signal.SIGTERM)
        res_code = up.wait(timeout=60)
    res["up_exit_code"] = res_code
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
