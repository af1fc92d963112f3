"""Models coming and going on a device scheduler (the worker's model control): pure, with
times given as numbers."""

from __future__ import annotations

import pytest

from evenserve.core.options import QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.policy.batching import BATCHING
from evenserve.sched import UNLOADED, ModelSetup, QueuedRequest, QueueSet, scheduler_for

from .test_scheduler import Actions

PROF_A = LatencyProfile.from_points("a", {1: 10.0, 4: 16.0}, weights_mb=100)
PROF_B = LatencyProfile.from_points("b", {1: 5.0, 4: 8.0}, weights_mb=50)


def model(name: str, profile: LatencyProfile | None = None, **kw: object) -> ModelSetup:
    spec = {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 0}
    policy = BATCHING.build(spec)
    return ModelSetup(name=name, policy=policy, profile=profile, **kw)  # type: ignore[arg-type]


def waiting_model(name: str) -> ModelSetup:
    """Waits for a full batch of 4 (static): requests stay queued until flushed."""
    return ModelSetup(name=name, policy=BATCHING.build({"policy": "static", "batch_size": 4}))


def req(i: int, m: str, t: float) -> QueuedRequest:
    return QueuedRequest(i, m, t, 10, None)


def test_a_model_added_later_is_served_and_its_figures_follow() -> None:
    act = Actions()
    s = scheduler_for([model("b", PROF_B, max_queue=3)], act, memory_total_bytes=1e9)
    assert s.models == ("b",)
    assert s.memory.weights_bytes == pytest.approx(50 * 1024**2)
    s.add_model(model("a", PROF_A, slo_s=0.2), now=1.0)
    assert s.models == ("a", "b")  # name order, as at construction
    assert s.max_batch_size == {"a": 4, "b": 4}
    assert s.slo_s == {"a": 0.2}
    assert s.max_queue == {"b": 3}
    assert s.memory.weights_bytes == pytest.approx(150 * 1024**2)
    assert s.queued_by_model() == {"a": 0, "b": 0}
    assert s.offer(req(1, "a", 1.0), 1.0) is None
    assert [b.model for b in act.started] == ["a"]
    assert s.in_flight_by_model() == {"a": 1, "b": 0}


def test_a_device_with_no_models_accepts_one_later() -> None:
    act = Actions()
    s = scheduler_for([], act)
    assert s.models == () and s.idle
    s.add_model(model("a"), now=0.0)
    assert s.offer(req(1, "a", 0.0), 0.0) is None
    assert len(act.started) == 1


def test_adding_a_model_twice_is_refused() -> None:
    s = scheduler_for([model("a")], Actions())
    with pytest.raises(ValueError, match="'a' is hosted here already"):
        s.add_model(model("a"), now=0.0)


def test_a_profile_given_to_add_model_replaces_the_setups() -> None:
    s = scheduler_for([], Actions())
    s.add_model(model("a"), now=0.0, profile=PROF_A)
    assert s.memory.weights_bytes == pytest.approx(100 * 1024**2)
    assert s.estimate_batch_s("a", 1) == pytest.approx(0.010)


def test_remove_needs_nothing_queued_or_running() -> None:
    act = Actions()
    s = scheduler_for([model("a", PROF_A), model("b", PROF_B)], act)
    assert s.offer(req(1, "a", 0.0), 0.0) is None  # running
    assert s.offer(req(2, "a", 0.0), 0.0) is None  # queued behind it
    with pytest.raises(ValueError, match="'a': 1 request\\(s\\) queued and 1 running"):
        s.remove_model("a", 0.0)
    s.finished(act.started[0], 0.010)  # the second one starts
    with pytest.raises(ValueError, match="0 request\\(s\\) queued and 1 running"):
        s.remove_model("a", 0.010)
    s.finished(act.started[1], 0.020)
    s.remove_model("a", 0.020)
    assert s.models == ("b",)
    assert "a" not in s.queues
    assert s.memory.weights_bytes == pytest.approx(50 * 1024**2)
    assert s.queued_by_model() == {"b": 0}
    with pytest.raises(KeyError):
        s.offer(req(3, "a", 0.03), 0.03)
    with pytest.raises(ValueError, match="'a' is not hosted here"):
        s.remove_model("a", 0.03)


def test_flush_then_abandon_empties_one_model_and_leaves_the_others() -> None:
    act = Actions()
    s = scheduler_for([waiting_model("a"), waiting_model("b")], act)
    for i in range(2):
        assert s.offer(req(i, "a", 0.0), 0.0) is None
        assert s.offer(req(10 + i, "b", 0.0), 0.0) is None
    assert act.started == []  # static batches of 4 wait
    s.flush_model("a", 1.0)
    assert [(b.model, len(b.requests)) for b in act.started] == [("a", 2)]
    assert s.offer(req(5, "a", 1.0), 1.0) is None  # queued: the only instance is busy
    assert s.abandon(1.5, UNLOADED, model="a") == 1
    assert act.dropped == [(5, UNLOADED)]
    assert s.queued_by_model() == {"a": 0, "b": 2}
    s.finished(act.started[0], 2.0)
    s.remove_model("a", 2.0)
    assert s.models == ("b",) and s.waiting == 2


def test_one_model_left_is_asked_directly_and_class_rules_keep_the_general_path() -> None:
    s = scheduler_for([model("a"), model("b")], Actions())
    assert not s._direct
    s.remove_model("b", 0.0)
    assert s._direct and s._owns_queues
    ruled = scheduler_for([model("a")], Actions(), queue=QueueOptions(starvation_ms=100))
    ruled.add_model(model("b"), 0.0)
    ruled.remove_model("a", 0.0)
    assert not ruled._direct


def test_a_draining_device_flushes_a_model_added_during_the_drain() -> None:
    act = Actions()
    s = scheduler_for([], act)
    s.begin_drain(0.0)
    s.add_model(waiting_model("a"), 0.0)
    # Refused: a draining device takes nothing new, whatever it hosts.
    assert s.offer(req(1, "a", 0.0), 0.0) == "draining"
    assert s._by_name["a"].policy is not s._by_name["a"].mq.policy


def test_a_shared_queue_set_is_not_changed_by_one_device() -> None:
    act = Actions()
    qs: QueueSet[QueuedRequest] = QueueSet([model("a"), model("b")], act.drop)
    from evenserve.sched import DeviceScheduler

    s = DeviceScheduler(qs, act, models=["a"])
    with pytest.raises(ValueError, match="shares its queues"):
        s.add_model(model("c"), 0.0)
    with pytest.raises(ValueError, match="shares its queues"):
        s.remove_model("a", 0.0)


def test_queue_set_add_and_remove() -> None:
    act = Actions()
    qs: QueueSet[QueuedRequest] = QueueSet([model("a")], act.drop)
    qs.add(model("b"))
    with pytest.raises(ValueError, match="'b' already has a queue"):
        qs.add(model("b"))
    assert qs.offer(req(1, "b", 0.0), 0.0) is None
    with pytest.raises(ValueError, match="'b': 1 request\\(s\\) still queued"):
        qs.remove("b")
    assert qs.abandon(0.0, UNLOADED, model="b") == 1
    qs.remove("b")
    assert "b" not in qs
    with pytest.raises(ValueError, match="'b' has no queue"):
        qs.remove("b")
