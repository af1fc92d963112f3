"""Bad ports given to ``evenserve worker``, ``evenserve gateway`` and ``evenserve up``: one
line ``error: ...`` naming the flag or the field, exit status 2, no traceback. Each command
runs as a process of its own, as a user runs it; the time limit only guards against a hang
(before, ``gateway --port 99999`` went on serving on port 34463, 99999 modulo 65536)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .worker_repo import MODELS, write_repo

CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
HANG_GUARD_S = 120


def run_cli(*args: str, cwd: Path) -> tuple[int, str]:
    p = subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        stdin=subprocess.DEVNULL,
    )
    return p.returncode, p.stderr


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port held by a listening socket."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def cluster(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def backend(url: str, **more: object) -> dict[str, object]:
    return {"name": "w", "url": url, "models": ["em"], **more}


def assert_usage_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "99999"], "--port: must be in 0..65535 (got 99999)"),
        (["--port", "-1"], "--port: must be in 0..65535 (got -1)"),
        (["--grpc-port", "70000"], "--grpc-port: must be in 0..65535 (got 70000)"),
    ],
)
def test_worker_ports_out_of_range(tmp_path: Path, flags: list[str], message: str) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    code, err = run_cli("worker", "--repo", str(repo), *flags, cwd=tmp_path)
    assert_usage_error(code, err, message)


def test_a_worker_port_in_use(tmp_path: Path, taken: int) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    code, err = run_cli("worker", "--repo", str(repo), "--port", str(taken), cwd=tmp_path)
    assert code == 2 and "Traceback" not in err, err
    assert f"error: --port: cannot bind 127.0.0.1:{taken}" in err


def test_gateway_ports(tmp_path: Path, taken: int) -> None:
    good = cluster(tmp_path, {"backends": [backend("http://127.0.0.1:8101")]})
    for flags, message in (
        (["--port", "99999"], "--port: must be in 0..65535 (got 99999)"),
        (["--port", str(taken)], f"--port: cannot listen on 127.0.0.1:{taken}: "),
    ):
        code, err = run_cli("gateway", "--config", str(good), *flags, cwd=tmp_path)
        assert_usage_error(code, err, message)
    in_use = cluster(tmp_path, {"gateway": {"port": taken}, "backends": [backend("http://h:1")]})
    code, err = run_cli("gateway", "--config", str(in_use), cwd=tmp_path)
    assert_usage_error(code, err, f"gateway.port: cannot listen on 127.0.0.1:{taken}")


def test_a_gateway_grpc_port_in_use(tmp_path: Path, taken: int) -> None:
    pytest.importorskip("grpc")
    doc = {
        "gateway": {"port": 0, "grpc_port": taken},
        "backends": [backend("http://127.0.0.1:1")],
    }
    code, err = run_cli("gateway", "--config", str(cluster(tmp_path, doc)), cwd=tmp_path)
    assert code == 2 and "Traceback" not in err, err
    assert f"error: gateway.grpc_port: cannot bind 127.0.0.1:{taken}" in err


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gateway": {"port": 99999}, "backends": [backend("http://h:1")]}, "gateway.port"),
        ({"gateway": {"grpc_port": 70000}, "backends": [backend("http://h:1")]}, "grpc_port"),
        ({"backends": [backend("http://127.0.0.1:99999")]}, "port in 0..65535"),
        ({"backends": [backend("http://h:1", grpc_url="h:99999")]}, "port in 0..65535"),
        (
            {
                "workers": {
                    "repo": "repo",
                    "base_port": 65535,
                    "devices": [{"name": "a", "device": "cpu"}, {"name": "b", "device": "cpu"}],
                }
            },
            "workers.devices.1.port: workers.base_port + 1 = 65536 is over 65535",
        ),
    ],
)
@pytest.mark.parametrize("command", ["gateway", "up"])
def test_cluster_file_ports_out_of_range(
    tmp_path: Path, command: str, doc: dict[str, object], message: str
) -> None:
    path = cluster(tmp_path, doc)
    args = ["gateway", "--config", str(path)] if command == "gateway" else ["up", str(path)]
    code, err = run_cli(*args, cwd=tmp_path)
    assert_usage_error(code, err, message)
