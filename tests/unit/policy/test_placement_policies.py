"""Placement policies' decisions on hand-built views, and their properties on random runs."""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from evenserve.policy.placement import (
    LOADING,
    PLACEMENT,
    READY,
    UNLOADING,
    ClusterView,
    DeviceView,
    Load,
    PlacementPolicy,
    Unload,
    check_actions,
)
from evenserve.policy.placement.cost_aware import eviction_cost
from evenserve.policy.registry import PolicySpecError

from .placement_helpers import GIB, device, model, step


def build(spec: object) -> PlacementPolicy:
    policy = PLACEMENT.build(spec)
    assert isinstance(policy, PlacementPolicy)
    return policy


MODELS = {
    m.name: m
    for m in (
        model("big", 8),
        model("s1", 4),
        model("s2", 4),
        model("new", 4),
        model("wide", 8),
        model("hot", 2),
    )
}


def cluster(
    devices: list[DeviceView], rate: dict[str, float] | None = None, now_s: float = 100.0
) -> ClusterView:
    return ClusterView(now_s, MODELS, devices, rate or {})


# -- static ----------------------------------------------------------------------------


def test_static_fills_the_device_with_most_free_memory_and_never_evicts() -> None:
    v = cluster([device("d0", 16, ["s1"]), device("d1", 16, ["big"]), device("d2", 24, ["big"])])
    policy = build("static")
    assert policy.on_miss("new", v) == [Load("new", "d2")]  # 16 free, against 12 and 8
    full = cluster([device("d0", 8, ["s1", "s2"]), device("d1", 8, ["big"])])
    assert policy.on_miss("new", full) == []
    assert policy.on_miss("s1", full) == []  # already hosted: nothing to do
    assert policy.rebalance(cluster([device("d0", 16, ["s1", "s2", "big"])], {"s1": 100})) == []


def test_a_device_that_is_off_takes_no_load() -> None:
    v = cluster([device("d0", 16, ["big"]), device("off", 24, active=False)])
    assert build("static").on_miss("new", v) == [Load("new", "d0")]


# -- lru -------------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used_and_skips_busy_and_loading_models() -> None:
    d0 = device(
        "d0",
        12,
        {"s1": READY, "s2": READY, "hot": LOADING},
        used={"s1": 50.0, "s2": 90.0, "hot": 10.0},
    )
    v = cluster([d0])
    assert build("lru").on_miss("new", v) == [Unload("s1", "d0"), Load("new", "d0")]
    d0.outstanding["s1"] = 1  # s1 is busy: s2 goes although it was used later
    assert build("lru").on_miss("new", v) == [Unload("s2", "d0"), Load("new", "d0")]
    d0.outstanding["s2"] = 3  # nothing evictable is left (hot is still loading)
    assert build("lru").on_miss("new", v) == []


def test_lru_takes_the_device_needing_fewest_evictions_then_most_free_memory() -> None:
    one = device("one", 12, ["s1", "s2"], used={"s1": 1.0, "s2": 2.0})  # 4 free: evict 1
    two = device("two", 13, ["hot", "s2"], used={"hot": 0.0, "s2": 0.0})  # 7 free: evict 1
    none = device("none", 8, ["hot"])  # 6 free
    policy = build("lru")
    assert policy.on_miss("wide", cluster([one, two])) == [
        Unload("hot", "two"),
        Load("wide", "two"),
    ]  # both need one eviction (hot before s2 on a tie: name); two has 1 GiB left, one 0
    # new fits everywhere as it is: the most free memory after the load (3 GiB on two)
    assert policy.on_miss("new", cluster([one, two, none])) == [Load("new", "two")]
    assert policy.on_miss("new", cluster([one, none])) == [Load("new", "none")]


