"""The pieces of the LLM live bench (``experiment.llm_live``, ``evenserve bench --scenario``
on an LLM scenario) that decide what both sides run: the time-scaled scenario and profile set
(the simulator's figures scale exactly), each arm's worker repository (its engine is the
simulator's), the comparison's units and bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.llm import load_step_profiles
from evenserve.sim.llm import engine_setup, run_arm, summarize_arm
from evenserve.sim.llm_scenario import load_llm_scenario
from evenserve.worker.llm.config import load_llm_model
from evenserve.worker.llm.hosting import build_llm
from evenserve.worker.repository import load_model

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "llm-mix.yaml"


from evenserve.experiment import llm_live as bench  # noqa: E402


def test_a_time_scaled_run_is_the_scenario_in_slow_motion(tmp_path: Path) -> None:
    base = load_llm_scenario(SCENARIO)
    k = 4.0
    plain = bench.scaled(base, 8.0, 2.0, 0.5, 256)
    pdir = bench.scale_profile_set(base.profile_dir(), tmp_path / "p", k)
    slow = bench.scaled(base, 8.0, 2.0, 0.5, 256, k, pdir)
    assert slow.doc.duration_s == 32.0 and slow.doc.warmup_s == 8.0
    assert slow.workloads[0].rate_rps == pytest.approx(8 * 0.5 / k)
    assert slow.workloads[0].tpot_ms == 80.0 and slow.workloads[0].vocab == 256
    assert slow.workloads[1].phases[1].start_s == 320.0
    assert slow.doc.classic[0].batching["max_batch_delay_ms"] == 8.0
    assert slow.doc.classic[0].slo_ms == 100.0
    step = load_step_profiles(pdir)["llama-3.1-8b"]
    assert step.c0_s == pytest.approx(4 * 5.75e-3)
    a = summarize_arm(plain, run_arm(plain, "colocated"))
    b = summarize_arm(slow, run_arm(slow, "colocated"))
    # In the scenario's units, the slowed run's figures are the plain run's.
    rows_a, rows_b = bench.compare(a, a), bench.compare(b, b, k)
    assert [r["figure"] for r in rows_a] == [r["figure"] for r in rows_b]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert rb["sim"] == pytest.approx(ra["sim"], rel=1e-4), ra["figure"]
        assert rb["within"] is True and rb["ratio"] == pytest.approx(1.0)
    by = {r["figure"]: r for r in rows_a}
    assert a.llm is not None
    assert by["LLM TPOT mean ms"]["sim"] == pytest.approx(a.llm.tpot_s.mean * 1e3, rel=1e-4)
    assert by["resnet50 goodput rps"]["sim"] == a.classic["resnet50"]["goodput_rps"]


def test_eight_percent_off_is_inside_the_p99_bound_and_outside_the_means() -> None:
    sc = bench.scaled(load_llm_scenario(SCENARIO), 6.0, 1.0, 0.25, 256)
    a = summarize_arm(sc, run_arm(sc, "classic-solo"))
    b = summarize_arm(sc, run_arm(sc, "classic-solo"))
    b.classic["resnet50"]["p99_ms"] *= 1.08  # inside 10 %
    b.classic["resnet50"]["p50_ms"] *= 1.08  # outside 5 %
    by = {r["figure"]: r for r in bench.compare(a, b)}
    assert by["resnet50 P99 ms"]["within"] is True
    assert by["resnet50 P50 ms"]["within"] is False
    assert by["bert-base P50 ms"]["within"] is True


@pytest.mark.parametrize("arm", ["request-level", "continuous", "continuous-chunked", "colocated"])
def test_each_arms_worker_runs_the_simulators_engine(tmp_path: Path, arm: str) -> None:
    sc = bench.scaled(load_llm_scenario(SCENARIO), 10.0, 1.0, 1.0, 256)
    repo = bench.write_repo(sc, arm, tmp_path)
    pdir = sc.profile_dir()
    entry = load_llm_model(repo / "llama-3.1-8b")
    # The class of its requests (the client sends none): the workloads' (online), which the
    # simulator's engine interleaves by, not the scenario's llm.priority.
    assert entry.config.priority_value == 10
    worker = build_llm(entry, pdir, emulated=True).setup
    doc = sc.doc
    assert doc.llm is not None
    spec = doc.llm.engine.merged(doc.arms[arm].engine)
    sim = engine_setup(spec, load_step_profiles(pdir)["llama-3.1-8b"], 0.020)
    for field in ("mode", "max_num_seqs", "max_num_batched_tokens", "chunk_tokens",
                  "prefix_caching", "max_waiting", "tpot_s"):  # fmt: skip
        assert getattr(worker, field) == getattr(sim, field), field
    classic = sorted(p.name for p in repo.iterdir() if p.name != "llama-3.1-8b")
    assert classic == (["bert-base", "resnet50"] if arm == "colocated" else [])
    if classic:
        classic_entry = load_model(repo / "resnet50", False)
        assert classic_entry.config.slo_ms == 25 and classic_entry.config.max_batch_size == 32


def test_evenserve_bench_takes_an_llm_scenario_and_refuses_classic_only_options() -> None:
    from typer.testing import CliRunner

    from evenserve.cli.main import app

    res = CliRunner().invoke(app, ["bench", "--scenario", str(SCENARIO), "--seed", "3"])
    assert res.exit_code == 2 and "not an LLM one" in res.output
    res = CliRunner().invoke(app, ["bench", "--scenario", str(SCENARIO), "--arms", "nope"])
    assert res.exit_code == 2 and "unknown arm" in res.output
