"""The watch loop's rules with a fake gateway and a fake simulator: apply only with a margin,
roll back a change that live P99 contradicts within one window, never two changes in a window,
no re-applying a rolled-back set."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evenserve.experiment.tune import current_params
from evenserve.experiment.watch import (
    Figures,
    Params,
    Record,
    SimPredictor,
    WatchPolicy,
    live_figures,
    run_watch,
)
from evenserve.httpio.params_client import ParamsAPIError
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario

FW = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 5}


class FakeGateway:
    def __init__(self, params: Params) -> None:
        self.history = [{"version": 1, "params": params}]
        self.calls: list[str] = []

    @property
    def version(self) -> int:
        return int(self.history[-1]["version"])

    def get_params(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "params": self.history[-1]["params"],
            "history": list(self.history),
        }

    def _new(self, params: Params, at: float = 0.0) -> dict[str, Any]:
        self.history.append({"version": self.version + 1, "params": params, "applied_unix_s": at})
        return self.get_params()

    def put_params(self, params: Params, expected_version: int, note: str) -> dict[str, Any]:
        assert expected_version == self.version
        self.calls.append("put")
        return self._new(params)

    def rollback(self, to_version: int, expected_version: int, note: str) -> dict[str, Any]:
        assert expected_version == self.version
        self.calls.append(f"rollback->{to_version}")
        (h,) = [h for h in self.history if h["version"] == to_version]
        return self._new(h["params"])

    def pull_log(self, since_unix_s: float) -> list[Record]:
        return []

    def learned_scales(self) -> dict[str, dict[str, float]]:
        return {}


class FakeSim:
    """P99 = the params' ``w`` (ms); the tuner proposes ``best``."""

    def __init__(self, best: Params) -> None:
        self.best = best

    def observe_devices(self, scales: Any) -> None:
        pass

    def predict(self, records: Sequence[Record], params: Params) -> Figures:
        return Figures(float(params["w"]), 100.0, len(records))

    def tune(self, records: Sequence[Record], params: Params) -> tuple[Params, Figures]:
        return self.best, self.predict(records, self.best)


def window(p99_ms: float, n: int = 400, start: float = 0.0) -> list[Record]:
    """A 10 s window of n answers from ``start``, all taking ``p99_ms`` (its P99)."""
    return [
        {"model": "m", "status": 200, "latency_ms": p99_ms, "unix_s": start + 10.0 * i / n}
        for i in range(n)
    ]


def policy() -> WatchPolicy:
    return WatchPolicy(slo_ms={"m": 1000.0}, window_s=10.0)


def test_live_figures() -> None:
    recs = [{"model": "m", "status": 200, "latency_ms": float(i)} for i in range(1, 101)]
    recs.append({"model": "m", "status": 503, "latency_ms": 1.0})
    f = live_figures(recs, {"m": 50.0}, 10.0)
    assert f.answered == 100
    assert f.goodput_rps == 5.0
    assert f.p99_ms is not None and 99.0 <= f.p99_ms <= 100.0


def test_applies_with_margin_then_keeps() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 50}), policy()
    ev = pol.step(gw, sim, window(100.0), 1.0)
    assert ev.action == "apply" and gw.version == 2
    ev = pol.step(gw, sim, window(52.0), 2.0)  # live agrees with the prediction
    assert ev.action == "keep" and gw.calls == ["put"]


def test_no_change_without_margin() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 95}), policy()
    assert pol.step(gw, sim, window(100.0), 1.0).action == "hold"
    assert gw.calls == []


def test_own_change_contradicted_is_rolled_back_and_not_reapplied() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 50}), policy()
    assert pol.step(gw, sim, window(100.0), 1.0).action == "apply"
    # live 70 ms > 1.15 x 50 ms predicted (calibration 1.0): rolled back in this window
    ev = pol.step(gw, sim, window(70.0), 2.0)
    assert ev.action == "rollback"
    assert gw.calls == ["put", "rollback->1"]
    assert gw.history[-1]["params"] == {"w": 100}
    # the same candidate is not applied again during the cooldown: no oscillation
    for k in range(pol.cooldown_windows):
        assert pol.step(gw, sim, window(100.0), 3.0 + k).action == "hold"
    assert gw.calls == ["put", "rollback->1"]


def test_external_bad_change_rolled_back_within_one_window() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 100}), policy()
    assert pol.step(gw, sim, window(100.0), 1.0).action == "hold"
    gw._new({"w": 100, "bad": True}, at=10.0)  # pushed by someone else at the window's start
    ev = pol.step(gw, sim, window(300.0, start=10.0), 2.0)  # live 3x worse under it
    assert ev.action == "rollback"
    assert gw.history[-1]["params"] == {"w": 100}