def test_lru_idle_eviction_is_off_by_default_and_spares_what_it_just_loaded() -> None:
    d0 = device("d0", 16, ["s1", "s2"], used={"s1": 10.0, "s2": 95.0})
    v = cluster([d0], now_s=100.0)
    assert build("lru").rebalance(v) == []
    policy = build({"policy": "lru", "idle_evict_s": 30})
    assert policy.rebalance(v) == [Unload("s1", "d0")]  # idle 90 s; s2 only 5 s
    loaded = step(v, policy.on_miss("new", v), 100.0)
    later = step(loaded, [], 120.0)  # new is READY, never used yet: loaded 20 s ago
    assert Unload("new", "d0") not in policy.rebalance(later)
    assert Unload("new", "d0") in policy.rebalance(step(later, [], 131.0))


def test_lru_adds_copies_as_modelmesh_does_and_removes_them_with_hysteresis() -> None:
    policy = build({"policy": "lru", "scaleup_rps_per_copy": 10, "hold_s": 5})
    hot = device("d0", 16, ["hot", "big"], used={"hot": 99.0, "big": 1.0})
    others = [
        device(f"d{i}", 4, [m], used={m: 50.0 + i}) for i, m in enumerate(["s1", "s2", "new"], 1)
    ]
    v = cluster([hot, *others], {"hot": 35.0}, now_s=100.0)
    # 35 req/s on one copy: floor(35 / 10) = 3 more, capped at max(2, 4 // 3) = 2 per call,
    # each on a device without it (the fewest evictions, the most free memory after, then
    # name), evicting its least recently used model to make room
    acts = policy.rebalance(v)
    assert acts == [Unload("s1", "d1"), Load("hot", "d1"), Unload("s2", "d2"), Load("hot", "d2")]
    v = step(v, acts, 101.0)
    assert policy.rebalance(v) == []  # held: the copy count changed 1 s ago
    v = step(v, [], 106.0)  # 35 / 3 = 11.7 > 10: one more, on the last device without it
    acts = policy.rebalance(v)
    assert acts == [Unload("new", "d3"), Load("hot", "d3")]
    v = step(step(v, acts, 106.0), [], 112.0)
    # the rate falls: 12 / 3 = 4 per copy with one fewer is under 0.5 * 10: the least recently
    # used copy goes (d0's, last used at 99 s), then one per hold
    calm = ClusterView(112.0, v.models, v.devices, {"hot": 16.0})
    assert policy.rebalance(calm) == []  # 16 / 3 = 5.3 >= 5: all four stay
    calm = ClusterView(112.0, v.models, v.devices, {"hot": 12.0})
    assert policy.rebalance(calm) == [Unload("hot", "d0")]
    calm = ClusterView(113.0, v.models, v.devices, {"hot": 1.0})
    assert policy.rebalance(calm) == []  # held
    assert build({"policy": "lru", "scaleup_rps_per_copy": None}).rebalance(v) == []


# -- cost-aware ------------------------------------------------------------------------


def test_the_cost_of_an_eviction_is_the_unserved_rate_times_the_load_time() -> None:
    d0 = device("d0", 24, ["s1", "s2"])
    d1 = device("d1", 24, ["s2"])
    v = ClusterView(0.0, MODELS, [d0, d1], {"s1": 6.0, "s2": 6.0}, warm=frozenset({"s1"}))
    assert eviction_cost(v, "s1", "d0") == pytest.approx(6.0 * 1.0)  # warm: 1 s to reload
    assert eviction_cost(v, "s2", "d0") == 0.0  # d1 carries 6 of its 10 req/s
    v.rate_rps = {"s2": 13.0}
    assert eviction_cost(v, "s2", "d0") == pytest.approx(3.0 * 4.0)  # 3 req/s over d1, cold
    d1.models["s2"] = LOADING  # a loading replica serves nothing yet
    assert eviction_cost(v, "s2", "d0") == pytest.approx(13.0 * 4.0)


