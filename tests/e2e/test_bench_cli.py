"""`evenserve bench --scenario` on a tiny scenario (real gateway and workers as subprocesses),
then `evenserve report` on the saved run, and `evenserve bench URL` against a bad target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]


def tiny_scenario(tmp_path: Path) -> Path:
    sc = {
        "name": "tiny",
        "seed": 2,
        "duration_s": 3,
        "warmup_s": 0.5,
        "profile_sets": {"a10": str(ROOT / "profiles" / "a10-trt-fp16")},
        "devices": [
            {"name": "gpu0", "models": ["resnet50", "bert-base"]},
            {"name": "gpu1", "models": ["resnet50"]},
        ],
        "models": {"resnet50": {"slo_ms": 10}, "bert-base": {"slo_ms": 15}},
        "workload": {
            "type": "closed-loop",
            "users": 12,
            "think_ms": 10,
            "mix": {"resnet50": 0.8, "bert-base": 0.2},
        },
        "arms": {
            "baseline": {"routing": "round-robin", "batching": "fixed-window"},
            "qa": {
                "routing": "queue-aware",
                "batching": {"policy": "fixed-window", "max_batch_size": 8},
            },
            "central-queue": {"routing": "central-queue", "batching": "fixed-window"},
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def run(args: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def test_scenario_bench_then_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bench", "--scenario", str(tiny_scenario(tmp_path)), "--repeats", "2"]
    r = run([*args, "--out", str(out), "--no-progress", "--no-realtime"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "time scale K = 40" in r.stdout
    assert "fidelity: live vs simulated" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert list(s["arms"]) == ["baseline", "qa"]  # central-queue is simulator-only
    assert s["time_scale"] == 40
    for arm in ("baseline", "qa"):
        assert s["arms"][arm]["requests"]["completed"] > 0
        assert s["repeats"][arm]["p99_ms"]["n"] == 2
        assert set(s["fidelity"][arm]) >= {"p50_ms", "p99_ms", "util gpu0", "util gpu1"}
        for rep in (1, 2):
            run_dir = out / "runs" / arm / f"rep{rep}"
            assert (run_dir / "samples.jsonl").stat().st_size > 0
            assert json.loads((run_dir / "run.json").read_text())["time_scale"] == 40
    assert "central-queue" in s["simulated"]["arms"]
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    assert (out / "plots" / "utilization.png").is_file()

    r2 = run(["report", str(out), "--out", str(tmp_path / "again")])
    assert r2.returncode == 0, r2.stdout + r2.stderr
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    # Recomputed from the raw samples: the same figures as the bench printed.
    assert again["arms"]["qa"]["latency_ms"] == s["arms"]["qa"]["latency_ms"]
    assert again["fidelity"]["qa"]["p99_ms"] == s["fidelity"]["qa"]["p99_ms"]
    assert (tmp_path / "again" / "report.html").is_file()


def test_bad_targets_get_clear_errors(tmp_path: Path) -> None:
    r = run(["bench", "http://127.0.0.1:9", "--users", "2", "--mix", "m=1", "--duration", "2s"])
    assert r.returncode == 2
    assert "connection-refused" in r.stderr and "Traceback" not in r.stderr
    r = run(["bench", "http://192.0.2.1:80", "--users", "2", "--mix", "m=1"])
    assert r.returncode == 2 and "not a loopback address" in r.stderr
    r = run(["bench", "--scenario", str(tmp_path / "none.yaml")])
    assert r.returncode == 2 and "scenario file not found" in r.stderr
    r = run(["bench", "http://127.0.0.1:9"])
    assert r.returncode == 2 and "--mix" in r.stderr
    r = run(["bench", "http://127.0.0.1:9", "--json", str(tmp_path / "s.json")])
    assert r.returncode == 2 and "--json: only with --scenario" in r.stderr


def levels_scenario(tmp_path: Path) -> Path:
    """Open loop with two load levels; ``spike`` has a later phase, so scaling it matters."""
    sc = {
        "name": "tiny-levels",
        "seed": 3,
        "duration_s": 90,
        "warmup_s": 10,
        "profile_sets": {"a10": str(ROOT / "profiles" / "a10-trt-fp16")},
        "devices": [{"name": "gpu0", "models": ["resnet50"]}],
        "models": {"resnet50": {"slo_ms": 10}},
        "workload": {
            "type": "open-loop",
            "rates_rps": {"resnet50": 1600},
            "phases": [{"start_s": 0, "end_s": 90, "multiplier": 1.0}],
        },
        "levels": {
            "low": [{"start_s": 0, "end_s": 90, "multiplier": 0.25}],
            "spike": [
                {"start_s": 0, "end_s": 90, "multiplier": 0.5},
                {"start_s": 0.02, "end_s": 0.04, "multiplier": 3.0},
            ],
        },
        "arms": {"fw": {"routing": "round-robin", "batching": "fixed-window"}},
    }
    path = tmp_path / "tiny-levels.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def test_scenario_bench_at_a_level(tmp_path: Path) -> None:
    from evenserve.experiment.load import scenario_arrivals
    from evenserve.experiment.scaling import scale_scenario
    from evenserve.sim.loader import load_scenario, with_level

    path = levels_scenario(tmp_path)
    out = tmp_path / "out"
    r = run(
        ["bench", "--scenario", str(path), "--level", "spike", "--duration", "2s",
         "--warmup", "0.4s", "--out", str(out), "--no-plots", "--no-progress", "--no-realtime"]
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "at level spike" in r.stdout
    assert json.loads((out / "bench.json").read_text())["level"] == "spike"
    s = json.loads((out / "summary.json").read_text())
    assert s["level"] == "spike"
    # The level's phases, time-scaled (the spike at 0.8-1.6 s live at K = 40), are what both
    # the live run and the simulator got: the same arrivals, and not the default phases'.
    loaded = load_scenario(path)
    expected = {
        lv: [
            a.t_s
            for a in scenario_arrivals(
                scale_scenario(with_level(loaded, lv), 40.0, 2.0, 0.4, tmp_path), 3
            )
        ]
        for lv in (None, "low", "spike")
    }
    assert len({len(v) for v in expected.values()}) == 3
    assert len({v[0] for v in expected.values()}) == 3  # the levels differ from the first
    assert s["simulated"]["arms"]["fw"]["requests"]["arrived"] == len(expected["spike"])
    # Live: the requests sent are the spike schedule, in order, at its times. The generator
    # stops at the end of the run, so one that lags behind its schedule there (a loaded
    # machine) sends a prefix of it: which schedule, not how much of it, is the check.
    samples = (out / "runs" / "fw" / "rep1" / "samples.jsonl").read_text().splitlines()
    live = sorted(json.loads(line)["intended_s"] for line in samples)
    assert s["arms"]["fw"]["requests"]["arrived"] == len(live) > 0
    assert live == pytest.approx(expected["spike"][: len(live)], abs=1e-6)


def test_bad_level_is_a_clear_error(tmp_path: Path) -> None:
    r = run(["bench", "--scenario", str(levels_scenario(tmp_path)), "--level", "peak"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--level" in r.stderr and "'peak'" in r.stderr and "low, spike" in r.stderr
    r = run(["bench", "http://127.0.0.1:9", "--users", "2", "--mix", "m=1", "--level", "low"])
    assert r.returncode == 2 and "--level: only with --scenario" in r.stderr


def test_a_placement_arm_runs_live(tmp_path: Path) -> None:
    """A tiny placement arm live: m0 starts cold on a device that cannot hold both models,
    so its first request loads it (evicting s0); the gateway's counts reach the summary and
    the fidelity table checks them. No figure's value is asserted (a wall-clock run)."""
    sc = {
        "name": "tiny-placement",
        "seed": 2,
        "duration_s": 8,
        "warmup_s": 1,
        "profile_sets": {"pl": str(ROOT / "profiles" / "placement-live")},
        "devices": [{"name": "g0", "memory_gb": 1.6, "models": ["s0"]}],
        "models": {
            "s0": {"slo_ms": 100, "profile": "small"},
            "m0": {"slo_ms": 200, "profile": "medium"},
        },
        "workload": {"type": "open-loop", "rates_rps": {"s0": 10, "m0": 2}},
        "arms": {
            "lru": {
                "routing": "least-expected-work",
                "batching": "fixed-window",
                "placement": {"policy": "lru"},
                "placement_interval_ms": 500,
            }
        },
    }
    path = tmp_path / "tiny-placement.yaml"
    path.write_text(yaml.safe_dump(sc))
    out = tmp_path / "out"
    args = ["bench", "--scenario", str(path), "--time-scale", "1", "--no-plots"]
    args += ["--repo", str(ROOT / "examples" / "models" / "placement-live")]
    r = run([*args, "--out", str(out), "--json", str(tmp_path / "s.json"), "--no-progress"])
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads((tmp_path / "s.json").read_text())
    arm = s["arms"]["lru"]
    assert arm["requests"]["completed"] > 0
    assert arm["loads"] >= 1 and arm["device_seconds"] > 0
    rows = s["fidelity"]["lru"]
    assert rows["device_seconds"]["checked"] and rows["evictions"]["checked"]
    assert rows["loads"]["checked"] is False
