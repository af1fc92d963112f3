"""Two `evenserve worker` processes sharing one host pool: a model unloaded on one loads warm
on the other (the load reply says host), its entry is a file of its weights' bytes in the
pool, and the pool's flags refuse bad input naming the flag. Sources, never times."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from evenserve.core.profile import MB
from evenserve.core.wire import repository_path

from ..integration.worker_repo import MODELS, PROFILE, write_repo
from .test_worker_cli import CLI, _start

pytestmark = pytest.mark.e2e


def test_a_model_unloaded_on_one_worker_loads_warm_on_the_other(tmp_path: Path) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    pool = tmp_path / "pool"
    flags = ["--repo", str(repo), "--model-control", "explicit", "--host-pool", str(pool)]
    flags += ["--host-pool-gb", "1"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, url_a = _start([*flags, "--load-model", "em"], tmp_path / "a")
    try:
        b, url_b = _start(flags, tmp_path / "b")
        try:
            index = json.loads((pool / "index.json").read_text())
            (entry,) = index["entries"].values()  # A's cold load at startup went through it
            assert entry["model"] == "em" and entry["bytes"] == PROFILE["weights_mb"] * MB
            stats = httpx.get(url_a + "/v2/models/em/stats", timeout=10).json()
            assert stats["model_stats"][0]["evenserve_load"]["load_source"] == "disk"
            r = httpx.post(url_a + repository_path("em", "unload"), timeout=30)
            assert r.status_code == 200, r.text
            r = httpx.post(url_b + repository_path("em", "load"), timeout=30)
            assert r.status_code == 200 and r.json()["load_source"] == "host", r.text
            metrics = httpx.get(url_b + "/metrics", timeout=10).text
            assert 'evenserve_model_load_sources_total{model="em",source="host"} 1.0' in metrics
        finally:
            b.terminate()
            b.wait(30)
    finally:
        a.terminate()
        a.wait(30)


def test_the_pool_flags_refuse_bad_input_naming_the_flag(tmp_path: Path) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    base = ["--repo", str(repo)]
    for args, message in (
        (["--host-pool-gb", "2"], "--host-pool-gb: needs --host-pool DIR"),
        (["--host-pool", str(tmp_path / "p")], "--host-pool: needs --host-pool-gb"),
        (
            ["--host-pool", str(tmp_path / "p"), "--host-pool-gb", "0"],
            "--host-pool-gb: must be > 0",
        ),
        (
            ["--host-pool", str(not_a_dir / "pool"), "--host-pool-gb", "1"],
            "is not a writable directory",
        ),
    ):
        out = subprocess.run(
            [*CLI, "worker", *base, *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out
        assert message in " ".join(out.stderr.split()), out.stderr
