"""The placement controller: pure, times given as numbers."""

from __future__ import annotations

import math

import pytest

import tests.placement_policies  # noqa: F401  (registers the test policies)
from evenserve.policy.placement import (
    AUTOSCALING,
    LOADING,
    PLACEMENT,
    READY,
    UNLOADING,
    Action,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    ScaleDown,
    ScaleUp,
    Unload,
)
from evenserve.policy.placement.controller import PlacementController

GIB = 2.0**30


def infos() -> dict[str, ModelInfo]:
    return {
        m: ModelInfo(m, w * GIB, cold_load_s=2.0, warm_load_s=0.5, batch_s=0.01, max_batch_size=8)
        for m, w in (("a", 4), ("b", 6), ("c", 6), ("d", 2))
    }


def controller(
    devices: list[DeviceView] | None = None, host_gib: float = 0.0, **kw: object
) -> PlacementController:
    devs = devices or [
        DeviceView("d0", 12 * GIB, {"a": READY, "b": READY}),
        DeviceView("d1", 12 * GIB, {}),
    ]
    return PlacementController(
        infos(),
        devs,
        PLACEMENT.build("test-fit-or-evict"),
        host_memory_bytes=host_gib * GIB,
        **kw,  # type: ignore[arg-type]
    )


def test_a_miss_loads_where_it_fits_and_later_misses_go_to_the_loading_host() -> None:
    c = controller()
    dev, actions = c.route_miss("c", 1.0)
    assert (dev, actions) == ("d1", [Load("c", "d1")])
    assert c.devices["d1"].models == {"c": LOADING}
    assert c.load_seconds(Load("c", "d1")) == 2.0  # cold
    assert c.route_miss("c", 1.5) == ("d1", [])  # loading there: no second load
    c.load_done("c", "d1", 3.0)
    assert c.ready_models("d1") == ["c"]
    assert c.counts.loads == 1 and c.counts.cold_loads == 1


def test_a_load_that_needs_room_waits_for_its_unloads() -> None:
    c = controller([DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})])
    c.sent("b", "d0", 0.5)  # b is busy: a (idle) is the one to go
    dev, actions = c.route_miss("c", 1.0)
    assert dev == "d0"
    assert actions == [Unload("a", "d0")]  # the load waits: a still holds its memory
    assert c.devices["d0"].models == {"a": UNLOADING, "b": READY, "c": LOADING}
    assert c.counts.evictions == 1 and c.counts.loads == 0
    assert c.route_miss("c", 1.005) == ("d0", [])
    assert c.unload_done("a", "d0", 1.01) == [Load("c", "d0")]
    assert c.devices["d0"].models == {"b": READY, "c": LOADING}
    assert c.counts.loads == 1


def test_unload_done_needs_an_unloading_model() -> None:
    c = controller()
    with pytest.raises(ValueError, match="not unloading"):
        c.unload_done("a", "d0", 0.0)


def test_the_warm_pool_keeps_the_most_recent_within_host_memory() -> None:
    c = controller([DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})], host_gib=10.0)
    assert c.route_miss("d", 1.0) == ("d0", [Load("d", "d0")])  # 2 GiB: fits
    assert c.warm == ["d"]  # a load from disk passes through host memory
    c.load_done("d", "d0", 3.0)
    c.sent("b", "d0", 3.0)  # b is busy; a and d are idle
    dev, acts = c.route_miss("c", 4.0)  # 6 GiB: a and d must go
    assert (dev, acts) == ("d0", [Unload("a", "d0"), Unload("d", "d0")])
    assert c.unload_done("a", "d0", 4.01) == []  # not room enough yet
    assert c.warm == ["d", "a"]
    assert c.unload_done("d", "d0", 4.01) == [Load("c", "d0")]
    assert c.load_seconds(Load("c", "d0")) == 2.0  # c was cold
    # c (6) came through host memory: over 10 GiB the least recently used (a) went cold.
    assert c.warm == ["d", "c"]
    c.load_done("c", "d0", 6.0)
    c.done("b", "d0", 1, 6.0)
    c.sent("c", "d0", 6.0)
    _, acts = c.route_miss("d", 7.0)  # d is warm now...
    assert acts == [Unload("b", "d0")]  # ...but its load waits for b's unload
    assert c.unload_done("b", "d0", 7.01) == [Load("d", "d0")]
    # b (6) landed in host memory first and pushed d out: warm or cold is decided when the
    # load starts.
    assert c.warm == ["b", "d"]  # and c, the least recent, went cold
    assert c.load_seconds(Load("d", "d0")) == 2.0
    assert c.counts.warm_loads == 0 and c.counts.cold_loads == 3


