"""``collect_live`` and ``push_recommendation`` against a running cluster (a gateway and two
emulated workers, started the way the scenario bench starts one): the summary's fields are
there and its counts agree with each other; errors name the URL. Counts, never timing."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.experiment.cluster import arm_cluster
from evenserve.experiment.live_diagnose import (
    LiveCollectError,
    collect_live,
    push_recommendation,
)
from evenserve.loadgen.runner import run_load
from evenserve.loadgen.spec import LoadResult, LoadSpec

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

DEVICE_FIELDS = {
    "utilization",
    "mean_queue_depth",
    "max_queue_depth",
    "mean_batch_size",
    "batches",
    "models",
    "held_idle_fraction",
    "observed_vs_profile",
    "staging_fraction",
    "memory_peak_fraction",
    "per_model",
    "burst",
}


def _free_ports(n: int) -> list[int]:
    """``n`` consecutive free loopback ports (the workers' ports are base_port + position)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free consecutive ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("live-diagnose")
    raw = yaml.safe_load((ROOT / "examples" / "cluster-seed.yaml").read_text())
    gw_port, *worker_ports = _free_ports(3)
    raw["gateway"]["port"] = gw_port
    raw["workers"]["base_port"] = worker_ports[0]
    raw["workers"]["repo"] = str(ROOT / "examples" / "models" / "emulated")
    raw["workers"]["devices"] = raw["workers"]["devices"][:2]
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    with arm_cluster(path, tmp / "logs", say=lambda s: None) as la:
        assert la.gateway is not None
        yield la.gateway.url, la.admin_token


def _load(url: str, out: list[LoadResult]) -> None:
    spec = LoadSpec(
        target=url, mix={"resnet50": 0.8, "bert-base": 0.2}, duration_s=4.0, rate_rps=40.0
    )
    out.append(run_load(spec, realtime=False))


def test_collect_live_measures_the_cluster_under_load(cluster: tuple[str, str]) -> None:
    url, token = cluster
    results: list[LoadResult] = []
    sender = threading.Thread(target=_load, args=(url, results))
    sender.start()
    try:
        summary = collect_live(url, 2.0, token)
    finally:
        sender.join(timeout=60)
    assert results and results[0].samples
    assert summary["scenario"] == "live" and set(summary["arms"]) == {"live"}
    arm: dict[str, Any] = summary["arms"]["live"]
    assert set(arm["devices"]) == {"gpu0", "gpu1"}
    for d in arm["devices"].values():
        assert set(d) >= DEVICE_FIELDS
        assert d["burst"] is None
        assert d["batches"] == sum(p["batches"] for p in d["per_model"].values())
    assert arm["devices"]["gpu0"]["models"] == ["bert-base", "resnet50"]
    assert arm["devices"]["gpu1"]["models"] == ["resnet50"]
    req = arm["requests"]
    assert req["arrived"] > 0
    assert req["arrived"] == req["completed"] + req["dropped"]
    assert req["dropped"] == sum(req["dropped_by_reason"].values())
    models = arm["models"]
    assert sum(m["completed"] for m in models.values()) == req["completed"]
    assert models["resnet50"]["slo_ms"] == 50.0  # from the worker's load report
    assert models["resnet50"]["latency_ms"]["p50"] is not None
    # 50 ms is a bucket edge of the gateway's histogram: an estimate exists.
    assert models["resnet50"]["slo_attainment"] is not None
    assert "histogram" in arm["note"]
    assert arm["routing_spec"]["policy"] == "queue-aware"
    assert arm["batching_spec"]["resnet50"]["policy"] == "fixed-window"
    ts = arm["timeseries"]
    assert ts["interval_s"] == 1.0 and set(ts["utilization"]) == {"gpu0", "gpu1"}
    assert arm["window_s"]["start"] == 0.0
    assert arm["utilization_mean"] is not None and arm["utilization_spread_pts"] is not None


def test_without_the_token_the_error_says_what_to_do(cluster: tuple[str, str]) -> None:
    url, _ = cluster
    with pytest.raises(LiveCollectError, match=r"401.*admin token"):
        collect_live(url, 1.0, None)
    with pytest.raises(LiveCollectError, match=re.escape(f"{url}/admin/backends: 401")):
        collect_live(url, 1.0, "not-the-token")


def test_a_gateway_that_is_not_there_is_named() -> None:
    (port,) = _free_ports(1)
    with pytest.raises(
        LiveCollectError, match=re.escape(f"127.0.0.1:{port}/admin/backends: no answer")
    ):
        collect_live(f"http://127.0.0.1:{port}", 1.0, "t")


def test_push_recommendation_makes_a_new_version(cluster: tuple[str, str]) -> None:
    url, token = cluster
    update = {
        "batching_per_model": {
            "resnet50": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0}
        }
    }
    v1 = push_recommendation(url, update, token)
    v2 = push_recommendation(url, update, token)
    assert v2 == v1 + 1
    with pytest.raises(LiveCollectError, match="401"):
        push_recommendation(url, update, "not-the-token")


def test_the_cli_measures_live_and_applies_a_verified_change(
    cluster: tuple[str, str], tmp_path: Path
) -> None:
    """``diagnose --live`` reads the cluster; ``diagnose RUN --apply`` pushes the best verified
    parameter change (a short simulated seed baseline: its recommendation is routing and
    batching for the cluster's own models) as a new version. The baseline is 6 simulated
    seconds (2 of warm-up): ``--apply`` verifies each candidate by simulating the run again,
    so the run's length is most of this test's cost; the seeded run finds the same kind of
    change (routing plus batching caps) as a longer one."""
    import json

    from typer.testing import CliRunner

    from evenserve.cli.main import app
    from evenserve.httpio.params_client import get_params

    url, token = cluster
    runner = CliRunner()
    env = {"EVENSERVE_ADMIN_TOKEN": token}
    saved = tmp_path / "live.json"
    r = runner.invoke(
        app,
        ["diagnose", "--live", url, "--window", "1s", "--save", str(saved), "--json", "-"],
        env=env,
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["runs"][0]["run"] == url and "live" in report["runs"][0]["arms"]
    assert set(json.loads(saved.read_text())["arms"]["live"]["devices"]) == {"gpu0", "gpu1"}
    assert token not in r.output
    run = tmp_path / "seed.json"
    seed = ROOT / "scenarios" / "seed.yaml"
    short = ["--set", "duration_s=6", "--set", "warmup_s=2"]
    r = runner.invoke(app, ["simulate", str(seed), "--arm", "baseline", *short, "--json", str(run)])
    assert r.exit_code == 0, r.output
    before = get_params(url, token)["version"]
    r = runner.invoke(
        app, ["diagnose", str(run), "--apply", url, "--jobs", "1", "--json", "-"], env=env
    )
    assert r.exit_code == 0, r.output
    applied = json.loads(r.output)["applied"]
    assert applied["pushed"] and applied["version"] == before + 1
    now = get_params(url, token)
    assert now["version"] == before + 1
    if "routing" in applied["params"]:
        assert now["params"]["routing"]["policy"] == applied["params"]["routing"]["policy"]
    r = runner.invoke(app, ["diagnose", "--live", url, str(run)], env=env)
    assert r.exit_code == 2 and "give one" in r.output
    r = runner.invoke(app, ["diagnose", "--live", url, "--window", "soon"], env=env)
    assert r.exit_code == 2 and "--window" in r.output
