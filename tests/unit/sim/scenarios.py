"""Small scenario dicts for tests (profiles are built in tmp folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_profiles(root: Path) -> Path:
    d = root / "profiles" / "toy"
    d.mkdir(parents=True, exist_ok=True)
    for model, pts in {
        "fast": {1: 2.0, 4: 4.0, 8: 6.0},
        "slow": {1: 10.0, 4: 20.0, 8: 30.0},
    }.items():
        (d / f"{model}.yaml").write_text(
            yaml.safe_dump(
                {
                    "model": model,
                    "device": "toy",
                    "runtime": "test",
                    "precision": "fp32",
                    "source": "hand-written for tests",
                    "weights_mb": 100,
                    "points": [
                        {"batch": b, "latency_ms": ms, "memory_mb": 10 * b} for b, ms in pts.items()
                    ],
                }
            )
        )
    return d


def toy_scenario(root: Path, **over: Any) -> dict[str, Any]:
    write_profiles(root)
    sc: dict[str, Any] = {
        "name": "toy",
        "seed": 3,
        "duration_s": 20,
        "warmup_s": 2,
        "profile_sets": {"toy": "profiles/toy"},
        "devices": [
            {"name": "d0", "models": ["fast", "slow"], "memory_gb": 8},
            {"name": "d1", "models": ["fast"], "memory_gb": 8},
            {"name": "d2", "models": ["fast"], "memory_gb": 8},
        ],
        "models": {"fast": {"slo_ms": 50}, "slow": {"slo_ms": 200}},
        "workload": {"type": "open-loop", "rates_rps": {"fast": 300, "slow": 30}},
        "arms": {
            "baseline": {
                "routing": "round-robin",
                "batching": {"policy": "static", "batch_size": 4},
            },
            "optimized": {
                "routing": "least-expected-work",
                "batching": {
                    "policy": "fixed-window",
                    "max_batch_size": 8,
                    "max_batch_delay_ms": 5,
                },
            },
            "central-queue": {
                "routing": "central-queue",
                "batching": {
                    "policy": "fixed-window",
                    "max_batch_size": 8,
                    "max_batch_delay_ms": 5,
                },
            },
        },
    }
    sc.update(over)
    return sc


def write_scenario(root: Path, sc: dict[str, Any], name: str = "sc.yaml") -> Path:
    p = root / name
    p.write_text(yaml.safe_dump(sc, sort_keys=False))
    return p