def test_recency_and_cost_disagree_lru_evicts_busy_small_models_cost_aware_the_idle_one() -> None:
    """The ModelMesh complaint: an 8 GiB load evicts the two small models that serve all the
    traffic because they were used a moment before the idle large one."""
    used = {"s1": 97.0, "s2": 98.0, "big": 99.0}
    d0 = device("d0", 16, ["s1", "s2", "big"], used=used)
    v = cluster([d0], {"s1": 5.0, "s2": 5.0, "big": 0.0})
    assert build("lru").on_miss("wide", v) == [
        Unload("s1", "d0"),
        Unload("s2", "d0"),
        Load("wide", "d0"),
    ]
    assert build("cost-aware").on_miss("wide", v) == [Unload("big", "d0"), Load("wide", "d0")]
    assert build("lru").on_miss("new", v) == [Unload("s1", "d0"), Load("new", "d0")]
    assert build("cost-aware").on_miss("new", v) == [Unload("big", "d0"), Load("new", "d0")]


def test_cost_aware_frees_bytes_at_the_least_cost_per_byte_and_drops_needless_victims() -> None:
    # s1 (4 GiB, 1 req/s: cost 4) against big (8 GiB, 1.5 req/s: cost 6): per byte, big is
    # cheaper; once big is chosen s1 is not needed at all.
    d0 = device("d0", 16, ["s1", "big"])
    v = cluster([d0], {"s1": 1.0, "big": 1.5, "wide": 2.0})  # the miss is worth 2 * 4
    assert build("cost-aware").on_miss("wide", v) == [Unload("big", "d0"), Load("wide", "d0")]


def test_cost_aware_places_a_miss_where_evicting_costs_least_then_on_the_idler_device() -> None:
    a = device("a", 6, ["s1"], util=0.1)  # room for new only without s1: cost 2 * 4
    b = device("b", 6, ["s2"], util=0.5)  # without s2: cost 1 * 4
    c = device("c", 12, ["big"], util=0.9)
    v = cluster([a, b, c], {"s1": 2.0, "s2": 1.0, "new": 2.5})  # the miss is worth 10
    assert build("cost-aware").on_miss("new", v) == [Load("new", "c")]  # fits: no eviction
    v2 = cluster([a, b], {"s1": 2.0, "s2": 1.0, "new": 2.5})
    assert build("cost-aware").on_miss("new", v2) == [Unload("s2", "b"), Load("new", "b")]
    v3 = cluster([device("a", 8, util=0.6), device("b", 8, util=0.2)])
    assert build("cost-aware").on_miss("new", v3) == [Load("new", "b")]


def test_cost_aware_adds_a_replica_under_demand_and_removes_it_after_the_hold() -> None:
    policy = build("cost-aware")  # hold_s 10, target 0.7, low 0.3; hot serves 10 req/s
    d0 = device("d0", 16, ["hot"], util=0.8)
    d1 = device("d1", 16, ["s1"], util=0.2)
    d2 = device("d2", 16, ["big", "s2"], util=0.1)
    v = cluster([d0, d1, d2], {"hot": 9.0, "s1": 1.0}, now_s=0.0)
    up = policy.rebalance(v)  # 9 > 0.7 * 1 * 10: a replica, on the idlest device with room
    assert up == [Load("hot", "d2")]
    check_actions(v, up)
    v = step(v, up, 1.0)
    v.rate_rps = {"hot": 20.0}
    assert policy.rebalance(v) == []  # hot is still LOADING on d2: no third replica yet
    v = step(v, [], 2.0)  # READY: 20 > 0.7 * 2 * 10
    assert policy.rebalance(v) == [Load("hot", "d1")]
    v = step(step(v, [Load("hot", "d1")], 3.0), [], 4.0)
    v.rate_rps = {"hot": 0.5}  # 0.5 < 0.3 * 2 * 10: a replica too many, but one was added at 2
    assert policy.rebalance(v) == []
    v = step(v, [], 11.9)
    assert policy.rebalance(v) == []  # still within 10 s of that load
    v = step(v, [], 12.5)
    v.device("d0").outstanding["hot"] = 2  # busy: not that one; d1 is the busier of the others
    assert policy.rebalance(v) == [Unload("hot", "d1")]
    v = step(v, [Unload("hot", "d1")], 13.0)  # 0.5 < 0.3 * 1 * 10: d2 goes too
    assert policy.rebalance(v) == [Unload("hot", "d2")]
    v = step(v, [Unload("hot", "d2")], 14.0)
    v.device("d0").outstanding.clear()
    assert policy.rebalance(v) == []  # the last replica stays while there is demand
    v.rate_rps = {"hot": 20.0}  # a burst right after removing replicas: the count holds
    assert policy.rebalance(v) == []
    v = step(v, [], 22.8)  # d1's unload (12.5) is 10.3 s old, d2's (13) not yet 10
    assert policy.rebalance(v) == []  # the model's last removal (13) is within 10 s
    v = step(v, [], 23.0)
    assert policy.rebalance(v) == [Load("hot", "d2")]