def test_warm_pool_capacity_zero_keeps_nothing_and_warm_loads_are_faster() -> None:
    c = controller(host_gib=0.0)
    c.route_miss("c", 0.0)
    assert c.warm == []
    c2 = controller(host_gib=100.0)
    c2.sent("a", "d0", 0.0)
    c2.done("a", "d0", 1, 0.1)
    c2.route_miss("c", 0.0)  # cold, goes warm
    c2.load_done("c", "d1", 2.0)
    assert c2.warm == ["c"]
    assert c2.load_seconds(Load("c", "d1")) == 2.0
    # Unloaded (as a policy's rebalance would ask) and asked for again: a warm load.
    c2._apply([Unload("c", "d1")], 3.0, "rebalance")
    c2.unload_done("c", "d1", 3.01)
    assert c2.route_miss("c", 4.0) == ("d1", [Load("c", "d1")])
    assert c2.load_seconds(Load("c", "d1")) == 0.5
    assert c2.counts.warm_loads == 1


def test_the_rate_estimate_follows_arrivals() -> None:
    c = controller(rate_tau_s=1.0)
    for k in range(200):
        c.arrival("a", k * 0.1)  # 10 per second for 20 s
    assert c.rate_rps("a", 19.9) == pytest.approx(10.0, rel=0.1)
    assert c.rate_rps("a", 29.9) < 0.01  # decays once arrivals stop
    assert c.rate_rps("b", 19.9) == 0.0
    assert c.view(19.9).rate_rps["a"] == pytest.approx(c.rate_rps("a", 19.9))


class _Bad:
    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        return [Load(model, "d0")]  # d0 is full

    def rebalance(self, view: ClusterView) -> list[Action]:
        return [Unload("b", "d0")]


def test_a_policy_answer_check_actions_refuses_is_raised() -> None:
    c = PlacementController(infos(), [DeviceView("d0", 10 * GIB, {"a": READY, "b": READY})], _Bad())
    with pytest.raises(PlacementError, match="on_miss"):
        c.route_miss("c", 0.0)
    c.sent("b", "d0", 0.0)  # outstanding: b may not be unloaded
    with pytest.raises(PlacementError, match="rebalance"):
        c.tick(0.0)


def test_outstanding_and_last_use_follow_sent_and_done() -> None:
    c = controller()
    c.sent("a", "d0", 1.0)
    c.sent("a", "d0", 2.0)
    assert c.devices["d0"].outstanding == {"a": 2}
    assert c.devices["d0"].last_used_s == {"a": 2.0}
    c.done("a", "d0", 2, 3.0)
    assert c.devices["d0"].outstanding == {}
    with pytest.raises(ValueError, match="more done than sent"):
        c.done("a", "d0", 1, 3.0)


def test_tick_runs_every_interval_and_scale_actions_are_sequenced() -> None:
    devs = [
        DeviceView("d0", 12 * GIB, {"a": READY}),
        DeviceView("s0", 12 * GIB, active=False),
    ]
    scaler = AUTOSCALING.build(
        {"policy": "test-scheduled", "up": ["s0"], "up_at_s": 1.0, "down": ["s0"], "down_at_s": 5.0}
    )
    c = PlacementController(
        infos(), devs, PLACEMENT.build("test-fit-or-evict"), scaler, interval_s=1.0
    )
    assert c.tick(0.0) == []
    assert c.tick(0.5) == []  # not yet an interval
    assert c.tick(1.0) == [ScaleUp("s0")]
    assert c.tick(2.0) == []  # starting: not asked twice
    assert c.starting == {"s0"} and not c.devices["s0"].active
    c.device_ready("s0", 2.5)
    assert c.devices["s0"].active
    assert c.route_miss("c", 3.0) == ("d0", [Load("c", "d0")])
    dev, _ = c.route_miss("b", 3.0)
    assert dev == "s0"
    c.load_done("b", "s0", 5.0)
    assert c.tick(5.0) == [ScaleDown("s0")]
    assert not c.devices["s0"].active
    assert c.tick(6.0) == []  # stopping: not asked twice
    c.device_stopped("s0", 6.5)
    assert c.devices["s0"].models == {}
    assert c.counts.scale_ups == 1 and c.counts.scale_downs == 1
    assert math.isfinite(c.interval_s)


