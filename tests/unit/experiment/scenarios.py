"""A small scenario on the shipped A10 profiles and the example emulated repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
REPO = ROOT / "examples" / "models" / "emulated"


def scenario(**over: Any) -> dict[str, Any]:
    sc: dict[str, Any] = {
        "name": "small",
        "seed": 4,
        "duration_s": 10,
        "warmup_s": 2,
        "profile_sets": {"a10": str(ROOT / "profiles" / "a10-trt-fp16")},
        "signals": {"interval_ms": 50, "window": 2, "utilization_window_ms": 500},
        "devices": [
            {"name": "gpu", "count": 2, "models": ["resnet50", "bert-base"], "instances": 2},
            {"name": "solo", "models": ["resnet50"], "memory_gb": 16},
        ],
        "models": {
            "resnet50": {"slo_ms": 10, "deadline_ms": 30},
            "bert-base": {"slo_ms": 15, "priority": 0},
        },
        "workload": {
            "type": "open-loop",
            "rates_rps": {"resnet50": 400, "bert-base": 60},
            "phases": [{"start_s": 4, "end_s": 6, "multiplier": 2.0}],
            "streams": [
                {
                    "model": "bert-base",
                    "rate_rps": 30,
                    "priority": "online",
                    "deadline_ms": 50,
                    "phases": [{"start_s": 1, "end_s": 3, "multiplier": 0.5}],
                }
            ],
        },
        "arms": {
            "baseline": {"routing": "round-robin", "batching": {"policy": "static"}},
            "classes": {
                "routing": "least-expected-work",
                "batching": {"policy": "fixed-window", "max_batch_delay_ms": 2},
                "batching_per_model": {"bert-base": "none"},
                "max_queue_per_model": 40,
                "starvation_ms": 500,
                "class_headroom": 0.5,
            },
            "central-queue": {"routing": "central-queue", "batching": "fixed-window"},
        },
    }
    sc.update(over)
    return sc


def write(tmp_path: Path, sc: dict[str, Any], name: str = "sc.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(sc, sort_keys=False))
    return p
