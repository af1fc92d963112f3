"""LLM engines in the pools: what placement counts of an engine (weights + KV cache on a
device, weights only in host memory), wake vs load from disk, and the anti-thrash rule
(``min_switch_s``). Pure: times are numbers (design note 0022)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenserve.core.llm import StepProfile
from evenserve.policy.placement import (
    AUTOSCALING,
    PLACEMENT,
    READY,
    UNLOADING,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    ScaleDown,
    Unload,
    check_actions,
)
from evenserve.policy.placement.controller import PlacementController

GIB = 2.0**30
KIB = 1024


def llama(max_model_len: int = 8192) -> StepProfile:
    """The h100-llm Llama-3.1-8B figures (profiles/h100-llm/llama-3.1-8b.yaml)."""
    return StepProfile(
        model="llm",
        device="H100",
        runtime="vllm",
        precision="bf16",
        source="test",
        c0_s=5.75e-3,
        prefill_s_per_token=17.25e-6,
        decode_s_per_seq=6e-6,
        kv_s_per_token=0.039e-6,
        cpu_s_per_output_token=3.36e-3,
        weights_bytes=14.96 * GIB,
        kv_bytes_per_token=128 * KIB,
        device_memory_bytes=79.6 * GIB,
        max_model_len=max_model_len,
    )


def engine(kv_tokens: int = 65536, cold_s: float = 20.0, warm_s: float = 1.5) -> ModelInfo:
    return ModelInfo.for_engine(
        "llm",
        llama(),
        kv_tokens=kv_tokens,
        cold_load_s=cold_s,
        warm_load_s=warm_s,
        max_num_seqs=64,
        prompt_tokens=1000,
        output_tokens=200,
    )


def classic(name: str, gb: float, cap_rps: float = 100.0) -> ModelInfo:
    return ModelInfo(name, gb * GIB, 2.0, 0.2, batch_s=1.0 / cap_rps, max_batch_size=1)


def test_an_engine_holds_its_weights_and_its_kv_cache_on_a_device() -> None:
    e = engine(kv_tokens=65536)
    # 65536 tokens x 128 KiB = 8 GiB of KV, in whole 16-token blocks.
    assert e.kv_bytes == 8 * GIB
    assert e.device_bytes == 14.96 * GIB + 8 * GIB
    assert e.weights_bytes == 14.96 * GIB
    # A part block is a whole block.
    assert engine(kv_tokens=8193).kv_bytes == 513 * 16 * 128 * KIB
    # Its capacity: 64 requests of 1000 + 200 tokens as one batch.
    p = llama()
    batch = 64 * 1000 * p.prefill_s_per_token + 200 * p.step_s(0, 64, 64 * 1100)
    assert e.batch_s == pytest.approx(batch)
    assert e.capacity_rps == pytest.approx(64 / batch)


def test_an_engine_needs_kv_for_one_max_model_len_sequence() -> None:
    with pytest.raises(ValueError, match="kv_tokens: 4096 is fewer than one sequence"):
        engine(kv_tokens=4096)
    with pytest.raises(ValueError, match="max_num_seqs"):
        ModelInfo.for_engine(
            "llm", llama(), kv_tokens=8192, cold_load_s=1, warm_load_s=1, max_num_seqs=0,
            prompt_tokens=10, output_tokens=10,
        )  # fmt: skip


def test_check_actions_counts_the_kv_cache_not_only_the_weights() -> None:
    models = {"llm": engine(), "a": classic("a", 4)}
    # 24 GiB: the weights (14.96) fit next to a (4), the weights and the KV (22.96) do not.
    d = DeviceView("d0", 24 * GIB, {"a": READY})
    view = ClusterView(0.0, models, [d])
    with pytest.raises(PlacementError, match="over 'd0'"):
        check_actions(view, [Load("llm", "d0")])
    check_actions(view, [Unload("a", "d0"), Load("llm", "d0")])
    assert d.free_bytes(models) == 20 * GIB


@pytest.mark.parametrize("policy", ["lru", "cost-aware"])
def test_a_miss_for_an_engine_frees_room_for_its_weights_and_its_kv(policy: str) -> None:
    models = {
        "llm": engine(),
        "a": classic("a", 2),
        "b": classic("b", 2),
        "c": classic("c", 2),
    }
    # 28 GiB holding 6 GiB of idle classic models: 22 GiB free is enough for the weights,
    # not for weights + KV (22.96): one of them must go.
    d = DeviceView("d0", 28 * GIB, {"a": READY, "b": READY, "c": READY}, last_used_s={"a": 1.0})
    view = ClusterView(10.0, models, [d], rate_rps={"llm": 1.0})
    actions = PLACEMENT.build(policy).on_miss("llm", view)
    check_actions(view, actions)
    assert actions[-1] == Load("llm", "d0")
    assert len([a for a in actions if isinstance(a, Unload)]) == 1


def controller(
    models: dict[str, ModelInfo],
    devices: list[DeviceView],
    *,
    host_gib: float,
    min_switch_s: float = 0.0,
    policy: object = "cost-aware",
    scaler: object = None,
) -> PlacementController:
    return PlacementController(
        models,
        devices,
        PLACEMENT.build(policy),
        None if scaler is None else AUTOSCALING.build(scaler),
        host_memory_bytes=host_gib * GIB,
        interval_s=1.0,
        min_switch_s=min_switch_s,
    )


def test_an_engine_wakes_from_host_memory_and_loads_cold_from_disk() -> None:
    models = {"llm": engine(cold_s=20.0, warm_s=1.5), "a": classic("a", 4)}
    # Host memory of exactly the engine's weights: asleep, it holds those only (its KV
    # cache is dropped), so it stays warm; counting its KV too would have sent it cold.
    c = controller(models, [DeviceView("d0", 80 * GIB)], host_gib=14.96)
    dev, acts = c.route_miss("llm", 0.0)
    assert dev == "d0" and acts == [Load("llm", "d0")]
    assert c.load_seconds(Load("llm", "d0")) == 20.0  # from disk
    c.load_done("llm", "d0", 20.0)
    # It goes to sleep (idle, its device wanted): unloaded, warm.
    c._apply([Unload("llm", "d0")], 100.0, "rebalance")
    c.unload_done("llm", "d0", 100.01)
    assert c.warm == ["llm"]
    _, acts = c.route_miss("llm", 200.0)
    assert c.load_seconds(Load("llm", "d0")) == 1.5  # a wake
    assert (c.counts.cold_loads, c.counts.warm_loads) == (1, 1)
    # A classic model landing in host memory beyond its capacity pushes the engine out.
    c._apply([Unload("llm", "d0")], 300.0, "rebalance")
    c.load_done("llm", "d0", 300.0)
    c.unload_done("llm", "d0", 300.01)
    c.route_miss("a", 301.0)
    assert c.warm == ["a"]
    _, acts = c.route_miss("llm", 302.0)
    assert c.load_seconds(Load("llm", "d0")) == 20.0


def test_no_switch_within_the_window_a_miss_that_needs_one_is_refused() -> None:
    models = {"llm": engine(), "a": classic("a", 10)}
    # One device of 24 GiB: the engine (22.96) or a (10), not both.
    c = controller(models, [DeviceView("d0", 24 * GIB, {"a": READY})], host_gib=64, min_switch_s=30)
    dev, acts = c.route_miss("llm", 0.0)  # a is idle: cost-aware evicts it for the engine
    assert dev == "d0" and acts == [Unload("a", "d0")]
    c.load_done("llm", "d0", 0.0)  # (nothing to finish: the load waits for the room)
    started = c.unload_done("a", "d0", 0.01)
    assert started == [Load("llm", "d0")]
    c.load_done("llm", "d0", 1.51)
    for t in (2.0, 10.0, 29.9):
        c.arrival("a", t)
        assert c.route_miss("a", t) == (None, [])  # both pinned on d0: refused, no thrash
    assert c.view(29.9).devices[0].pinned == frozenset({"llm", "a"})
    # 30 s after the change the pair may change again.
    dev, acts = c.route_miss("a", 30.0)
    assert dev == "d0" and acts == [Unload("llm", "d0")]
    assert [(t, m, k) for t, m, _, k in c.counts.switch_log] == [
        (0.0, "a", "unload"),
        (0.0, "llm", "load"),
        (30.0, "llm", "unload"),
        (30.0, "a", "load"),
    ]
    # A policy answer that breaks the rule is a bug: check_actions names it.
    with pytest.raises(PlacementError, match="anti-thrash"):
        check_actions(c.view(31.0), [Unload("a", "d0")])


def test_a_device_with_a_pinned_resident_is_not_turned_off() -> None:
    models = {"a": classic("a", 2), "b": classic("b", 2)}
    devs = [DeviceView("d0", 10 * GIB, {"a": READY}), DeviceView("d1", 10 * GIB)]
    c = controller(
        models, devs, host_gib=8, min_switch_s=30,
        scaler={"policy": "demand", "quiet_s": 0, "min_devices": 1},
    )  # fmt: skip
    _, acts = c.route_miss("b", 0.0)
    assert acts == [Load("b", "d1")]
    c.load_done("b", "d1", 0.2)
    assert c._scale(ScaleDown("d1"), 10.0) is False  # b changed there 10 s ago
    out: list[object] = []
    t = 0.25
    while t < 60.0 and not out:
        out = [s for s in c.tick(t) if isinstance(s, ScaleDown)]
        t += 0.25
    # The autoscaler waits for the window (both devices idle: one may go) and then turns
    # off one of them: not before 30 s for d1 (pinned), d0 at once would be allowed.
    assert out
    assert out[0] == ScaleDown("d0") or t - 0.25 >= 30.0


EVENTS = ["miss", "loaded", "unloaded", "done", "tick", "tick", "ready", "stopped"]


@pytest.mark.parametrize(
    ("policy", "scaler"),
    [
        ("lru", None),
        ({"policy": "lru", "idle_evict_s": 3}, {"policy": "demand", "quiet_s": 2}),
        ({"policy": "cost-aware", "hold_s": 0}, None),
        ({"policy": "cost-aware", "hold_s": 0}, {"policy": "demand", "quiet_s": 2}),
    ],
)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_no_model_switches_on_a_device_more_than_once_per_window(
    policy: object, scaler: object, data: st.DataObject
) -> None:
    """Random runs (misses of an engine and classic models, loads and unloads done, ticks
    with the autoscaler, devices on and off) with ``min_switch_s`` 30: no PlacementError,
    two changes of one (model, device) are at least 30 s apart, and no load starts where
    the device's residents (weights and KV caches) would not fit."""
    models = {"llm": engine(kv_tokens=16384), **{f"c{i}": classic(f"c{i}", 3) for i in range(4)}}
    names = sorted(models)
    devs = [
        DeviceView("d0", 24 * GIB, {"c0": READY}),
        DeviceView("d1", 24 * GIB, {"c1": READY}),
        DeviceView("d2", 24 * GIB, active=False),
    ]
    c = controller(models, devs, host_gib=20, min_switch_s=30.0, policy=policy, scaler=scaler)
    loads: set[tuple[str, str]] = set()
    unloads: set[tuple[str, str]] = set()
    sent: list[tuple[str, str]] = []
    starting: set[str] = set()
    stopping: set[str] = set()

    def carry(actions: list[object]) -> None:
        for a in actions:
            if isinstance(a, Load):
                d = c.devices[a.device]
                pending = {p.model for p in c._pending[a.device]}
                held = sum(models[m].device_bytes for m in d.models if m not in pending)
                assert held <= d.memory_total_bytes
                loads.add((a.model, a.device))
            elif isinstance(a, Unload):
                unloads.add((a.model, a.device))
            elif isinstance(a, ScaleDown):
                stopping.add(a.device)
            else:
                starting.add(a.device)  # type: ignore[attr-defined]

    now = 0.0
    for _ in range(data.draw(st.integers(10, 60), label="steps")):
        now += data.draw(st.sampled_from([0.1, 1.0, 5.0, 12.0]), label="dt")
        kind = data.draw(st.sampled_from(EVENTS), label="event")
        if kind == "miss":
            m = data.draw(st.sampled_from(names), label="model")
            c.arrival(m, now)
            ready = [n for n, d in c.devices.items() if d.active and d.models.get(m) == READY]
            if ready:
                c.sent(m, ready[0], now)
                sent.append((m, ready[0]))
            else:
                _, acts = c.route_miss(m, now)
                carry(list(acts))
        elif kind == "loaded" and loads:
            m, d = data.draw(st.sampled_from(sorted(loads)), label="load")
            loads.discard((m, d))
            c.load_done(m, d, now)
        elif kind == "unloaded" and unloads:
            m, d = data.draw(st.sampled_from(sorted(unloads)), label="unload")
            unloads.discard((m, d))
            if c.devices[d].models.get(m) == UNLOADING:
                carry(list(c.unload_done(m, d, now)))
        elif kind == "done" and sent:
            m, d = sent.pop(data.draw(st.integers(0, len(sent) - 1), label="which"))
            c.done(m, d, 1, now)
        elif kind == "tick":
            carry(list(c.tick(now)))
        elif kind == "ready" and starting:
            d = sorted(starting)[0]
            starting.discard(d)
            c.device_ready(d, now)
        elif kind == "stopped" and stopping:
            d = sorted(stopping)[0]
            busy = any(k[1] == d for k in loads | unloads) or any(x == d for _, x in sent)
            if not busy:
                stopping.discard(d)
                c.device_stopped(d, now)
    last: dict[tuple[str, str], float] = defaultdict(lambda: -1e9)
    for t, m, d, _ in c.counts.switch_log:
        assert t - last[(m, d)] >= 30.0, (m, d, t, last[(m, d)])
        last[(m, d)] = t