def test_the_schedule_is_fixed_a_late_tick_does_not_push_the_next() -> None:
    c = controller(interval_s=1.0)
    assert c.next_rebalance_s == 0.0 and c.started_s is None
    c.tick(10.0)  # the first: the schedule starts here
    assert c.next_rebalance_s == 11.0 and c.started_s == 10.0
    c.tick(11.003)  # a driver's call 3 ms late
    assert c.next_rebalance_s == 12.0  # not 12.003: a call at 12.0 still rebalances
    c.tick(15.5)  # whole periods late: again from then
    assert c.next_rebalance_s == 16.5
    # A replay: estimates started before the first event, the next rebalance set.
    r = controller(interval_s=1.0)
    r.start(-2.5)
    r.arrival("a", 0.1)
    assert r.started_s == -2.5
    r.schedule(0.4, 0.4)
    assert (r.next_rebalance_s, r.next_scale_s) == (0.4, 0.4)
    r.tick(0.3)  # not due yet
    assert r.next_rebalance_s == 0.4
    r.tick(0.4)
    assert r.next_rebalance_s == 1.4


class _Script:
    """A policy that answers what it is given: on_miss and rebalance from lists."""

    def __init__(self, miss: list[Action], rebalance: list[list[Action]]) -> None:
        self.miss = miss
        self.rebalances = rebalance

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        return self.miss

    def rebalance(self, view: ClusterView) -> list[Action]:
        return self.rebalances.pop(0) if self.rebalances else []


def test_unloading_a_load_that_never_started_just_forgets_it() -> None:
    policy = _Script([Unload("a", "d0"), Load("c", "d0")], [[Unload("c", "d0")]])
    c = PlacementController(infos(), [DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})], policy)
    assert c.route_miss("c", 0.0) == ("d0", [Unload("a", "d0")])  # c waits for a
    assert c.tick(0.0) == []  # c's load is dropped before it started: nothing to carry out
    assert c.devices["d0"].models == {"a": UNLOADING, "b": READY}
    assert c.unload_done("a", "d0", 0.01) == []  # no load waits any more
    assert c.counts.loads == 0 and c.counts.evictions == 2


def test_the_demand_estimate_reads_a_steady_rate_from_the_start() -> None:
    # 10 req/s from t = 0: a raw decaying count over tau = 10 s would read 10 x (1 - e^-0.2)
    # = 1.8 req/s after 2 s; corrected for the estimator's start it reads about 10.
    c = controller()
    for k in range(20):
        c.arrival("a", k * 0.1)
    assert c.rate_rps("a", 2.0) == pytest.approx(10.0, rel=0.1)
    assert c.view(2.0).rate_rps["a"] == c.rate_rps("a", 2.0)
    assert c.rate_rps("b", 2.0) == 0.0  # never asked for
    # long after the start the correction fades: the plain estimate
    later = controller()
    later.arrival("b", 0.0)
    for k in range(1000):
        later.arrival("a", 100.0 + k * 0.1)
    raw = later._rates["a"].rate_at(200.0)
    assert later.rate_rps("a", 200.0) == pytest.approx(raw, rel=1e-6)


# -- a lost device, and the workers' indexes ------------------------------------------------


def test_a_lost_device_s_residents_leave_and_its_model_misses_onto_another_device() -> None:
    c = controller(host_gib=100.0)  # d0: a (4), b (6) of 12 GiB; d1 empty
    c.sent("a", "d0", 0.5)  # a request in flight when the worker dies
    assert c.route_miss("c", 1.0) == ("d1", [Load("c", "d1")])
    assert c.device_lost("d0", 2.0) == []  # nothing was loading there
    assert c.lost == {"d0"} and not c.devices["d0"].active
    assert c.devices["d0"].models == {}
    assert [d.name for d in c.view(2.0).devices] == ["d1"]  # out of the view
    assert c.warm == ["c"]  # c passed through host memory; d0's models did not go warm
    c.done("a", "d0", 1, 2.1)  # the request sent before is still answered (failed)
    # a had no other replica: a miss again, placed on d1 (c 6 + a 4 <= 12)
    assert c.route_miss("a", 3.0) == ("d1", [Load("a", "d1")])
    assert c.counts.lost == 1
    assert c.device_lost("d0", 3.0) == []  # lost once
    assert c.counts.lost == 1


