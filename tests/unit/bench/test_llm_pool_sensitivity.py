"""bench/llm_pool_sensitivity.py on a short stretch of the pool scenario: its rows, the
unperturbed run being the live bench's simulated side, a live JSON placed in the range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.bench.bench_module import load


def test_the_bench_reports_the_spread_and_places_a_live_run(tmp_path: Path) -> None:
    bench = load("llm_pool_sensitivity")
    # A "live" JSON whose figures are the unperturbed run's own: every figure in range.
    out = tmp_path / "sens.json"
    argv = ["--arms", "predicted-ttft", "--duration", "12", "--warmup", "2", "--drain", "20",
            "--replicas", "2", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    rows = {r["figure"]: r for r in doc["arms"]["predicted-ttft"]["rows"]}
    assert {"LLM goodput rps", "LLM TTFT p90 ms", "LLM unfinished", "router refusals"} <= set(rows)
    assert {"chat: TTFT p90 ms", "tenants: goodput rps"} <= set(rows)
    assert not [f for f in rows if "routed" in f or "hit rate" in f or f.startswith("resnet50")]
    for r in rows.values():
        if r["min"] is not None:
            assert r["min"] <= r["median"] <= r["max"]
        assert r["live"] is None
    assert len(doc["arms"]["predicted-ttft"]["replicas"]) == 2

    from evenserve.experiment.llm_live import BYTE_VOCAB
    from evenserve.experiment.llm_pool_live import scale_profile_set, scaled_pool
    from evenserve.sim.llm_pool import run_pool_arm, summarize_pool_arm
    from evenserve.sim.llm_pool_scenario import load_llm_pool_scenario

    base = load_llm_pool_scenario(bench.ROOT / "scenarios" / "llm-pool.yaml")
    pdirs = {
        s: scale_profile_set(base.profile_dir(s), tmp_path / s, 5.0)
        for s in {d.profiles for d in base.doc.devices}
    }
    sc = scaled_pool(base, 12.0, 2.0, 1.0, BYTE_VOCAB, 5.0, pdirs, 20.0)
    plain = summarize_pool_arm(sc, run_pool_arm(sc, "predicted-ttft")).to_dict()
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"time_scale": 5.0, "arms": {"predicted-ttft": {"live": plain}}}))
    assert bench.main([*argv, "--live-json", str(live)]) == 0
    rows = {r["figure"]: r for r in json.loads(out.read_text())["arms"]["predicted-ttft"]["rows"]}
    for name, r in rows.items():
        assert r["live"] == r["unperturbed"], name
    goodput = rows["LLM goodput rps"]
    assert goodput["live_over_median"] == pytest.approx(goodput["live"] / goodput["median"])


def test_the_bench_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load("llm_pool_sensitivity")
    live = tmp_path / "live.json"
    live.write_text(json.dumps({"time_scale": 3.0, "arms": {}}))
    for argv, word in ((["--arms", "fastest"], "--arms"), (["--replicas", "1"], "--replicas"),
                       (["--jitter-ms", "0"], "--jitter-ms"),
                       (["--live-json", str(live)], "--live-json")):  # fmt: skip
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert word in capsys.readouterr().err
