"""`evenserve worker` and `evenserve profile` as subprocesses: serve, infer with tritonclient,
drain on SIGTERM (every queued request answered, exit 0), refuse bad arguments clearly."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
import yaml

from evenserve.core.profile import load_profile
from evenserve.core.wire import LOAD_PATH

from ..integration.worker_repo import MODELS, write_repo

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    port_file = tmp_path / "port"
    log = tmp_path / "worker.log"
    cmd = [*CLI, "worker", "--port", "0", "--port-file", str(port_file), "--log-level", "warning"]
    with log.open("w") as out:
        proc = subprocess.Popen([*cmd, *args], stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120  # a hang guard: a loaded machine starts Python slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited: {log.read_text()}")
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if httpx.get(url + "/v2/health/ready", timeout=1).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("worker did not become ready")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    models = {"em": MODELS["em"], "waits": {**MODELS["waits"], "max_queue_size": 8}}
    return write_repo(tmp_path, models)


@pytest.fixture
def worker(repo: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = _start(["--repo", str(repo), "--device", "cpu"], tmp_path)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_tritonclient_against_the_cli_worker(worker: tuple[subprocess.Popen[str], str]) -> None:
    _, url = worker
    c = triton.InferenceServerClient(url.removeprefix("http://"))
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("em")
    assert c.get_model_metadata("em")["inputs"][0]["shape"] == [-1, 4]
    assert c.get_model_config("em")["max_batch_size"] == 16
    x = np.ones((2, 4), dtype=np.float32)
    for binary in (False, True):
        i = triton.InferInput("x", [2, 4], "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        out = triton.InferRequestedOutput("y", binary_data=binary)
        assert c.infer("em", [i], outputs=[out]).as_numpy("y").shape == (2, 2)
    c.close()


def test_sigterm_drains_queued_requests_then_exits(
    worker: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = worker
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    results: list[int] = []

    def send() -> None:
        results.append(
            httpx.post(url + "/v2/models/waits/infer", json=body, timeout=60).status_code
        )

    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60  # a hang guard only
    while httpx.get(url + LOAD_PATH).json()["queued_by_model"]["waits"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Static batching of 4 would wait forever for a 4th request; SIGTERM must flush them.
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]
    assert proc.wait(30) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/v2/health/live", timeout=2)


def test_bad_arguments_fail_clearly(repo: Path, tmp_path: Path) -> None:
    for args, message in (
        (["--repo", str(repo), "--device", "gpu7"], "--device 'gpu7': 'gpu7' is not a device kind"),
        (["--repo", str(tmp_path / "none")], "--repo: not a folder"),
        (["--repo", str(repo), "--device", "emulated:nowhere"], "profile set not found"),
        (["--repo", str(repo), "--batching", "{policy: nope}"], "unknown batching policy 'nope'"),
    ):
        out = subprocess.run([*CLI, "worker", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out
        assert message in " ".join(out.stderr.split()), out.stderr


def test_emulated_device_from_a_profile_set(repo: Path, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    proc, url = _start(
        [
            "--repo",
            str(root / "examples" / "models" / "emulated"),
            "--device",
            "emulated:a10-trt-fp16",
            "--profiles-dir",
            str(root / "profiles"),
            "--memory-gb",
            "24",
        ],
        tmp_path,
    )
    try:
        load = httpx.get(url + LOAD_PATH).json()
        assert load["device"] == "emulated:a10-trt-fp16"
        assert load["memory_total_bytes"] == 24 * 1024**3
        # Resident weights of the two profiles (51 + 220 MB) are accounted.
        assert load["memory_used_bytes"] == pytest.approx((51 + 220) * 1024**2)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_profile_command_measures_the_emulated_profile(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "p" / "tiny.yaml"
    run = subprocess.run(
        [
            *CLI,
            "profile",
            "--repo",
            str(root / "examples" / "models" / "tiny"),
            "--model",
            "tiny-emulated",
            "--out",
            str(out),
            "--batch-sizes",
            "1,4,16",
            "--iters",
            "9",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    measured = load_profile(out)
    want = load_profile(root / "examples" / "models" / "tiny" / "tiny-emulated" / "profile.yaml")
    assert measured.batches == (1, 4, 16)
    # What the command measured is the emulated device's wall time, which a sleep makes at
    # least the profile's (written to 3 decimals of a ms); how close it comes is a property
    # of this machine, printed by bench/emulated_timing.py, not a pass/fail figure.
    for b in measured.batches:
        assert measured.latency_s(b) >= want.latency_s(b) - 1e-6, b
    doc = yaml.safe_load(out.read_text())
    assert "Measured with `evenserve profile`" in doc["source"]
    assert doc["runtime"] == "emulated" and doc["input_shape"] == "4"
