"""A live run's diagnosis figures (design 0012): the worker's /metrics parsed, counter deltas
over the window interpolated at its edges, the same per-device keys as the simulator's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evenserve.loadgen.records import RunLabels, read_run, to_records, write_run
from evenserve.loadgen.scrape import BackendScrape, parse_diagnosis
from evenserve.loadgen.spec import LoadResult, LoadSpec, Sample
from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

SEED = Path(__file__).resolve().parents[3] / "scenarios" / "seed.yaml"

PAGE = """# HELP evenserve_worker_batch_held_seconds_total held
# TYPE evenserve_worker_batch_held_seconds_total counter
evenserve_worker_batch_held_seconds_total{model="a"} 1.5
evenserve_worker_batch_held_seconds_created{model="a"} 1.7e+09
evenserve_worker_batch_expected_seconds_total{model="a"} 4.0
evenserve_worker_compute_input_seconds_total{model="a"} 0.5
evenserve_worker_compute_time_seconds_sum{model="a"} 5.0
evenserve_worker_compute_time_seconds_count{model="a"} 20.0
evenserve_worker_compute_time_seconds_bucket{le="0.5",model="a"} 20.0
evenserve_worker_batch_size_sum{model="a"} 60.0
evenserve_worker_batch_size_count{model="a"} 20.0
evenserve_worker_batch_cap{model="a"} 4.0
evenserve_worker_batch_cap_other{model="a"} 9.0
evenserve_worker_device_memory_used_bytes{device="gpu0"} 2e9
evenserve_worker_device_memory_total_bytes{device="gpu0"} 8e9
evenserve_worker_device_instances{device="gpu0"} 1.0
"""


def test_parse_diagnosis_reads_the_series_it_wants() -> None:
    d = parse_diagnosis(PAGE)
    assert d == {
        "models": {
            "a": {
                "held_s": 1.5,
                "expected_s": 4.0,
                "input_s": 0.5,
                "compute_s": 5.0,
                "computed": 20.0,
                "items": 60.0,
                "batches": 20.0,
                "cap": 4.0,
            }
        },
        "memory_used_bytes": 2e9,
        "memory_total_bytes": 8e9,
        "instances": 1.0,
    }
    assert parse_diagnosis("evenserve_worker_device_busy_seconds_total 3\n") is None


def _reading(
    held: float, exp: float, inp: float, comp: float, items: float, n: float
) -> dict[str, Any]:
    return {
        "models": {
            "a": {
                "held_s": held,
                "expected_s": exp,
                "input_s": inp,
                "compute_s": comp,
                "computed": n,
                "items": items,
                "batches": n,
                "cap": 8.0,
            }
        },
        "memory_used_bytes": 1e9,
        "memory_total_bytes": 4e9,
        "instances": 2.0,
    }


def _scrape() -> BackendScrape:
    b = BackendScrape("gpu0", "http://127.0.0.1:1")
    b.queue_t_s, b.queue_depth = [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]
    b.busy_t_s, b.busy_total_s = [0.0, 4.0], [0.0, 4.0]
    # Readings at 0, 2 and 4 s; the window is [1, 3]: each counter is taken halfway.
    b.metrics_t_s = [0.0, 2.0, 4.0]
    b.metrics = [
        _reading(0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        _reading(0.4, 2.0, 0.6, 3.0, 20.0, 10.0),
        _reading(0.8, 4.0, 1.2, 6.0, 40.0, 20.0),
    ]
    return b


LABELS = RunLabels(
    scenario="t",
    arm="live",
    routing="rr",
    batching="b",
    seed=1,
    slo_ms={"a": 50.0},
    routing_spec={"policy": "round-robin"},
    batching_spec={"a": {"policy": "static", "batch_size": 8, "max_wait_ms": None}},
)


def test_the_window_s_deltas_make_the_simulators_fields() -> None:
    samples = [Sample("a", 1.5, 1.5, 1.51, 200, "ok", "gpu0")]
    s = summarize(to_records(samples, {"gpu0": _scrape()}, LABELS, warmup_s=1.0, end_s=3.0))
    d = s["devices"]["gpu0"]
    # Over [1, 3]: held 0.4 s, expected 2 s, input 0.6 s, compute 3 s, 10 batches of 20 items.
    assert d["held_idle_fraction"] == pytest.approx(0.4 / (2.0 * 2))  # window x instances
    assert d["observed_vs_profile"] == pytest.approx((3.0 - 0.6) / 2.0)
    assert d["staging_fraction"] == pytest.approx(0.6 / 3.0)
    assert d["memory_peak_fraction"] == pytest.approx(0.25)
    assert d["models"] == ["a"]
    assert d["burst"] is None
    assert d["per_model"]["a"] == {
        "batches": 10,
        "mean_batch_size": 2.0,
        "cap": 8,
        "fill": 0.25,
        "held_ms_mean": pytest.approx(40.0),
        "held_fraction": pytest.approx(0.1),
        "profile": None,
    }
    assert s["routing_spec"] == {"policy": "round-robin"}
    assert s["batching_spec"]["a"]["batch_size"] == 8


def test_the_keys_are_the_simulators() -> None:
    live = summarize(to_records([], {"gpu0": _scrape()}, LABELS, warmup_s=1.0, end_s=3.0))
    loaded = load_scenario(SEED, ["duration_s=3", "warmup_s=1"])
    sim = summarize(simulate(loaded, "baseline"))
    assert set(live["devices"]["gpu0"]) == set(sim["devices"]["gpu0"])
    assert set(live["devices"]["gpu0"]["per_model"]["a"]) == set(
        sim["devices"]["gpu0"]["per_model"]["resnet50"]
    )


def test_one_reading_is_no_measurement() -> None:
    b = _scrape()
    b.metrics_t_s, b.metrics = b.metrics_t_s[:1], b.metrics[:1]
    d = summarize(to_records([], {"gpu0": b}, LABELS, 1.0, 3.0))["devices"]["gpu0"]
    assert d["held_idle_fraction"] is None and d["per_model"] == {}


def test_the_run_folder_keeps_the_readings_and_the_specs(tmp_path: Path) -> None:
    spec = LoadSpec(target="http://127.0.0.1:9", mix={"a": 1}, duration_s=3.0, warmup_s=1.0)
    samples = [Sample("a", 1.5, 1.5, 1.51, 200, "ok", "gpu0")]
    result = LoadResult(
        spec=spec,
        samples=samples,
        scrapes={"gpu0": _scrape()},
        errors={},
        lag_ms={},
        started_unix_s=0.0,
        end_s=3.0,
    )
    write_run(tmp_path, result, LABELS, {})
    rec, _ = read_run(tmp_path)
    s = summarize(rec)
    assert s["devices"]["gpu0"]["staging_fraction"] == pytest.approx(0.2)
    assert rec.batching_spec == LABELS.batching_spec
    assert rec.routing_spec == LABELS.routing_spec


def test_the_scrapers_names_are_the_workers() -> None:
    from evenserve.loadgen import scrape
    from evenserve.metrics import names

    assert set(scrape.PER_MODEL_SERIES) == {
        f"{names.BATCH_HELD}_total",
        f"{names.BATCH_EXPECTED}_total",
        f"{names.COMPUTE_INPUT}_total",
        f"{names.COMPUTE_TIME}_sum",
        f"{names.COMPUTE_TIME}_count",
        f"{names.BATCH_SIZE}_sum",
        f"{names.BATCH_SIZE}_count",
        names.BATCH_CAP,
    }
    assert set(scrape.DEVICE_SERIES) == {
        names.DEVICE_MEMORY_USED,
        names.DEVICE_MEMORY_TOTAL,
        names.DEVICE_INSTANCES,
    }
    assert f"{names.DEVICE_BUSY_SECONDS}_total" == scrape.BUSY_COUNTER


def test_a_live_devices_batches_come_from_its_measured_figures() -> None:
    from evenserve.loadgen.records import measured_batch_figures

    s = summarize(to_records([], {"gpu0": _scrape()}, LABELS, warmup_s=1.0, end_s=3.0))
    assert s["devices"]["gpu0"]["batches"] == 0  # no per-batch records live
    d = measured_batch_figures(s)["devices"]["gpu0"]
    assert d["batches"] == 10 and d["mean_batch_size"] == pytest.approx(2.0)


def test_observed_vs_profile_counts_only_the_models_with_a_profile() -> None:
    b = _scrape()
    for r in b.metrics:  # a second model without a profile, computing for a long time
        r["models"]["b"] = {"compute_s": 100.0 * r["models"]["a"]["batches"], "batches": 1.0}
    d = summarize(to_records([], {"gpu0": b}, LABELS, 1.0, 3.0))["devices"]["gpu0"]
    assert d["observed_vs_profile"] == pytest.approx((3.0 - 0.6) / 2.0)