def test_a_replica_evicts_only_models_without_demand() -> None:
    d0 = device("d0", 4, ["hot"])
    d1 = device("d1", 4, ["s1"])
    # hot overflows (10 > 0.7 * 10); s1 has demand (0.5 req/s >= idle_rps 0.1): it stays,
    # however small its cost, since it would miss and its reload evict another model.
    v = cluster([d0, d1], {"hot": 10.0, "s1": 0.5}, now_s=0.0)
    assert build("cost-aware").rebalance(v) == []
    v.rate_rps = {"hot": 10.0, "s1": 0.05}  # below idle_rps: no demand, its room is free
    assert build("cost-aware").rebalance(v) == [Unload("s1", "d1"), Load("hot", "d1")]


def test_cost_aware_does_not_undo_its_own_changes_within_the_hold() -> None:
    policy = build({"policy": "cost-aware", "hold_s": 10})
    d0 = device("d0", 6, ["s1"])  # evicting s1 costs 0.1 * 4
    d1 = device("d1", 6, ["s2"])  # s2: 0.2 * 4
    v = cluster([d0, d1], {"s1": 0.1, "s2": 0.2, "new": 1.0}, now_s=0.0)
    first = policy.on_miss("new", v)  # the miss is worth 1 * 4
    assert first == [Unload("s1", "d0"), Load("new", "d0")]
    v = step(step(v, first, 1.0), [], 2.0)  # new is READY on d0
    v.rate_rps = {"s1": 1.0, "s2": 0.2, "new": 1.0}  # s1 is asked for again: worth 4
    # another miss: it would be cheapest to evict new (no demand yet) but that was loaded 2 s
    # ago: s2 goes instead
    assert policy.on_miss("s1", v) == [Unload("s2", "d1"), Load("s1", "d1")]
    # with nothing else to evict a waiting request still gets the held model's room
    solo = cluster([device("d0", 8, {"new": READY, "hot": LOADING})], now_s=2.0)
    policy2 = build("cost-aware")
    assert policy2.on_miss("new", cluster([device("d0", 8, {"hot": LOADING})], now_s=0.0)) == [
        Load("new", "d0")
    ]
    assert policy2.on_miss("s1", solo) == [Unload("new", "d0"), Load("s1", "d0")]


def test_cost_aware_params_are_checked() -> None:
    with pytest.raises(PolicySpecError, match="low_utilization"):
        PLACEMENT.parse({"policy": "cost-aware", "low_utilization": 0.8})
    with pytest.raises(PolicySpecError, match="hold_s"):
        PLACEMENT.parse({"policy": "cost-aware", "hold_s": -1})
    with pytest.raises(PolicySpecError, match="idle_evict_s"):
        PLACEMENT.parse({"policy": "lru", "idle_evict_s": 0})


# -- properties ------------------------------------------------------------------------

NAMES = [f"m{i}" for i in range(6)]


