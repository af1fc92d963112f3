"""The pure parts of bench/vs_nginx.py: the nginx config, the device files, the figures of a
run, the max-sustained-rate rule and the ratio/target rows. Nothing here starts a process."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.core.profile import load_profile
from evenserve.loadgen.spec import LoadResult, LoadSpec, Sample

from .vs_nginx_module import load

vs = load()


def run(
    arm: str,
    rate: float = 800.0,
    *,
    p99: float | None = 50.0,
    achieved: float | None = None,
    errors: dict[str, int] | None = None,
    cpu_s: float = 1.0,
    answered: int = 10_000,
) -> Any:
    return vs.RunFigures(
        scenario="s",
        arm=arm,
        rate_rps=rate,
        seconds=10.0,
        offered_rps=rate,
        achieved_rps=rate if achieved is None else achieved,
        p50_ms=10.0,
        p99_ms=p99,
        answered=answered,
        errors=errors or {},
        cpu_s={"balancer": cpu_s, "workers": 2.0},
    )


# -- nginx config -------------------------------------------------------------------------------
def test_nginx_conf_is_least_conn_with_upstream_keepalive(tmp_path: Path) -> None:
    ups = ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9004"]
    text = vs.nginx_conf(8080, ups, tmp_path, rlimit_nofile=4096)
    lines = [ln.strip() for ln in text.splitlines()]
    assert "worker_processes 1;" in lines
    assert "daemon off;" in lines
    assert "access_log off;" in lines
    assert "least_conn;" in lines
    assert "proxy_http_version 1.1;" in lines
    assert 'proxy_set_header Connection "";' in lines
    assert "listen 127.0.0.1:8080 backlog=4096;" in lines
    assert "worker_rlimit_nofile 4096;" in lines
    for u in ups:
        assert f"server {u} max_fails=0;" in lines
    assert any(ln.startswith("keepalive ") for ln in lines)
    # Idle upstream connections retire before the workers' 5 s keep-alive.
    assert "keepalive_timeout 4s;" in lines
    assert not any(ln.startswith("user ") for ln in lines)
    # Every file nginx writes is under the work folder.
    for ln in lines:
        if ln.startswith(("pid ", "error_log ")) or "_temp_path " in ln:
            assert str(tmp_path.resolve()) in ln, ln
    assert text.count("{") == text.count("}")


def test_nginx_conf_user_and_no_upstreams(tmp_path: Path) -> None:
    assert "user root;" in vs.nginx_conf(1, ["127.0.0.1:2"], tmp_path, user="root")
    with pytest.raises(ValueError, match="no upstreams"):
        vs.nginx_conf(1, [], tmp_path)


# -- devices and cluster files --------------------------------------------------------------
def test_profiles_are_the_stated_lines(tmp_path: Path) -> None:
    normal = vs.write_profile_set(tmp_path / "n", 1.0)
    slow = vs.write_profile_set(tmp_path / "s", 2.5)
    for m, (fixed, per) in vs.MODELS.items():
        pn = load_profile(normal / f"{m}.yaml")
        ps = load_profile(slow / f"{m}.yaml")
        for b in range(1, vs.MAX_BATCH + 1):
            assert pn.latency_s(b) * 1e3 == pytest.approx(fixed + per * b)
            assert ps.latency_s(b) * 1e3 == pytest.approx(2.5 * (fixed + per * b))


def test_repo_batches_with_a_2ms_window(tmp_path: Path) -> None:
    repo = vs.write_repo(tmp_path / "repo", list(vs.MODELS))
    for m in vs.MODELS:
        doc = yaml.safe_load((repo / m / "model.yaml").read_text())
        assert doc["batching"] == {
            "policy": "fixed-window",
            "max_batch_size": 8,
            "max_batch_delay_ms": 2.0,
        }
        assert doc["max_batch_size"] == 8


def test_cluster_files_validate(tmp_path: Path) -> None:
    from evenserve.cluster.file import parse_cluster

    repo = vs.write_repo(tmp_path / "repo", list(vs.MODELS))
    pset = vs.write_profile_set(tmp_path / "p", 1.0)
    gw = vs.gateway_cluster(
        8000, "least-expected-work", [("dev0", "http://127.0.0.1:9001", pset)], list(vs.MODELS)
    )
    parsed = parse_cluster(gw, tmp_path)
    assert [b.profiles for b in parsed.backends()] == [str(pset)]
    up = vs.up_cluster(8000, "queue-aware", repo, [(f"dev{i}", pset, 9001 + i) for i in range(4)])
    parsed = parse_cluster(up, tmp_path)
    assert parsed.config.workers is not None
    assert [d.port for d in parsed.config.workers.devices] == [9001, 9002, 9003, 9004]
    assert parsed.config.workers.devices[0].extra_args == vs.WORKER_FLAGS


# -- figures of one run -----------------------------------------------------------------------
def test_figures_of_a_run() -> None:
    spec = LoadSpec(
        target="http://127.0.0.1:1", mix={"a": 1.0}, duration_s=4.0, warmup_s=1.0, rate_rps=2.0
    )
    samples = [
        Sample("a", 0.5, 0.5, 0.51, 200, "ok"),  # warm-up: not in latency or rates
        *[
            Sample("a", 1.0 + i * 0.5, 1.0 + i * 0.5, 1.0 + i * 0.5 + 0.010 * (i + 1), 200, "ok")
            for i in range(5)
        ],
        Sample("a", 3.6, 3.6, math.nan, 429, "overloaded"),
        Sample("a", 3.8, 3.8, math.nan, 0, "timeout"),
    ]
    result = LoadResult(
        spec=spec,
        samples=samples,
        scrapes={},
        errors={},
        lag_ms={"p99": 0.5},
        started_unix_s=0.0,
        end_s=4.0,
    )
    f = vs.figures_of(result, "p800", "nginx", {"balancer": 0.07})
    assert f.errors == {"429": 1, "timeout": 1}
    assert f.error_count == 2
    assert f.answered == 7  # every HTTP answer, refusals too
    assert f.offered_rps == pytest.approx(7 / 3.0)
    assert f.achieved_rps == pytest.approx(5 / 3.0)
    assert f.p50_ms == pytest.approx(30.0)
    assert f.cpu_us_per_request("balancer") == pytest.approx(0.07 / 7 * 1e6)
    assert f.cpu_us_per_request("launcher") is None


def test_parse_stat_reads_past_a_command_with_spaces() -> None:
    fields = ["S", "42"] + ["0"] * 9 + ["150", "50"] + ["0"] * 30
    text = "1234 (nginx: worker (x)) " + " ".join(fields)
    ppid, cpu = vs.parse_stat(text)
    assert ppid == 42
    assert cpu == pytest.approx(200 / vs.TICK)


# -- the max-sustained-rate rule --------------------------------------------------------------
def test_sustained_needs_rate_no_errors_and_p99() -> None:
    assert vs.sustained(run("a"), 250.0)
    assert vs.sustained(run("a", achieved=0.98 * 800), 250.0)
    assert not vs.sustained(run("a", achieved=0.97 * 800), 250.0)
    assert not vs.sustained(run("a", errors={"429": 1}), 250.0)
    assert not vs.sustained(run("a", p99=251.0), 250.0)
    assert not vs.sustained(run("a", p99=None), 250.0)


def test_max_sustained_is_the_highest_sustained_step() -> None:
    steps = [run("a", 400), run("a", 600), run("a", 800, p99=300.0)]
    assert vs.max_sustained(steps, 250.0) == 600.0
    assert vs.max_sustained([run("a", 400, errors={"502": 3})], 250.0) == 0.0
    assert vs.max_sustained([], 250.0) == 0.0


# -- ratios and targets -----------------------------------------------------------------------
def test_targets_rows_and_verdicts() -> None:
    runs = {
        "p800": {
            "nginx": run("nginx", cpu_s=0.5, p99=40.0),
            "gw:round-robin": run("gw:round-robin", cpu_s=0.9, p99=50.0),  # 1.25x
            "gw:queue-aware": run("gw:queue-aware", cpu_s=1.5, p99=60.0),  # 1.5x
            "up:queue-aware": run("up:queue-aware", cpu_s=0.6, p99=44.0, errors={"429": 1}),
        },
        "slow600": {
            "nginx": run("nginx", 600, p99=100.0),
            "gw:round-robin": run("gw:round-robin", 600, p99=150.0),
            "gw:least-expected-work": run("gw:least-expected-work", 600, p99=90.0),
        },
    }
    max_rates = {
        "max": {
            "nginx": 1000.0,
            "ref": 1250.0,
            "gw:queue-aware": 900.0,
            "up:queue-aware": 1200.0,
            "gw:round-robin": 800.0,
        },
        "max-hog": {"nginx": 1000.0, "ref": 1000.0, "up:queue-aware": 900.0},
    }
    added = {
        "500": {
            "cpu_us_per_request": {"gateway": 180.0, "nginx": 100.0},
            "added_p50_ms": {"gateway": 0.25, "nginx": 0.12},
        },
        "800": {
            "cpu_us_per_request": {"gateway": 250.0, "nginx": 100.0},
            "added_p50_ms": {"gateway": 0.4, "nginx": 3.4},
        },
    }
    rows = vs.build_targets(runs, max_rates, {"nginx": 0.0, "gw:queue-aware": 0.5}, added)
    got = {(r.target, r.arm): r for r in rows}

    cpu = "balancer CPU/request, us (one zero-cost backend, {} req/s)"
    assert got[(cpu.format(500), "gateway")].verdict == "PASS"  # 1.8x
    assert got[(cpu.format(800), "gateway")].verdict == "FAIL"  # 2.5x
    assert got[(cpu.format(800), "gateway")].ratio == pytest.approx(2.5)
    assert got[("added P50 latency, ms (500 req/s)", "gateway")].verdict == "PASS"
    assert got[("added P50 latency, ms (800 req/s)", "gateway")].verdict == "FAIL"
    # nginx adding 3.4 ms is not nginx: the harness check says so.
    assert got[("nginx's added P50, ms (500 req/s): harness check", "nginx")].verdict == "info"
    assert got[("nginx's added P50, ms (800 req/s): harness check", "nginx")].verdict == "FLAG"
    # The 4-device CPU figure is shown, not judged.
    assert got[("balancer CPU/request, us (p800, 4 devices)", "gw:queue-aware")].verdict == "info"
    mx = "max sustained rate, req/s ({}, vs {})"
    assert got[(mx.format("max", "nginx"), "gw:queue-aware")].verdict == "PASS"  # 0.9x
    assert got[(mx.format("max", "nginx"), "gw:round-robin")].verdict == "FAIL"  # 0.8x
    assert got[(mx.format("max", "nginx"), "up:queue-aware")].verdict == "PASS"  # 1.2x >= 1x
    # up must also keep up with the reference devices: 1200 < 1250.
    ref = mx.format("max", "nginx + reference devices")
    assert got[(ref, "up:queue-aware")].verdict == "FAIL"
    assert got[(mx.format("max-hog", "nginx"), "up:queue-aware")].verdict == "PASS"  # 0.9x
    assert got[(mx.format("max-hog", "nginx + reference devices"), "up:queue-aware")].verdict == (
        "PASS"
    )
    assert got[("P99 ms (p800)", "gw:round-robin")].verdict == "PASS"
    assert got[("P99 ms (p800)", "gw:queue-aware")].verdict == "FAIL"
    # 1.1x nginx but an error: fails the 0-errors part.
    assert got[("P99 ms (p800)", "up:queue-aware")].verdict == "FAIL"
    assert got[("P99 ms (p800)", "up:queue-aware")].note == "1 errors"
    # Slow device: only least-expected-work and queue-aware are held to <= nginx.
    assert got[("P99 ms (slow600)", "gw:round-robin")].verdict == "info"
    assert got[("P99 ms (slow600)", "gw:least-expected-work")].verdict == "PASS"
    assert got[("idle balancer CPU, % of a core", "gw:queue-aware")].verdict == "PASS"
    assert not any(r.arm in ("nginx", "ref") and r.verdict in ("PASS", "FAIL") for r in rows)
    table = vs.targets_table(rows)
    assert table.row_count == len(rows)


def test_targets_leave_out_what_was_not_run() -> None:
    assert vs.build_targets({}, {}, {}, {}) == []
    rows = vs.build_targets({"p400": {"gw:x": run("gw:x")}}, {"max": {"gw:x": 1.0}}, {}, {})
    assert rows == []  # no nginx run to compare with


def test_mean_batches_between_two_readings() -> None:
    before = {"resnet-like": (100.0, 20.0), "bert-like": (10.0, 5.0)}
    after = {"resnet-like": (180.0, 30.0), "bert-like": (10.0, 5.0), "new": (6.0, 2.0)}
    assert vs.mean_batches(before, after) == {"resnet-like": 8.0, "new": 3.0}


def test_added_summary_medians_and_added_p50() -> None:
    def f(arm: str, p50: float, cpu_s: float) -> Any:
        r = run(arm, 500.0, cpu_s=cpu_s, answered=1000)
        r.p50_ms = p50
        return r

    by_rate = {
        500.0: {
            "direct": [f("direct", 1.0, 0.0), f("direct", 1.2, 0.0)],
            "gateway": [f("gateway", 1.3, 0.2), f("gateway", 1.5, 0.3)],
            "nginx": [f("nginx", 1.2, 0.1), f("nginx", 1.2, 0.1)],
        }
    }
    s = vs.added_summary(by_rate)["500"]
    assert s["p50_ms"]["direct"] == pytest.approx(1.1)
    assert s["added_p50_ms"]["gateway"] == pytest.approx(0.3)
    assert s["cpu_us_per_request"]["gateway"] == pytest.approx(250.0)


# -- the plan ---------------------------------------------------------------------------------
def test_plan_quick_and_only() -> None:
    full = vs.make_plan(vs.parse_args([]))
    assert full.scenarios == vs.SCENARIOS
    assert full.arms()[0] == "nginx"
    assert {f"gw:{p}" for p in vs.GW_POLICIES} <= set(full.arms())
    assert {f"up:{p}" for p in vs.UP_POLICIES} <= set(full.arms())
    quick = vs.make_plan(vs.parse_args(["--quick", "--only", "max,p800"]))
    assert quick.scenarios == ["p800", "max"]
    assert quick.rates == vs.QUICK_RATES
    assert quick.seconds == 5.0
    assert quick.run_count() == len(quick.arms()) + len(quick.max_arms()) * len(quick.rates)
    assert quick.max_arms()[:2] == ["nginx", "ref"] and not quick.realtime
    none_up = vs.make_plan(vs.parse_args(["--up-policies", "", "--hog", "0"]))
    assert none_up.up == []
    assert (
        none_up.run_count()
        == vs.make_plan(
            vs.parse_args(
                [
                    "--up-policies",
                    "",
                    "--hog",
                    "0",
                    "--only",
                    ",".join(s for s in vs.SCENARIOS if s not in ("p800-hog", "max-hog")),
                ]
            )
        ).run_count()
    )
    with pytest.raises(SystemExit):
        vs.make_plan(vs.parse_args(["--only", "nope"]))


def test_an_ejection_in_any_gateway_run_fails_the_no_ejection_target() -> None:
    quiet = run("gw:round-robin")
    quiet.ejections = 0
    saturated = run("gw:round-robin", 1400)
    saturated.scenario = "max"
    saturated.ejections = 2
    rows = vs.build_targets({"p800": {"gw:round-robin": quiet}}, {}, {}, {}, [saturated])
    (row,) = [r for r in rows if r.target.startswith("backends ejected")]
    assert row.verdict == "FAIL" and row.value == 2.0 and "1400" in row.note
    saturated.ejections = 0
    rows = vs.build_targets({"p800": {"gw:round-robin": quiet}}, {}, {}, {}, [saturated])
    assert [r.verdict for r in rows if r.target.startswith("backends ejected")] == ["PASS"]