def test_the_gateways_placement_settings_take_the_window_and_name_a_bad_one() -> None:
    from evenserve.cluster.gateway_section import PlacementSettings
    from evenserve.core.errors import ConfigError

    s = PlacementSettings.parse({"policy": "cost-aware", "hold_s": 30, "min_switch_s": 30})
    assert s.min_switch_s == 30.0 and s.policy == {"policy": "cost-aware", "hold_s": 30}
    assert PlacementSettings.parse("lru").min_switch_s == 0.0
    with pytest.raises(ConfigError, match=r"gateway\.placement\.min_switch_s: must be >= 0"):
        PlacementSettings.parse({"policy": "lru", "min_switch_s": -1})


def test_cost_aware_puts_idle_models_to_sleep_after_idle_unload_s() -> None:
    models = {"llm": engine(), "a": classic("a", 2), "b": classic("b", 2), "c": classic("c", 2)}
    pol = PLACEMENT.build({"policy": "cost-aware", "idle_unload_s": 60, "hold_s": 0})
    d = DeviceView(
        "d0",
        80 * GIB,
        {"llm": READY, "a": READY, "b": READY, "c": READY},
        last_used_s={"llm": 30.0, "a": 90.0, "b": 30.0},
        outstanding={"b": 1},
    )
    rates = {"llm": 0.0, "a": 0.0, "b": 0.0, "c": 0.0}
    # The engine: idle 70 s, no demand: asleep. a: used 10 s ago. b: a request out. c: never
    # used: its clock starts at this first view.
    assert pol.rebalance(ClusterView(100.0, models, [d], rate_rps=rates)) == [Unload("llm", "d0")]
    del d.models["llm"]
    assert pol.rebalance(ClusterView(159.0, models, [d], rate_rps=rates)) == [Unload("a", "d0")]
    del d.models["a"]
    assert pol.rebalance(ClusterView(160.0, models, [d], rate_rps=rates)) == [Unload("c", "d0")]
    # With demand, or with the option off (the default), an idle model stays.
    d.models["c"] = READY
    assert pol.rebalance(ClusterView(300.0, models, [d], rate_rps={**rates, "c": 1.0})) == []
    off = PLACEMENT.build({"policy": "cost-aware", "hold_s": 0})
    assert off.rebalance(ClusterView(900.0, models, [d], rate_rps=rates)) == []
