"""The params client and ``evenserve params`` against a worker serving on a thread."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evenserve.cli.main import app
from evenserve.httpio.params_client import (
    ParamsAPIError,
    get_params,
    push_params,
    rollback_params,
)
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

from .worker_repo import MODELS, write_repo

TOKEN = "client-token-123456"
SMALL = {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 1}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    opts = WorkerOptions(device=parse_device("cpu"), admin_token=TOKEN)
    with BackgroundWorker(Worker(load_repository(repo), opts)) as w:
        yield w


def test_the_client_gets_pushes_and_rolls_back(worker: BackgroundWorker) -> None:
    got = get_params(worker.url, TOKEN)
    assert got["version"] == 1
    reply = push_params(
        worker.url, TOKEN, {"batching_per_model": {"em": SMALL}}, expected_version=1, note="t"
    )
    assert reply["version"] == 2 and reply["params"]["batching_per_model"]["em"] == SMALL
    with pytest.raises(ParamsAPIError) as err:
        push_params(worker.url, TOKEN, {"class_headroom": 0.5}, expected_version=1)
    assert err.value.status == 409 and err.value.current_version == 2
    with pytest.raises(ParamsAPIError) as err:
        push_params(worker.url, TOKEN, {"class_headroom": 5})
    assert err.value.status == 400 and "params.class_headroom" in str(err.value)
    with pytest.raises(ParamsAPIError) as err:
        get_params(worker.url, "wrong-token-123456")
    assert err.value.status == 401
    back = rollback_params(worker.url, TOKEN, to_version=1, expected_version=2)
    assert back["version"] == 3
    assert back["params"] == got["params"]
    with pytest.raises(ParamsAPIError) as err:
        get_params("http://127.0.0.1:9", TOKEN, timeout_s=2)
    assert err.value.status == 0
    # A number JSON cannot carry is not sent (it was a ValueError from the HTTP library).
    with pytest.raises(ParamsAPIError) as err:
        push_params(worker.url, TOKEN, {"batching_per_model": {"em": {**SMALL, "x": [math.inf]}}})
    assert err.value.status == 0
    assert "not sent: params.batching_per_model.em.x.0: inf is not a finite number" in str(
        err.value
    )
    assert get_params(worker.url, TOKEN)["version"] == 3


def test_the_cli(worker: BackgroundWorker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.delenv("EVENSERVE_ADMIN_TOKEN", raising=False)
    r = runner.invoke(app, ["params", "get", worker.url])
    assert r.exit_code == 2 and "no admin token" in r.output
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    r = runner.invoke(app, ["params", "get", worker.url, "--token-file", str(token_file), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["version"] == 1
    monkeypatch.setenv("EVENSERVE_ADMIN_TOKEN", TOKEN)
    f = tmp_path / "p.yaml"
    f.write_text("batching_per_model:\n  em: {policy: fixed-window, max_batch_size: 4}\n")
    r = runner.invoke(app, ["params", "put", worker.url, str(f), "--expected-version", "1"])
    assert r.exit_code == 0, r.output
    assert "version 2 (was 1)" in r.output
    r = runner.invoke(
        app, ["params", "put", worker.url, "-", "--json"], input='{"class_headroom": 0.5}'
    )
    assert r.exit_code == 0 and json.loads(r.output)["params"]["class_headroom"] == 0.5
    r = runner.invoke(
        app, ["params", "rollback", worker.url, "--to", "1", "--expected-version", "2"]
    )
    assert r.exit_code == 1 and "409" in r.output
    r = runner.invoke(app, ["params", "rollback", worker.url, "--to", "1"])
    assert r.exit_code == 0 and "version 4 (was 3)" in r.output
    assert TOKEN not in r.output
    f.write_text("class_headroom: .inf\n")  # YAML's infinity: refused, not a traceback
    r = runner.invoke(app, ["params", "put", worker.url, str(f)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception
    assert "not sent: params.class_headroom: inf is not a finite number" in r.output
