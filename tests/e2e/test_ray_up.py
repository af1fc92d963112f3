"""`evenserve up --ray auto` on a local Ray (started by `up`, on this machine) with two
emulated workers as actors: requests are answered through the gateway, an actor killed with
SIGKILL comes back (Ray restarts it, its worker starts again) and the gateway readmits its
backend, which then serves again. Counts and events, never times. Skipped without Ray."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
TOKEN = "ray-e2e-token-0123456789"
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
#: Bounds on waiting, not expectations: a slow machine passes as long as it gets there.
BOUND_S = 150.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_cluster(tmp: Path) -> Path:
    model = tmp / "repo" / "m"
    model.mkdir(parents=True)
    (model / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "emulated",
                "max_batch_size": 1,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            }
        )
    )
    (tmp / "tiny").mkdir()
    (tmp / "tiny" / "m.yaml").write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "device": "tiny",
                "runtime": "emulated",
                "precision": "fp16",
                "source": "test",
                "weights_mb": 100,
                "points": [{"batch": 1, "latency_ms": 2.0}],
            }
        )
    )
    raw = {
        "name": "ray-e2e",
        "gateway": {
            "port": free_port(),
            "routing": "round-robin",
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 100, "window": 3, "stale_after_ms": 500},
        },
        "workers": {
            "repo": "repo",
            "devices": [
                {"name": "w0", "device": f"emulated:{tmp / 'tiny'}", "port": free_port()},
                {"name": "w1", "device": f"emulated:{tmp / 'tiny'}", "port": free_port()},
            ],
        },
    }
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def wait_for(what: str, check: Any, proc: subprocess.Popen[bytes], out: Path) -> Any:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"evenserve up exited while waiting for {what}:\n{out.read_text()}")
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {BOUND_S:g} s:\n{out.read_text()[-3000:]}")


def test_actors_serve_and_a_killed_actor_is_restarted_and_readmitted(tmp_path: Path) -> None:
    cfg = write_cluster(tmp_path)
    ready = tmp_path / "ready.json"
    out = tmp_path / "up.out"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    with out.open("wb") as log:
        up = subprocess.Popen(
            [*EVENSERVE, "up", str(cfg), "--ray", "auto", "--log-dir", str(tmp_path / "logs"),
             "--ready-file", str(ready)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for("ready", ready.exists, up, out)
        info = json.loads(ready.read_text())
        gw = info["gateway"]["url"]
        workers = {w["name"]: w for w in info["workers"]}
        assert all(w["url"].startswith("http://127.0.0.1:") for w in workers.values())
        assert all(w["ray"]["actor_pid"] not in (None, w["pid"]) for w in workers.values())
        addresses = json.loads((tmp_path / "logs" / "worker-addresses.json").read_text())
        assert addresses == {n: w["url"].removeprefix("http://") for n, w in workers.items()}
        auth = {"authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=30, trust_env=False) as c:

            def send(n: int) -> Counter[str]:
                served: Counter[str] = Counter()
                for _ in range(n):
                    r = c.post(f"{gw}/v2/models/m/infer", json=BODY)
                    assert r.status_code == 200, r.text
                    served[r.headers.get("x-evenserve-backend", "?")] += 1
                return served

            assert set(send(20)) == {"w0", "w1"}
            victim = workers["w1"]
            os.kill(victim["ray"]["actor_pid"], signal.SIGKILL)

            def events(name: str) -> list[str]:
                got = c.get(f"{gw}/admin/events", headers=auth).json()["events"]
                return [e["event"] for e in got if e["backend"] == name]

            def readmissions(name: str) -> int:
                """Ejections each followed by an admission."""
                seen, n = events(name), 0
                while "ejected" in seen and "admitted" in seen[seen.index("ejected") :]:
                    n += 1
                    rest = seen[seen.index("ejected") :]
                    seen = rest[rest.index("admitted") + 1 :]
                return n

            # Every request meanwhile is answered (the gateway sends around the dead one).
            def back(name: str, times: int) -> Any:
                return lambda: bool(send(2)) and readmissions(name) >= times

            wait_for("w1 ejected and readmitted", back("w1", 1), up, out)
            assert send(20)["w1"] > 0  # it serves again

            # Its worker alone killed (the actor lives): `up` restarts it in a new actor.
            w0_before = readmissions("w0")
            os.kill(workers["w0"]["pid"], signal.SIGKILL)
            wait_for("w0 ejected and readmitted", back("w0", w0_before + 1), up, out)
            assert send(20)["w0"] > 0
        log = out.read_text()
        assert "ray: no running cluster; started a local one" in log
        assert "worker w0 exited (code -9); restarting (1)" in log
        assert "worker w1 exited" not in log  # Ray restarted that one, not `up`
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    assert up.returncode == 0, out.read_text()[-3000:]
