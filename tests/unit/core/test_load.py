"""The worker's load report becomes the router's sample: figures and units carried over."""

from __future__ import annotations

import json

import pytest

from evenserve.core.load import LoadReport


def test_a_report_carries_how_each_model_is_batched_bounded_and_promised() -> None:
    rep = LoadReport.model_validate(
        {
            "timestamp_s": 1.0,
            "device": "emulated:x",
            "queue_depth": 3,
            "in_flight": 8,
            "queued_by_model": {"a": 3},
            "utilization": 0.5,
            "utilization_window_s": 1.0,
            "max_batch_size_by_model": {"a": 8},
            "slo_ms_by_model": {"a": 50.0},
            "max_queue_by_model": {"a": 64},
        }
    )
    s = rep.to_sample(received_at_s=7.0)
    assert s.timestamp_s == 7.0 and s.queued_by_model == {"a": 3.0}
    assert s.max_batch_size == {"a": 8}
    assert s.slo_s == {"a": pytest.approx(0.05)}
    assert s.max_queue == {"a": 64}


def test_an_older_report_without_them_means_unknown() -> None:
    rep = LoadReport(
        timestamp_s=1.0,
        device="cpu",
        queue_depth=0,
        in_flight=0,
        utilization=0.0,
        utilization_window_s=1.0,
    )
    s = rep.to_sample(0.0)
    assert s.slo_s == {} and s.max_queue == {}


def test_learned_figures_travel_in_the_load_report() -> None:
    body = {
        "timestamp_s": 1.0,
        "device": "emulated:x",
        "queue_depth": 0,
        "in_flight": 0,
        "utilization": 0.5,
        "utilization_window_s": 1.0,
        "profile_scale_by_model": {"m": 2.0},
        "observed_ms_by_model": {"m": {"4": 8.5, "8": 12.0}},
    }
    sample = LoadReport.model_validate_json(json.dumps(body)).to_sample(3.0)
    assert sample.profile_scale == {"m": 2.0}
    assert sample.observed_ms == {"m": {4: 8.5, 8: 12.0}}
    plain = LoadReport.model_validate_json(
        json.dumps({k: v for k, v in body.items() if "by_model" not in k})
    ).to_sample(3.0)
    assert plain.profile_scale == {} and plain.observed_ms == {}