@st.composite
def views(draw: st.DrawFn) -> ClusterView:
    sizes = draw(st.lists(st.integers(1, 10), min_size=2, max_size=6))
    models = {
        f"m{i}": model(
            f"m{i}",
            gb,
            cold_s=draw(st.floats(0.1, 10)),
            warm_s=0.1,
            cap_rps=draw(st.floats(1, 50)),
        )
        for i, gb in enumerate(sizes)
    }
    devices = []
    for k in range(draw(st.integers(1, 4))):
        total = draw(st.integers(4, 24))
        states: dict[str, str] = {}
        used = 0
        for m in draw(st.permutations(list(models))):
            gb = models[m].weights_bytes / GIB
            if used + gb <= total and draw(st.booleans()):
                states[m] = draw(st.sampled_from([READY, READY, LOADING, UNLOADING]))
                used += int(gb)
        devices.append(
            DeviceView(
                f"d{k}",
                total * GIB,
                states,
                last_used_s={m: draw(st.floats(0, 100)) for m in states},
                outstanding={m: draw(st.integers(0, 2)) for m in states},
                utilization=draw(st.floats(0, 1)),
                active=k == 0 or draw(st.booleans()),
            )
        )
    rates = {m: draw(st.sampled_from([0.0, 0.5, 3.0, 20.0, 80.0])) for m in models}
    return ClusterView(
        100.0, models, devices, rates, frozenset(draw(st.sets(st.sampled_from(list(models)))))
    )


@pytest.mark.parametrize(
    "spec",
    [
        "static",
        "lru",
        {"policy": "lru", "idle_evict_s": 5},
        {"policy": "lru", "idle_evict_s": 5, "scaleup_rps_per_copy": 1, "hold_s": 0},
        "cost-aware",
        {"policy": "cost-aware", "hold_s": 0},
    ],
)
@given(start=views(), data=st.data())
def test_every_action_list_of_a_run_is_valid(
    spec: object, start: ClusterView, data: st.DataObject
) -> None:
    policy = build(spec)
    v = start
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        now = v.now_s + data.draw(st.sampled_from([0.5, 3.0, 11.0]), label="dt")
        if data.draw(st.booleans(), label="miss?"):
            missed = data.draw(st.sampled_from(sorted(v.models)), label="model")
            actions = policy.on_miss(missed, v)
            check_actions(v, actions)
            if actions:
                assert actions[-1] == Load(missed, actions[-1].device)
                assert all(isinstance(a, Unload) for a in actions[:-1])
                assert not v.hosts(missed)
        else:
            actions = policy.rebalance(v)
            check_actions(v, actions)
        if spec == "static":
            assert not any(isinstance(a, Unload) for a in actions)
        v = step(v, actions, now)
        for d in v.devices:  # new requests arrive and finish: the outstanding counts move
            d.outstanding = {m: data.draw(st.integers(0, 1), label="out") for m in d.models}
            if d.models and data.draw(st.booleans(), label="used?"):
                d.last_used_s[data.draw(st.sampled_from(sorted(d.models)), label="used")] = now
        v.rate_rps = {
            m: r * data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]), label="rate")
            for m, r in v.rate_rps.items()
        } or dict(v.rate_rps)


def test_the_worked_example_of_the_design_note() -> None:
    """docs/design/0009-placement.md, "A worked example"."""

    def example() -> ClusterView:
        d0 = device("d0", 16, ["s1", "s2", "big"], used={"s1": 97.0, "s2": 98.0, "big": 99.0})
        d0.utilization = 0.5
        d1 = device("d1", 8, ["hot"], used={"hot": 99.9}, util=0.9)
        rates = {"s1": 5.0, "s2": 5.0, "big": 0.0, "hot": 12.0}
        return cluster([d0, d1, device("d2", 16, active=False)], rates)

    assert build("static").on_miss("wide", example()) == []
    assert build("lru").on_miss("wide", example()) == [Unload("hot", "d1"), Load("wide", "d1")]
    assert build("cost-aware").on_miss("wide", example()) == [
        Unload("big", "d0"),
        Load("wide", "d0"),
    ]
    assert build("cost-aware").rebalance(example()) == [Unload("big", "d0"), Load("hot", "d0")]
    assert build("lru").rebalance(example()) == build("static").rebalance(example()) == []


# -- cost-aware: no thrash -------------------------------------------------------------