def test_a_lost_device_s_loads_are_returned_and_their_load_done_changes_nothing() -> None:
    c = controller(
        [DeviceView("d0", 12 * GIB, {"a": READY, "b": READY}), DeviceView("d1", 6 * GIB)]
    )
    c.sent("b", "d0", 0.5)
    assert c.route_miss("c", 1.0) == ("d1", [Load("c", "d1")])  # started
    assert c._apply([Unload("a", "d0"), Load("c", "d0")], 1.0, "rebalance") == [Unload("a", "d0")]
    assert c.devices["d0"].models == {"a": UNLOADING, "b": READY, "c": LOADING}  # c waits
    assert c.device_lost("d1", 1.5) == ["c"]
    assert c.device_lost("d0", 1.5) == ["c"]  # waiting for room: forgotten too
    c.load_done("c", "d1", 3.0)
    assert c.devices["d1"].models == {} and c.devices["d0"].models == {}
    assert c.route_miss("c", 3.0) == (None, [])  # no device left


def test_a_lost_device_comes_back_with_device_ready_and_is_not_scaled() -> None:
    devs = [DeviceView("d0", 12 * GIB, {"a": READY}), DeviceView("d1", 12 * GIB, {"b": READY})]
    scaler = AUTOSCALING.build({"policy": "demand", "up_after_s": 0.0, "min_devices": 2})
    c = PlacementController(infos(), devs, PLACEMENT.build("test-fit-or-evict"), scaler)
    c.device_lost("d1", 1.0)
    assert c.tick(1.0) == []  # min_devices 2, one active: but the lost one is not turned on
    assert c._scale(ScaleUp("d1")) is False and c._scale(ScaleDown("d1")) is False
    c.device_ready("d1", 2.0)
    assert c.lost == frozenset() and c.devices["d1"].active
    assert c.devices["d1"].models == {}  # what its index says comes with reconcile
    assert c.reconcile("d1", {"b": "READY"}, 2.1) == []
    assert c.ready_models("d1") == ["b"]


def test_a_stopping_or_starting_device_is_not_lost() -> None:
    devs = [DeviceView("d0", 12 * GIB, {"a": READY}), DeviceView("s0", 12 * GIB, active=False)]
    scaler = AUTOSCALING.build({"policy": "test-scheduled", "up": ["s0"], "up_at_s": 1.0})
    c = PlacementController(infos(), devs, PLACEMENT.build("test-fit-or-evict"), scaler)
    assert c.tick(1.0) == [ScaleUp("s0")]
    assert c.device_lost("s0", 1.5) == []  # starting: not lost
    assert c.lost == frozenset() and c.starting == {"s0"}
    c2 = controller()
    c2._scale(ScaleDown("d1"))
    assert c2.device_lost("d1", 1.0) == [] and c2.lost == frozenset()


def test_reconcile_adopts_a_hand_loaded_model_and_drops_one_unloaded_by_hand() -> None:
    c = controller()  # d0: a, b READY; d1 empty
    assert c.reconcile("d1", {"d": "READY", "zz": "READY", "c": "LOADING"}, 1.0) == []
    assert c.devices["d1"].models == {"d": READY}  # zz is not in the catalogue, c not READY
    assert c.counts.adopted == 1
    # b unloaded by hand: absent from d0's index; a LOADING there (a change under way): kept
    assert c.reconcile("d0", {"a": "LOADING"}, 2.0) == []
    assert c.devices["d0"].models == {"a": READY}
    assert c.reconcile("d0", {"a": "UNAVAILABLE"}, 2.0) == []
    assert c.devices["d0"].models == {}
    assert c.counts.dropped == 2
    assert c.warm == []  # neither went warm
    # the same index again changes nothing
    assert c.reconcile("d1", {"d": "READY"}, 3.0) == []
    assert c.counts.adopted == 1


def test_reconcile_leaves_the_driver_s_own_loads_and_unloads_alone() -> None:
    c = controller([DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})])
    c.sent("b", "d0", 0.5)
    assert c.route_miss("c", 1.0) == (
        "d0",
        [Unload("a", "d0")],
    )  # a UNLOADING, c LOADING (waiting for a)
    # the index (with the driver's operations written over it) says a UNLOADING
    assert c.reconcile("d0", {"a": "UNLOADING", "b": "READY"}, 1.1) == []
    assert c.devices["d0"].models == {"a": UNLOADING, "b": READY, "c": LOADING}
    assert c.unload_done("a", "d0", 1.2) == [Load("c", "d0")]
    # c's load started: LOADING in the index (the driver's op) or absent, it stays
    assert c.reconcile("d0", {"b": "READY", "c": "LOADING"}, 1.3) == []
    assert c.devices["d0"].models == {"b": READY, "c": LOADING}