def test_external_change_late_in_a_window_judged_over_the_next() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 100}), policy()
    assert pol.step(gw, sim, window(100.0), 1.0).action == "hold"
    gw._new({"w": 100, "bad": True}, at=18.0)  # 2 s before the window ends
    assert pol.step(gw, sim, window(100.0, start=10.0), 2.0).action == "noticed"
    assert pol.step(gw, sim, window(300.0, start=20.0), 3.0).action == "rollback"
    assert gw.history[-1]["params"] == {"w": 100}


def test_external_good_change_kept() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 100}), policy()
    assert pol.step(gw, sim, window(100.0), 1.0).action == "hold"
    gw._new({"w": 100, "other": 1}, at=10.0)
    assert pol.step(gw, sim, window(90.0, start=10.0), 2.0).action == "keep"
    assert gw.calls == []


def test_calibration_scales_the_guardrail() -> None:
    # live runs 2x the simulator: a change predicted 50 ms is fine at 100 ms live
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 50}), policy()
    assert pol.step(gw, sim, window(200.0), 1.0).action == "apply"
    assert pol.calibration == 2.0
    assert pol.step(gw, sim, window(105.0), 2.0).action == "keep"


def test_too_few_requests_decide_nothing() -> None:
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 10}), policy()
    assert pol.step(gw, sim, window(100.0, n=50), 1.0).action == "skip"
    assert gw.calls == []


def test_run_watch_windows_with_a_fake_clock() -> None:
    t = [0.0]
    gw, sim, pol = FakeGateway({"w": 100}), FakeSim({"w": 100}), policy()
    events = run_watch(
        gw,
        sim,
        pol,
        now=lambda: t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
        windows=3,
    )
    assert [e.action for e in events] == ["skip"] * 3  # the fake log is empty
    assert t[0] == 30.0


# -- the simulator behind the protocol ---------------------------------------------------------
def test_sim_predictor_replays_a_recorded_window(tmp_path: Path) -> None:
    sc = toy_scenario(
        tmp_path,
        duration_s=3,
        warmup_s=0.5,
        arms={"qa": {"routing": "queue-aware", "batching": FW}},
    )
    loaded = load_scenario(write_scenario(tmp_path, sc))
    rng = random.Random(5)
    t, records = 1_700_000_000.0, []
    while len(records) < 600:
        t += rng.expovariate(300.0)
        m = "fast" if rng.random() < 0.9 else "slow"
        records.append({"model": m, "unix_s": t, "t_s": 99.0, "status": 200, "latency_ms": 5.0})
    pred = SimPredictor(loaded, "qa", budget=3, seed=1)
    cur = current_params(loaded.scenario, "qa")
    assert cur is not None
    f = pred.predict(records, cur)
    assert f.answered == 600 and f.p99_ms is not None and f.p99_ms > 0
    assert pred.predict(records, cur) is f  # one simulation per window and set
    long_windows = {
        **cur,
        "batching_per_model": {
            m: {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 40.0}
            for m in ("fast", "slow")
        },
    }
    slow = pred.predict(records, long_windows)
    assert slow.p99_ms is not None and slow.p99_ms > f.p99_ms  # 40 ms windows cost latency
    best, best_fig = pred.tune(records, cur)
    assert set(best) >= {"routing", "batching_per_model", "class_headroom"}
    assert best_fig.p99_ms is not None and best_fig.p99_ms <= f.p99_ms
    assert pred.evaluations == 2 + 3
    # Replaying with the learned profiles: d0 measured 3x slower than its profile.
    pred.observe_devices({"d0": {"fast": 3.0, "slow": 3.0}, "d1": {}})
    assert pred.learned_slowdown == {"d0": 3.0}
    assert pred.loaded.scenario.devices[0].slowdown == 3.0
    assert pred.loaded.scenario.devices[1].slowdown == 1.0
    slower = pred.predict(records, cur)
    assert slower.p99_ms is not None and slower.p99_ms > f.p99_ms


def test_a_refused_push_is_an_error_event_and_the_loop_goes_on() -> None:
    class Busy(FakeGateway):
        def put_params(self, params: Params, expected_version: int, note: str) -> dict[str, Any]:
            raise ParamsAPIError(409, "expected_version: 1 is not the current version")

        def pull_log(self, since_unix_s: float) -> list[Record]:
            return window(100.0, start=since_unix_s)

    t = [0.0]
    gw, sim, pol = Busy({"w": 100}), FakeSim({"w": 50}), policy()
    events = run_watch(
        gw, sim, pol, now=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s), windows=2
    )
    assert [e.action for e in events] == ["error", "error"]
    assert "409" in events[0].reason and pol.pending is None
