"""`evenserve up` with placement and a host pool (`host_memory_gb` > 0): a model evicted from
one device is reloaded warm, the controller planned it warm and the worker's reply says it
came from the host pool; the run's pool directory is gone after exit. Counts, never times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from .test_placement_up import BODY, TOKEN, free_port, running_up, write_models

pytestmark = pytest.mark.e2e
AUTH = {"authorization": f"Bearer {TOKEN}"}


def write_cluster(tmp: Path) -> Path:
    dev = write_models(tmp, load_ms=100, weights_mb=60, warm_load_ms=10, batched=False)
    # Devices of 0.1 GiB hold one model of 60 MiB each; the pool holds all three.
    devices = [
        {"name": n, "device": dev, "models": [m], "memory_gb": 0.1, "port": free_port()}
        for n, m in (("d0", "m1"), ("d1", "m2"))
    ]
    raw: dict[str, Any] = {
        "gateway": {
            "port": free_port(),
            "admin": {"token": TOKEN},
            "placement": {
                "policy": "lru",
                "interval_ms": 200,
                "load_wait_ms": 10_000,
                "host_memory_gb": 1,
            },
        },
        "workers": {"repo": str(tmp / "repo"), "devices": devices},
    }
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def test_an_evicted_model_reloads_warm_as_the_controller_planned(tmp_path: Path) -> None:
    pool: str | None = None
    with running_up(tmp_path, write_cluster(tmp_path)) as run:
        url = run.summary["gateway"]["url"]
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as c:
            # m3 is resident nowhere: one device's model is evicted, m3 loads cold.
            assert c.post("/v2/models/m3/infer", json=BODY).status_code == 200
            view = c.get("/admin/placement", headers=AUTH).json()
            residents = {m for d in view["devices"].values() for m in d["residents"]}
            (evicted,) = {"m1", "m2"} - residents
            # The evicted model is warm (in the controller's pool and in the host's).
            assert evicted in view["warm"]
            assert c.post(f"/v2/models/{evicted}/infer", json=BODY).status_code == 200
            counts = c.get("/admin/placement", headers=AUTH).json()["counts"]
        assert (counts["cold_loads"], counts["warm_loads"]) == (1, 1), counts
        assert (counts["live_cold_loads"], counts["live_warm_loads"]) == (1, 1), counts
        logs = (tmp_path / "logs" / "d0.log").read_text() + (tmp_path / "up.out").read_text()
        cmdline = Path(f"/proc/{run.summary['workers'][0]['pid']}/cmdline")
        argv = cmdline.read_bytes().split(b"\0")  # the worker's command line (Linux)
        pool = argv[argv.index(b"--host-pool") + 1].decode()
        assert Path(pool).is_dir() and list(Path(pool).glob("*.entry"))
        assert "Traceback" not in logs
    assert run.code == 0, (tmp_path / "up.out").read_text()[-3000:]
    assert pool is not None and not Path(pool).exists()  # removed at exit: its memory is back
