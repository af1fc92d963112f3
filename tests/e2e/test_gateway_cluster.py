"""`evenserve up` on the seed cluster as subprocesses: tritonclient through the gateway, and a
worker killed under load. Short versions of bench/tritonclient_through_gateway.py and
bench/kill_worker.py (the 20 s run is the bench script); assertions on counts, never on time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def hosts_of(model: str) -> list[str]:
    import yaml

    raw = yaml.safe_load((ROOT / "examples" / "cluster-seed.yaml").read_text())
    return [d["name"] for d in raw["workers"]["devices"] if model in d["models"]]


def run_script(name: str, *args: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


def test_tritonclient_through_gateway_on_seed_cluster(tmp_path: Path) -> None:
    r = run_script(
        "tritonclient_through_gateway.py",
        "--cluster", str(ROOT / "examples" / "cluster-seed.yaml"),
        "--resnet", "48", "--bert", "16", "--concurrency", "8",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert r["server"] == "evenserve-gateway"
    resnet, bert = r["resnet50"], r["bert-base"]
    assert isinstance(resnet, dict) and isinstance(bert, dict)
    assert resnet["succeeded"] == 48 and resnet["output_shapes"] == [[1, 1000]]
    assert bert["succeeded"] == 16 and bert["output_shapes"] == [[1, 2]]
    # Placement is honoured: BERT only where it is deployed; ResNet spread over hosts.
    assert set(bert["backend_header_counts"]) <= set(hosts_of("bert-base"))
    assert len(resnet["backend_header_counts"]) >= 2
    assert sum(resnet["backend_header_counts"].values()) == 48
    assert r["up_exit_code"] == 0 and r["processes_left_after_sigterm"] == []


def test_killed_worker_every_request_answered_ejected_and_readmitted(tmp_path: Path) -> None:
    r = run_script(
        "kill_worker.py", "--duration-s", "5", "--kill-at-s", "1.5", "--rate", "40",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert r["no_answer"] == 0
    assert r["answered"] == r["sent"] == 200
    statuses = r["statuses"]
    assert isinstance(statuses, dict)
    assert all(k.endswith((" 200", " 503")) for k in statuses)
    # Refused by the next poll or forward, or reset under a poll the kill interrupted.
    assert r["ejection_reason"] in ("connect-refused", "timeout", "connection-lost")
    assert r["ejected_after_kill_s"] is not None
    assert r["readmitted_after_kill_s"] is not None
    assert r["up_exit_code"] == 0
