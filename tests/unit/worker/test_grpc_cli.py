"""``evenserve worker --grpc-port``: a clear error without the grpc extra, a bad port named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer

from evenserve.cli.worker_cmd import worker


def test_grpc_port_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    monkeypatch.delitem(sys.modules, "evenserve.worker.grpc_api", raising=False)
    with pytest.raises(typer.Exit) as exit_:
        worker(repo=tmp_path, grpc_port=8001)
    assert exit_.value.exit_code == 2
    err = capsys.readouterr().err
    assert "--grpc-port" in err and "pip install 'evenserve[grpc]'" in err


def test_grpc_port_out_of_range(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(typer.Exit):
        worker(repo=tmp_path, grpc_port=70000)
    assert "--grpc-port: must be in 0..65535" in capsys.readouterr().err
