"""``policy.placement.engine``: the engine object the simulator and the live system share
(design 0022): the placement fields, ``engine_info``, the utilization a device reports with
an engine on it and its window; the gateway's catalogue builds the very ModelInfo the
simulator builds for ``scenarios/llm-pools-night.yaml``'s LLM from the same fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evenserve.cluster.file import parse_cluster
from evenserve.core.errors import ConfigError
from evenserve.core.llm import load_step_profiles
from evenserve.core.validation import validate_document
from evenserve.gateway.placement_catalogue import cluster_setup
from evenserve.policy.placement import ModelInfo
from evenserve.policy.placement.engine import (
    EnginePlacement,
    UtilizationMeter,
    engine_blocks,
    engine_info,
    engine_utilization,
)
from evenserve.sim.llm_placement import _Pool
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario

ROOT = Path(__file__).resolve().parents[3]
NIGHT = ROOT / "scenarios" / "llm-pools-night.yaml"
H100 = ROOT / "profiles" / "h100-llm"
SPEC = {
    "kv_tokens": 131072,
    "cold_load_ms": 20000,
    "warm_load_ms": 1500,
    "capacity": {"prompt_tokens": 1000, "output_tokens": 200},
}


def test_engine_info_is_for_engine_of_the_fields() -> None:
    prof = load_step_profiles(H100)["llama-3.1-8b"]
    spec = EnginePlacement.model_validate(SPEC)
    info = engine_info("llm", prof, spec, 128, 1.0)
    want = ModelInfo.for_engine(
        "llm", prof, kv_tokens=131072, cold_load_s=20.0, warm_load_s=1.5, max_num_seqs=128,
        prompt_tokens=1000, output_tokens=200, slo_s=1.0,
    )  # fmt: skip
    assert info == want
    assert engine_blocks(info, prof) == 131072 // prof.block_tokens
    with pytest.raises(ValueError, match="kv_tokens"):
        engine_info("llm", prof, spec.model_copy(update={"kv_tokens": 16}), 128)


def test_a_wake_longer_than_the_load_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="warm_load_ms"):
        validate_document(EnginePlacement, {**SPEC, "warm_load_ms": 30000}, "x")


def test_engine_utilization() -> None:
    assert engine_utilization(0.0, 1.0, 100, 0.05, 0.0) == pytest.approx(0.2)
    assert engine_utilization(0.5, 1.0, 100, 0.05, 0.7) == pytest.approx(0.85)
    assert engine_utilization(0.3, 0.0, 0, None, 0.0) == pytest.approx(0.3)


def test_the_meter_reads_over_its_window() -> None:
    m = UtilizationMeter(1.0)
    assert m.read(0.0, 0.05, 0.0) == 0.0  # no span yet
    for _ in range(10):  # 10 steps of 20 ms in the first second: mean step 20 ms / 50 ms
        m.step(0.02)
    m.classic(0.5)  # and half a second of classic batches
    assert m.read(1.0, 0.05, 0.0) == pytest.approx(0.5 + 0.5 * 0.4)
    # The next second: nothing ran; reads every 0.25 s keep one window of marks.
    for t in (1.25, 1.5, 1.75):
        m.read(t, 0.05, 0.0)
    assert m.read(2.0, 0.05, 0.0) == 0.0
    assert m.read(2.0, 0.05, 0.3) == pytest.approx(0.3)  # its KV use, if higher


def test_the_gateway_s_catalogue_builds_the_simulator_s_engine(tmp_path: Path) -> None:
    sc = load_llm_placement_scenario(NIGHT)
    sim = _Pool(sc, "cost-aware", 1).infos["llama-3.1-8b"]
    night = yaml.safe_load(NIGHT.read_text())["llm"]
    folder = tmp_path / "repo" / "llama-3.1-8b"
    folder.mkdir(parents=True)
    engine = night["engine"]
    (folder / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "kind": "llm",
                "runtime": "emulated",
                "ttft_ms": 1000,
                "tpot_ms": 50,
                "engine": engine,
                "placement": {k: night[k] for k in SPEC},
            }
        )
    )
    raw = {
        "gateway": {"placement": "cost-aware"},
        "workers": {"repo": "repo", "devices": [{"name": "g0", "device": f"emulated:{H100}"}]},
    }
    infos, _ = cluster_setup(parse_cluster(raw, tmp_path), {})
    assert infos["llama-3.1-8b"] == sim


def test_a_placed_llm_folder_without_a_step_profile_is_an_error(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "mystery"
    folder.mkdir(parents=True)
    (folder / "model.yaml").write_text(
        yaml.safe_dump({"kind": "llm", "runtime": "emulated", "placement": SPEC})
    )
    raw = {
        "gateway": {"placement": "cost-aware"},
        "workers": {"repo": "repo", "devices": [{"name": "g0", "device": f"emulated:{H100}"}]},
    }
    with pytest.raises(ConfigError, match="step_profile"):
        cluster_setup(parse_cluster(raw, tmp_path), {})