def test_a_waiting_load_found_ready_is_adopted_and_a_drop_starts_waiting_loads() -> None:
    c = controller([DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})])
    c.sent("b", "d0", 0.5)
    c.route_miss("c", 1.0)  # unload a, c waits
    # by hand: c loaded (the worker had room after all), a still there
    assert c.reconcile("d0", {"a": "UNLOADING", "b": "READY", "c": "READY"}, 1.1) == []
    assert c.devices["d0"].models == {"a": UNLOADING, "b": READY, "c": READY}
    assert c.counts.adopted == 1
    assert c.unload_done("a", "d0", 1.2) == []  # c's load is forgotten
    assert c.counts.loads == 0
    # a load waiting for room starts when reconcile drops what held the room
    c3 = PlacementController(
        infos(), [DeviceView("d0", 12 * GIB, {"a": READY, "b": READY})], _Script([], [])
    )
    c3._apply([Unload("a", "d0"), Load("c", "d0")], 1.0, "rebalance")  # c (6) waits for a (4)
    assert c3.reconcile("d0", {"b": "READY", "a": "UNLOADING"}, 1.1) == []
    c3.devices["d0"].models["a"] = READY  # as if the unload had been undone by hand
    assert c3.reconcile("d0", {"b": "READY"}, 1.2) == [Load("c", "d0")]  # a gone: c fits


def test_an_adopted_model_over_the_cap_is_kept_and_the_device_reads_full() -> None:
    c = controller()  # d0: a (4) + b (6) of 12 GiB
    assert c.reconcile("d0", {"a": "READY", "b": "READY", "c": "READY"}, 1.0) == []
    d0 = c.devices["d0"]
    assert d0.models == {"a": READY, "b": READY, "c": READY}
    assert d0.used_bytes(c.models) == 16 * GIB > d0.memory_total_bytes
    assert d0.free_bytes(c.models) == 0.0
    # a miss for d (2 GiB) goes to d1, not to the full d0
    assert c.route_miss("d", 2.0) == ("d1", [Load("d", "d1")])
    # on d0 a load is planned only once unloads bring it under the cap
    with pytest.raises(PlacementError, match="over"):
        c._check(c.view(4.0), [Unload("a", "d0"), Load("d", "d0")], "test")  # 6+6+2 > 12
    c._check(c.view(4.0), [Unload("a", "d0"), Unload("b", "d0"), Load("d", "d0")], "test")


def test_an_inactive_or_lost_device_is_not_reconciled() -> None:
    c = controller()
    c.device_lost("d1", 1.0)
    assert c.reconcile("d1", {"c": "READY"}, 1.1) == []
    assert c.devices["d1"].models == {}
    c._scale(ScaleDown("d0"))  # stopping
    assert c.reconcile("d0", {}, 1.2) == []
    assert c.devices["d0"].models == {"a": READY, "b": READY}


def test_cost_aware_keeps_the_configured_replicas_until_its_estimates_have_observed() -> None:
    # A gateway started before its traffic: the layout holds "a" on both devices. Its first
    # rebalances read every rate as 0 over a second or two of observation: no evidence, so
    # no replica is removed (before the rule, the first tick took "a" off d0).
    c = PlacementController(
        infos(),
        [DeviceView("d0", 12 * GIB, {"a": READY}), DeviceView("d1", 12 * GIB, {"a": READY})],
        PLACEMENT.build("cost-aware", {"hold_s": 10.0}),
    )
    assert c.tick(100.0) == []
    assert c.view(100.0).observed_s == 0.0
    assert c.tick(101.0) == []
    assert c.tick(109.0) == []
    assert c.view(109.5).observed_s == 9.5
    # After hold_s of observation with no request, the second replica has no demand.
    assert c.tick(110.0) == [Unload("a", "d0")]
    assert [(d.source, d.kind, d.model) for d in c.counts.decisions] == [
        ("rebalance", "unload", "a")
    ]


def test_a_view_built_by_hand_counts_as_observed_long_enough() -> None:
    v = ClusterView(0.0, infos(), [DeviceView("d0", 12 * GIB, {})])
    assert v.observed_s == math.inf
    c = controller()
    assert c.view(5.0).observed_s == 0.0  # nothing seen, no tick: not started
    c.arrival("a", 5.0)
    assert c.view(7.5).observed_s == 2.5