def test_a_miss_is_refused_rather_than_evicting_models_worth_more_than_it() -> None:
    # d0 holds s1 and s2 (5 req/s each, cold 4 s: an eviction costs 20 requests). A miss
    # for new at 1 req/s is worth 1 x 4 = 4: refused (503), the autoscaler adds memory.
    d0 = device("d0", 8, ["s1", "s2"], used={"s1": 99.0, "s2": 99.5})
    v = cluster([d0], {"s1": 5.0, "s2": 5.0, "new": 1.0})
    policy = build("cost-aware")
    assert policy.on_miss("new", v) == []
    v.rate_rps = {"s1": 5.0, "s2": 5.0, "new": 6.0}  # worth 24 > 20: s1 (used least recently)
    first = policy.on_miss("new", v)
    assert first == [Unload("s1", "d0"), Load("new", "d0")]
    # s1 comes back asked for at 5 req/s (worth 20): neither new (24, and held) nor s2
    # (20, not below 20) is worth evicting for it: no ping-pong
    after = step(step(v, first, 100.0), [], 101.0)
    assert policy.on_miss("s1", after) == []


def test_a_miss_takes_free_memory_before_a_free_eviction() -> None:
    idle = device("d0", 8, ["big"], util=0.0)  # big has no demand: evicting it costs 0
    busy = device("d1", 8, ["s1"], util=0.5)  # 4 GiB free
    v = cluster([idle, busy], {"s1": 1.0, "new": 1.0})
    assert build("cost-aware").on_miss("new", v) == [Load("new", "d1")]


def test_a_busy_device_gets_a_replica_of_the_model_with_the_largest_share() -> None:
    # d0 over busy_utilization (0.85); per model neither s1 (2 of 10 req/s) nor s2 (5) is
    # over 0.7 of a replica, but the device is: s2, the larger share, gets a replica on d1.
    d0 = device("d0", 16, ["s1", "s2"], util=0.9)
    d1 = device("d1", 16, util=0.1)
    v = cluster([d0, d1], {"s1": 2.0, "s2": 5.0}, now_s=0.0)
    assert build("cost-aware").rebalance(v) == [Load("s2", "d1")]
    d1.utilization = 0.8  # the only other device is over target: a replica there won't help
    assert build("cost-aware").rebalance(v) == []
    d1.utilization, d0.utilization = 0.1, 0.8  # d0 below busy_utilization: nothing
    assert build("cost-aware").rebalance(v) == []


def test_a_miss_eviction_does_not_hold_the_models_replica_count() -> None:
    # hot has two replicas (9 req/s, 10 per replica): evicting one costs 0, and a miss for
    # new takes its room on d0. A second later hot, down to one replica, overflows it: the
    # eviction was a miss's, not a replica removed by rebalance, so it gets one (on d2, just
    # turned on), within hold_s of the eviction.
    policy = build("cost-aware")
    d0 = device("d0", 8, ["hot", "s1"])
    d1 = device("d1", 8, ["hot", "s2"])
    d2 = device("d2", 8, active=False)
    v = cluster([d0, d1, d2], {"hot": 9.0, "s1": 5.0, "s2": 5.0, "new": 3.0})
    first = policy.on_miss("new", v)
    assert first == [Unload("hot", "d0"), Load("new", "d0")]
    later = step(step(v, first, 100.5), [], 101.0)
    later.device("d2").active = True
    assert policy.rebalance(later) == [Load("hot", "d2")]


# -- the controller with lost devices and workers' indexes ----------------------------------

EVENTS = [
    "miss",
    "miss",
    "load",
    "unload",
    "done",
    "tick",
    "lost",
    "back",
    "reconcile",
    "ready",
    "stopped",
]


