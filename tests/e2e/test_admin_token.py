"""The admin token as subprocesses see it: the configured one is used, none is ever printed.

- `evenserve up` with a token in the cluster file: the gateway takes that token (not a
  generated one), the ready file holds it with mode 0600, and no output or log shows it.
- `evenserve gateway` with none configured: a generated token written to --token-file (0600),
  never printed; a token of one character from the environment is refused, naming the variable.
- `--help` never shows the token the environment holds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from evenserve.cli.main import app

from ..integration.worker_repo import MODELS, write_repo

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
FILE_TOKEN = "file-token-e2e-0123456789"
ENV_TOKEN = "env-token-never-shown-987"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EVENSERVE_ADMIN_TOKEN"}
    return {**env, **extra}


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120  # a hang guard only
    while not check():
        assert proc.poll() is None, f"exited before {what}: {log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {what}: {log.read_text(errors='replace')}"
        time.sleep(0.1)


def _live(url: str) -> bool:
    try:
        return httpx.get(url + "/v2/health/live", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _backends(url: str, token: str) -> int:
    auth = {"authorization": f"Bearer {token}"}
    return httpx.get(url + "/admin/backends", headers=auth, timeout=10).status_code


def test_up_uses_the_configured_token_and_never_prints_it(tmp_path: Path) -> None:
    write_repo(tmp_path, {"em": MODELS["em"]})
    gport = _free_port()
    cluster = {
        "gateway": {"port": gport, "admin": {"token": FILE_TOKEN}},
        "workers": {"repo": "repo", "devices": [{"name": "d0", "device": "cpu",
                                                 "port": _free_port()}]},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    ready, logs, out = tmp_path / "ready.json", tmp_path / "logs", tmp_path / "up.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [*CLI, "up", str(tmp_path / "c.yaml"), "--ready-file", str(ready),
             "--log-dir", str(logs)],
            stdout=f, stderr=subprocess.STDOUT, env=_env(EVENSERVE_ADMIN_TOKEN=ENV_TOKEN),
        )  # fmt: skip
    try:
        _wait("ready file", lambda: ready.exists() and ready.stat().st_size > 0, proc, out)
        assert stat.S_IMODE(ready.stat().st_mode) == 0o600
        info = json.loads(ready.read_text())
        assert info["admin_token"] == FILE_TOKEN
        assert info["admin_token_source"] == "gateway.admin.token"
        url = f"http://127.0.0.1:{gport}"
        assert _backends(url, FILE_TOKEN) == 200
        assert _backends(url, ENV_TOKEN) == 401
        assert not (logs / "admin-token").exists()  # nothing generated
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    written = out.read_text() + "".join(p.read_text(errors="replace") for p in logs.iterdir())
    assert FILE_TOKEN not in written and ENV_TOKEN not in written
    assert "gateway.admin.token" in out.read_text()


def _gateway_config(tmp_path: Path, port: int) -> Path:
    config = {
        "gateway": {"port": port},
        "backends": [{"name": "b0", "url": f"http://127.0.0.1:{_free_port()}", "models": ["m"]}],
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_gateway_writes_a_generated_token_0600_and_never_prints_it(tmp_path: Path) -> None:
    port = _free_port()
    token_file, log = tmp_path / "tok", tmp_path / "gw.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [*CLI, "gateway", "--config", str(_gateway_config(tmp_path, port)),
             "--token-file", str(token_file)],
            stdout=f, stderr=subprocess.STDOUT, env=_env(),
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("live gateway", lambda: _live(url), proc, log)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 16
        assert _backends(url, token) == 200 and _backends(url, "wrong-token-00000000") == 401
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert token not in text and str(token_file) in text


def test_a_one_character_token_from_the_environment_is_refused(tmp_path: Path) -> None:
    run = subprocess.run(
        [*CLI, "gateway", "--config", str(_gateway_config(tmp_path, _free_port()))],
        capture_output=True,
        text=True,
        env=_env(EVENSERVE_ADMIN_TOKEN="Q"),
        timeout=120,
    )
    assert run.returncode == 2
    err = " ".join(run.stderr.split())
    assert "EVENSERVE_ADMIN_TOKEN" in err and "at least 16 characters" in err


@pytest.mark.parametrize("command", ["gateway", "up", "bench"])
def test_help_never_shows_the_token(command: str) -> None:
    res = CliRunner().invoke(app, [command, "--help"], env={"EVENSERVE_ADMIN_TOKEN": ENV_TOKEN})
    assert res.exit_code == 0 and ENV_TOKEN not in res.output
