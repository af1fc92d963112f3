"""The detectors (report.diagnose) on hand-made arm summaries: each fires on its evidence,
names the device and model, proposes a change; a healthy arm and unmeasured figures give
nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from evenserve.report.diagnose import diagnose_arm, per_item_ratio

MEMORY_BOUND = {"batches": [1, 8], "latency_ms": [2.4, 5.2]}
COMPUTE_BOUND = {"batches": [1, 8], "latency_ms": [1.6, 12.1]}
GREEDY = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0.0}


def _model(**kw: Any) -> dict[str, Any]:
    pm = {
        "batches": 1000,
        "mean_batch_size": 2.0,
        "cap": 8,
        "fill": 0.25,
        "held_ms_mean": 0.0,
        "held_fraction": 0.0,
        "profile": MEMORY_BOUND,
    }
    return pm | kw


def _device(**kw: Any) -> dict[str, Any]:
    d = {
        "utilization": 0.6,
        "mean_queue_depth": 0.8,
        "max_queue_depth": 5.0,
        "mean_batch_size": 2.0,
        "batches": 1000,
        "models": ["m"],
        "held_idle_fraction": 0.0,
        "observed_vs_profile": 1.0,
        "staging_fraction": 0.0,
        "memory_peak_fraction": 0.1,
        "per_model": {"m": _model()},
        "burst": None,
    }
    return d | kw


def healthy() -> dict[str, Any]:
    return {
        "routing_spec": {"policy": "least-expected-work"},
        "batching_spec": {"m": GREEDY},
        "devices": {f"gpu{i}": _device() for i in range(3)},
        "models": {
            "m": {"slo_ms": 50.0, "latency_ms": {"p99": 12.0}, "slo_attainment": 1.0, "dropped": 0}
        },
        "requests": {"arrived": 1000, "dropped": 0, "dropped_by_reason": {}},
        "timeseries": {"queue_depth": {f"gpu{i}": [0.8] * 10 for i in range(3)}},
        "window_s": {"start": 0.0, "end": 10.0},
    }


def kinds(arm: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [(f.kind, f.device, f.model) for f in diagnose_arm(arm)]


def test_a_healthy_arm_gives_nothing() -> None:
    assert kinds(healthy()) == []


def test_unmeasured_figures_give_nothing() -> None:
    arm = healthy()
    for d in arm["devices"].values():
        for k in ("utilization", "observed_vs_profile", "staging_fraction", "memory_peak_fraction"):
            d[k] = None
        d["per_model"]["m"] |= {"held_fraction": None, "profile": None}
    arm["timeseries"] = {}
    assert kinds(arm) == []


def test_a_hot_node_names_the_device_and_the_model_served_only_there() -> None:
    arm = healthy()
    arm["routing_spec"] = {"policy": "round-robin"}
    arm["devices"]["gpu0"] |= {"mean_queue_depth": 9.0, "models": ["m", "x"], "utilization": 1.0}
    arm["timeseries"]["queue_depth"]["gpu0"] = [9.0] * 10
    (f,) = [f for f in diagnose_arm(arm) if f.kind == "hot-node"]
    assert f.device == "gpu0" and f.severity == "critical"
    assert f.evidence["served_only_here"] == ["x"]
    changes = [c.to_json() for c in f.candidates]
    assert changes[0]["params"] == {"routing": {"policy": "least-expected-work"}}
    assert changes[1]["placement"] == {"gpu1": ["x"]} and not changes[1]["pushable"]


def test_a_queue_hot_for_a_moment_only_is_not_a_hot_node() -> None:
    arm = healthy()
    arm["devices"]["gpu0"]["mean_queue_depth"] = 9.0
    arm["timeseries"]["queue_depth"]["gpu0"] = [0.8] * 8 + [45.0, 45.0]
    assert "hot-node" not in [k for k, _, _ in kinds(arm)]


def test_a_slow_device_is_reported_once_not_also_hot() -> None:
    arm = healthy()
    arm["devices"]["gpu1"] |= {"observed_vs_profile": 2.0, "mean_queue_depth": 9.0}
    arm["timeseries"]["queue_depth"]["gpu1"] = [9.0] * 10
    assert kinds(arm) == [("slow-device", "gpu1", None)]
    (f,) = diagnose_arm(arm)
    assert f.candidates[0].params == {"learn_profiles": True}


def test_scheduling_imbalance_between_hosts_of_one_model() -> None:
    arm = healthy()
    arm["routing_spec"] = {"policy": "weighted-random"}
    arm["devices"]["gpu0"] |= {"mean_queue_depth": 2.5}
    arm["devices"]["gpu2"] |= {"mean_queue_depth": 1.0}
    assert kinds(arm) == [("scheduling-imbalance", "gpu0", "m")]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"staging_fraction": 0.35}, ("transfer-stall", "gpu1", None)),
        ({"memory_peak_fraction": 0.84}, ("memory-pressure", "gpu1", "m")),
    ],
)
def test_device_figures(change: dict[str, float], expected: tuple[str, str, str | None]) -> None:
    arm = healthy()
    arm["devices"]["gpu1"] |= change
    assert kinds(arm) == [expected]


def test_shedding() -> None:
    arm = healthy()
    arm["requests"] = {"arrived": 1000, "dropped": 30, "dropped_by_reason": {"queue-full": 30}}
    arm["models"]["m"]["dropped"] = 30
    (f,) = diagnose_arm(arm)
    assert f.kind == "overload-shedding" and f.evidence["share"] == 0.03
    # Dropped for a reason that is not load (no backend) is not shedding.
    arm["requests"]["dropped_by_reason"] = {"no-backend": 30}
    assert kinds(arm) == []


def _batching(spec: dict[str, Any], **model: Any) -> dict[str, Any]:
    arm = healthy()
    arm["batching_spec"] = {"m": spec}
    for d in arm["devices"].values():
        d["per_model"]["m"] |= model
    return arm


def test_batching_findings() -> None:
    window = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 20.0}
    arm = _batching(window, held_fraction=0.3)
    assert {k for k, _, _ in kinds(arm)} == {"window-too-long"}
    (f, *_) = diagnose_arm(arm)
    assert f.candidates[0].params == {
        "batching_per_model": {"m": window | {"max_batch_delay_ms": 0.0}}
    }
    # The same hold on a compute-bound model: the more specific cause, once.
    arm = _batching(window, held_fraction=0.3, profile=COMPUTE_BOUND)
    assert {k for k, _, _ in kinds(arm)} == {"compute-bound-waiting"}
    arm = _batching({"policy": "static", "batch_size": 4}, held_fraction=0.3)
    assert {k for k, _, _ in kinds(arm)} == {"static-batch-wait"}
    # Batching off while work waits on a busy device, and batching would pay.
    arm = _batching({"policy": "none"}, cap=1, mean_batch_size=1.0)
    assert {k for k, _, _ in kinds(arm)} == {"batching-sawtooth"}
    # ... but not on a compute-bound model, where batching gains nothing.
    arm = _batching({"policy": "none"}, cap=1, mean_batch_size=1.0, profile=COMPUTE_BOUND)
    assert kinds(arm) == []
    capped = {"policy": "fixed-window", "max_batch_size": 2, "max_batch_delay_ms": 0.0}
    arm = _batching(capped, cap=2, mean_batch_size=2.0)
    assert {k for k, _, _ in kinds(arm)} == {"memory-bound-small-batches"}
    (f, *_) = diagnose_arm(arm)
    assert f.candidates[0].params == {"batching_per_model": {"m": capped | {"max_batch_size": 8}}}


def test_slo_at_risk_borrows_the_causes_changes() -> None:
    arm = healthy()
    arm["models"]["m"] |= {"latency_ms": {"p99": 45.0}, "slo_attainment": 0.999}
    (f,) = diagnose_arm(arm)
    assert (f.kind, f.severity) == ("slo-at-risk", "warning")
    arm["models"]["m"]["slo_attainment"] = 0.9
    arm["devices"]["gpu0"]["observed_vs_profile"] = 1.8
    found = diagnose_arm(arm)
    assert [f.kind for f in found] == ["slo-at-risk", "slow-device"]  # critical first
    assert found[0].candidates == found[1].candidates


def test_a_model_without_an_slo_is_never_at_risk() -> None:
    arm = healthy()
    arm["models"]["m"] |= {"slo_ms": None, "latency_ms": {"p99": 900.0}, "slo_attainment": None}
    assert kinds(arm) == []


def test_per_item_ratio() -> None:
    assert per_item_ratio(MEMORY_BOUND) == pytest.approx((5.2 / 8) / 2.4)
    assert per_item_ratio(COMPUTE_BOUND) == pytest.approx((12.1 / 8) / 1.6)
    assert per_item_ratio({"batches": [1, 2, 4], "latency_ms": [1.0, 2.0, 3.0]}) == pytest.approx(
        (3.0 + 4 * 0.5) / 8
    )  # the last segment extended
    assert per_item_ratio(None) is None
    assert per_item_ratio({"batches": [1], "latency_ms": [1.0]}) is None


def test_the_input_is_not_changed() -> None:
    arm = healthy()
    arm["devices"]["gpu1"]["staging_fraction"] = 0.5
    before = copy.deepcopy(arm)
    diagnose_arm(arm)
    assert arm == before