@pytest.mark.parametrize(
    ("spec", "scaler"),
    [
        ("static", None),
        ("lru", None),
        ({"policy": "lru", "idle_evict_s": 2}, {"policy": "demand", "up_after_s": 0}),
        ("cost-aware", None),
        ({"policy": "cost-aware", "hold_s": 0}, {"policy": "demand", "quiet_s": 0}),
    ],
)
@given(data=st.data())
def test_a_controller_run_with_lost_devices_and_hand_loads_keeps_its_invariants(
    spec: object, scaler: object, data: st.DataObject
) -> None:
    """Random runs of events (misses, loads and unloads done, ticks, scaling, devices lost
    and back, reconcile with arbitrary indexes) against a controller, carried out by a
    minimal driver: no PlacementError (the policies plan around an adopted overflow), no
    event but ``reconcile`` takes a device over its memory or further over it, a load
    starts only where everything resident fits, no (model, device) both loading and
    unloading, and every request waiting for a load on a lost device is answered."""
    from evenserve.policy.placement import AUTOSCALING, ScaleDown, ScaleUp
    from evenserve.policy.placement.controller import PlacementController

    sizes = data.draw(st.lists(st.sampled_from([2, 3, 4, 6, 8]), min_size=2, max_size=5))
    models = {f"m{i}": model(f"m{i}", gb) for i, gb in enumerate(sizes)}
    names = sorted(models)
    devices = []
    for k in range(data.draw(st.integers(2, 3), label="devices")):
        total = data.draw(st.sampled_from([8, 10, 16]), label="gib")
        on = k == 0 or data.draw(st.booleans(), label="on")
        here: dict[str, str] = {}
        used = 0
        for m in names if on else []:
            gb = int(models[m].weights_bytes / GIB)
            if used + gb <= total and data.draw(st.booleans(), label="resident"):
                here[m] = READY
                used += gb
        devices.append(DeviceView(f"d{k}", total * GIB, here, active=on))
    ctl = PlacementController(
        models,
        devices,
        build(spec),
        None if scaler is None else AUTOSCALING.build(scaler),
        host_memory_bytes=8 * GIB,
        interval_s=1.0,
    )
    dev = ctl.devices
    loads: set[tuple[str, str]] = set()  # started, not answered
    unloads: set[tuple[str, str]] = set()
    waiting: dict[tuple[str, str], int] = {}  # requests waiting for (model, device)'s load
    sent: list[tuple[str, str]] = []
    starting: set[str] = set()
    stopping: set[str] = set()

    def used(d: DeviceView) -> tuple[float, float]:
        """What the controller plans there (an UNLOADING model's memory free, as for
        check_actions) and what it holds (a load waiting for room not counted yet)."""
        pending = {p.model for p in ctl._pending[d.name]}
        w = {m: models[m].weights_bytes for m in d.models}
        planned = sum(b for m, b in w.items() if d.models[m] != UNLOADING)
        return planned, sum(b for m, b in w.items() if m not in pending)

    def carry(actions: list) -> None:  # type: ignore[type-arg]
        keys = {
            (a.model, a.device, type(a).__name__) for a in actions if isinstance(a, Load | Unload)
        }
        for m, d, _ in keys:
            assert not {(m, d, "Load"), (m, d, "Unload")} <= keys, "loaded and unloaded at once"
        for a in actions:
            if isinstance(a, Load):
                key = (a.model, a.device)
                assert key not in unloads and key not in loads
                here = dev[a.device]
                pending = {p.model for p in ctl._pending[a.device]}
                held = sum(models[m].weights_bytes for m in here.models if m not in pending)
                assert held <= here.memory_total_bytes, "a load started over the memory"
                loads.add(key)
            elif isinstance(a, Unload):
                unloads.add((a.model, a.device))
            elif isinstance(a, ScaleUp):
                starting.add(a.device)
            elif isinstance(a, ScaleDown):
                stopping.add(a.device)

    now = 0.0
    for _ in range(data.draw(st.integers(5, 40), label="steps")):
        now += data.draw(st.sampled_from([0.01, 0.3, 1.0, 3.0]), label="dt")
        before = {n: used(d) for n, d in dev.items()}
        kind = data.draw(
            st.sampled_from(EVENTS),
            label="event",
        )
        if kind == "miss":
            m = data.draw(st.sampled_from(names), label="model")
            ctl.arrival(m, now)
            ready = [n for n, d in dev.items() if d.active and d.models.get(m) == READY]
            if ready:
                ctl.sent(m, ready[0], now)
                sent.append((m, ready[0]))
            else:
                where, acts = ctl.route_miss(m, now)
                carry(acts)
                if where is not None:
                    assert where not in ctl.lost
                    waiting[(m, where)] = waiting.get((m, where), 0) + 1
        elif kind == "load" and loads:
            m, d = data.draw(st.sampled_from(sorted(loads)), label="load")
            loads.discard((m, d))
            ctl.load_done(m, d, now)
            if dev[d].models.get(m) == READY:
                for _ in range(waiting.pop((m, d), 0)):
                    ctl.sent(m, d, now)
                    sent.append((m, d))
        elif kind == "unload" and unloads:
            m, d = data.draw(st.sampled_from(sorted(unloads)), label="unload")
            unloads.discard((m, d))
            if dev[d].models.get(m) == UNLOADING:
                carry(ctl.unload_done(m, d, now))
        elif kind == "done" and sent:
            m, d = sent.pop(data.draw(st.integers(0, len(sent) - 1), label="which"))
            ctl.done(m, d, 1, now)
        elif kind == "tick":
            carry(ctl.tick(now))
        elif kind == "lost":
            on = sorted(n for n, d in dev.items() if d.active)
            if on:
                d = data.draw(st.sampled_from(on), label="lost")
                lost = ctl.device_lost(d, now)
                if lost:
                    event("a device lost while loading")
                assert d in ctl.lost and dev[d].models == {} and not dev[d].active
                assert d not in [v.name for v in ctl.view(now).devices]
                for m, dd in list(waiting):
                    if dd == d:  # every request waiting for a load there is answered now
                        assert m in lost
                        del waiting[(m, dd)]
                loads.difference_update({k for k in loads if k[1] == d})
                unloads.difference_update({k for k in unloads if k[1] == d})
        elif kind == "back" and ctl.lost:
            d = data.draw(st.sampled_from(sorted(ctl.lost)), label="back")
            ctl.device_ready(d, now)
            assert d not in ctl.lost and dev[d].active and dev[d].models == {}
        elif kind == "ready" and starting:
            d = data.draw(st.sampled_from(sorted(starting)), label="ready")
            starting.discard(d)
            ctl.device_ready(d, now)
        elif kind == "stopped" and stopping:
            d = data.draw(st.sampled_from(sorted(stopping)), label="stopped")
            if not any(k[1] == d for k in loads | unloads) and not any(x == d for _, x in sent):
                stopping.discard(d)
                for m, dd in list(waiting):
                    if dd == d:
                        del waiting[(m, dd)]  # the live driver's waiters time out
                ctl.device_stopped(d, now)
        elif kind == "reconcile":
            d = data.draw(st.sampled_from(sorted(dev)), label="device")
            index = {
                m: data.draw(st.sampled_from([READY, READY, "UNAVAILABLE", "LOADING"]), label="s")
                for m in data.draw(st.sets(st.sampled_from(names)), label="listed")
            }
            index.update({m: LOADING for m, dd in loads if dd == d})  # the driver's override
            index.update({m: UNLOADING for m, dd in unloads if dd == d})
            carry(ctl.reconcile(d, index, now))
            for m, dd in list(waiting):  # a waiting load found READY: its requests go
                if dd == d and dev[d].models.get(m) == READY:
                    for _ in range(waiting.pop((m, dd))):
                        ctl.sent(m, d, now)
                        sent.append((m, d))
            if used(dev[d])[0] > dev[d].memory_total_bytes:
                event("an adoption over the memory")
            continue  # an adoption may take a device over its memory (documented)
        for n, d in dev.items():
            for was, now_used in zip(before[n], used(d), strict=True):
                assert now_used <= d.memory_total_bytes or now_used <= was, (kind, n)
            if n in ctl.lost:
                assert d.models == {}
