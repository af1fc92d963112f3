"""``evenserve worker --model-control / --load-model / --repository-poll-secs /
--load-wait-ms``: the startup
set each mode loads, and clear errors naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from evenserve.cli.worker_cmd import worker
from evenserve.worker.app import Worker
from tests.unit.worker.fakes import PROFILE

EM = {
    "runtime": "emulated",
    "max_batch_size": 4,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
    "emulated": {"profile": "profile.yaml"},
}


def _repo(tmp_path: Path, names: tuple[str, ...] = ("a", "b")) -> Path:
    for n in names:
        d = tmp_path / "repo" / n
        d.mkdir(parents=True)
        (d / "model.yaml").write_text(yaml.safe_dump(EM))
        (d / "profile.yaml").write_text(yaml.safe_dump({**PROFILE, "model": n}))
    return tmp_path / "repo"


def test_explicit_loads_only_the_startup_set(tmp_path: Path, served: list[Worker]) -> None:
    repo = _repo(tmp_path)
    worker(repo=repo, port=0, model_control="explicit", load_model=["b"])
    (svc,) = served
    assert list(svc.models) == ["b"]
    assert svc.options.model_control == "explicit" and svc.options.repository == repo
    worker(repo=repo, port=0, model_control="explicit", models="a")  # --models: the same
    assert list(served[1].models) == ["a"]
    worker(repo=repo, port=0, model_control="explicit")  # nothing until a load
    assert list(served[2].models) == []


def test_none_and_poll_load_every_folder(tmp_path: Path, served: list[Worker]) -> None:
    repo = _repo(tmp_path)
    worker(repo=repo, port=0)
    worker(repo=repo, port=0, model_control="poll", repository_poll_secs=2.5)
    assert [list(s.models) for s in served] == [["a", "b"], ["a", "b"]]
    assert served[1].options.repository_poll_s == 2.5
    assert served[0].options.load_wait_s == 10.0  # --load-wait-ms 10000 by default
    worker(repo=repo, port=0, model_control="explicit", load_wait_ms=250)
    assert served[2].options.load_wait_s == 0.25


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"model_control": "sometimes"}, "--model-control: 'sometimes' is not none, explicit"),
        ({"load_model": ["a"]}, "--load-model: needs --model-control explicit"),
        ({"model_control": "poll", "models": "a"}, "--models: not with --model-control poll"),
        ({"model_control": "poll", "repository_poll_secs": 0}, "--repository-poll-secs: must"),
        ({"model_control": "explicit", "load_model": ["zz"]}, "--load-model: no model folder 'zz'"),
        ({"load_wait_ms": -1}, "--load-wait-ms: must be >= 0"),
    ],
)
def test_bad_flags_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict[str, Any], message: str
) -> None:
    repo = _repo(tmp_path)
    with pytest.raises(typer.Exit):
        worker(repo=repo, port=0, **kw)
    assert message in capsys.readouterr().err
