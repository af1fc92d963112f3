from __future__ import annotations

import pytest

from evenserve.policy.placement import (
    LOADING,
    READY,
    ClusterView,
    DeviceView,
    Load,
    ModelInfo,
    PlacementError,
    Unload,
    check_actions,
)

GIB = 2.0**30


def view() -> ClusterView:
    models = {
        m: ModelInfo(m, w * GIB, cold_load_s=2.0, warm_load_s=0.5, batch_s=0.01, max_batch_size=8)
        for m, w in (("a", 4), ("b", 6), ("c", 10))
    }
    devices = [
        DeviceView("d0", 12 * GIB, {"a": READY, "b": READY}, outstanding={"b": 2}),
        DeviceView("d1", 12 * GIB, {"c": LOADING}),
        DeviceView("off", 12 * GIB, active=False),
    ]
    return ClusterView(1.0, models, devices, warm=frozenset({"c"}))


def test_views_answer_memory_hosts_and_load_times() -> None:
    v = view()
    assert v.device("d0").free_bytes(v.models) == 2 * GIB
    assert [d.name for d in v.hosts("c")] == ["d1"]
    assert v.load_s("c") == 0.5 and v.load_s("a") == 2.0
    assert v.models["a"].capacity_rps == pytest.approx(800.0)


def test_a_load_needs_the_room_the_unloads_before_it_make() -> None:
    with pytest.raises(PlacementError, match="GiB over 'd0'"):
        check_actions(view(), [Load("c", "d0")])  # 4 + 6 + 10 > 12
    with pytest.raises(PlacementError, match="GiB over 'd1'"):
        check_actions(view(), [Load("a", "d1")])  # 10 (loading) + 4 > 12
    check_actions(view(), [Unload("c", "d1"), Load("a", "d1"), Load("b", "d1")])  # 4 + 6


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ([Unload("b", "d0")], "outstanding"),
        ([Load("a", "d0")], "already resident"),
        ([Load("a", "off")], "not active"),
        ([Unload("a", "d1")], "not resident"),
        ([Load("a", "nope")], "no device"),
        ([Load("zz", "d0")], "no model"),
        ([Unload("a", "d0"), Load("a", "d0")], "both loaded and unloaded"),
    ],
)
def test_actions_a_policy_must_not_return(actions: list[Load | Unload], message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        check_actions(view(), actions)
