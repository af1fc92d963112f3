"""examples/cluster-llm.yaml: one emulated H100 hosting the LLM next to ResNet-50 and BERT
(examples/models/llm), planned by `evenserve up` as any other cluster: the LLM folder is in the
worker's repository and selected with ``--models``, the device's bundled profile set is found,
and the folders' settings are scenarios/llm-mix.yaml's ``colocated`` arm."""

from __future__ import annotations

from pathlib import Path

from evenserve.cluster.file import load_cluster
from evenserve.cluster.launcher import Launcher
from evenserve.core.llm import load_step_profiles
from evenserve.sim.llm import engine_setup
from evenserve.sim.llm_scenario import load_llm_scenario
from evenserve.worker.llm.config import load_llm_model
from evenserve.worker.llm.hosting import build_llm
from evenserve.worker.repository import load_llm_repository, load_repository

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ROOT / "examples" / "cluster-llm.yaml"
REPO = ROOT / "examples" / "models" / "llm"


def test_up_plans_one_worker_serving_the_llm_and_the_classic_models(tmp_path: Path) -> None:
    la = Launcher(load_cluster(CLUSTER), CLUSTER, tmp_path, python="py")
    la.plan()
    assert [w.name for w in la.workers] == ["h100"]
    cmd = la.workers[0].cmd
    assert cmd[cmd.index("--repo") + 1] == str(REPO)
    assert cmd[cmd.index("--models") + 1].split(",") == ["llama-3.1-8b", "resnet50", "bert-base"]
    device = cmd[cmd.index("--device") + 1]
    assert device.startswith("emulated:") and Path(device.removeprefix("emulated:")).is_dir()
    assert "llama-3.1-8b" in load_step_profiles(Path(device.removeprefix("emulated:")))
    # LLM folders are served with model control none only: no placement flags.
    assert "--model-control" not in cmd
    assert la.gateway is not None


def test_the_example_folders_load_and_are_the_colocated_arm() -> None:
    assert [e.name for e in load_llm_repository(REPO)] == ["llama-3.1-8b"]
    classic = {e.name: e for e in load_repository(REPO, None, check_profiles=False)}
    assert sorted(classic) == ["bert-base", "resnet50"]
    sc = load_llm_scenario(ROOT / "scenarios" / "llm-mix.yaml")
    for c in sc.doc.classic:
        cfg = classic[c.model].config
        assert (cfg.slo_ms, cfg.max_batch_size) == (c.slo_ms, c.max_batch_size)
    pdir = sc.profile_dir()
    llm = build_llm(load_llm_model(REPO / "llama-3.1-8b"), pdir, emulated=True).setup
    assert sc.doc.llm is not None
    spec = sc.doc.llm.engine.merged(sc.doc.arms["colocated"].engine)
    sim = engine_setup(spec, load_step_profiles(pdir)["llama-3.1-8b"], 0.020)
    for field in ("mode", "max_num_seqs", "max_num_batched_tokens", "chunk_tokens",
                  "prefix_caching", "max_waiting", "tpot_s"):  # fmt: skip
        assert getattr(llm, field) == getattr(sim, field), field
