"""Table-driven tests of the batching policies and of the device's choice among models."""

from __future__ import annotations

import math

import pytest

from evenserve.core.types import Dispatch, QueueView, RequestInfo, WaitUntil
from evenserve.policy.batching import BATCHING
from evenserve.policy.batching.device import next_batch
from evenserve.policy.registry import PolicySpecError


def queue(arrivals: list[float], model: str = "m", priority: int = 10) -> QueueView:
    reqs = [
        RequestInfo(request_id=i, model=model, arrival_s=t, priority=priority)
        for i, t in enumerate(arrivals)
    ]
    return QueueView(model=model, requests=reqs, profile=None)


CASES = [
    # (spec, arrivals, now, expected decision)
    ("none", [], 0.0, WaitUntil(math.inf)),
    ("none", [0.0, 0.1], 0.2, Dispatch(1)),
    ({"policy": "static", "batch_size": 4}, [0.0, 0.1, 0.2], 5.0, WaitUntil(math.inf)),
    ({"policy": "static", "batch_size": 4}, [0.0, 0.1, 0.2, 0.3, 0.4], 0.4, Dispatch(4)),
    (
        {"policy": "static", "batch_size": 4, "max_wait_ms": 100},
        [0.0, 0.05],
        0.06,
        WaitUntil(0.1),
    ),
    ({"policy": "static", "batch_size": 4, "max_wait_ms": 100}, [0.0, 0.05], 0.1, Dispatch(2)),
    (
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 80},
        [],
        0.0,
        WaitUntil(math.inf),
    ),
    (
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 80},
        [0.0, 0.01],
        0.02,
        WaitUntil(0.08),
    ),
    (
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 80},
        [0.0, 0.01],
        0.08,
        Dispatch(2),
    ),
    (
        {"policy": "fixed-window", "max_batch_size": 3, "max_batch_delay_ms": 80},
        [0.0, 0.001, 0.002, 0.003, 0.004],
        0.004,
        Dispatch(3),
    ),
    (
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0},
        [0.5],
        0.5,
        Dispatch(1),
    ),
]


@pytest.mark.parametrize(("spec", "arrivals", "now", "expected"), CASES)
def test_batching_decisions(
    spec: object, arrivals: list[float], now: float, expected: object
) -> None:
    policy = BATCHING.build(spec)
    dec = policy.decide(queue(arrivals), now)
    if isinstance(expected, WaitUntil):
        assert isinstance(dec, WaitUntil)
        assert dec.t_s == pytest.approx(expected.t_s)
    else:
        assert dec == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("none", 1), ({"policy": "static", "batch_size": 4}, 4), ("fixed-window", 8)],
)
def test_max_batch_size(spec: object, expected: int) -> None:
    assert BATCHING.build(spec).max_batch_size == expected


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"policy": "static", "batch_size": 0}, "batch_size"),
        ({"policy": "fixed-window", "max_batch_delay_ms": -5}, "max_batch_delay_ms"),
        ({"policy": "fixed-window", "window": 5}, "window"),
        ("adaptive-magic", "unknown batching policy"),
    ],
)
def test_bad_batching_specs(spec: object, needle: str) -> None:
    with pytest.raises(PolicySpecError, match=needle):
        BATCHING.build(spec)


def test_device_runs_oldest_ready_model_first() -> None:
    fw = BATCHING.build({"policy": "fixed-window", "max_batch_size": 2, "max_batch_delay_ms": 0})
    a = queue([0.2, 0.3], model="a")
    b = queue([0.1], model="b")
    nb = next_batch([(a, fw), (b, fw)], 1.0)
    assert (nb.model, nb.n) == ("b", 1)


def test_device_prefers_higher_priority_head() -> None:
    fw = BATCHING.build({"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 0})
    offline = queue([0.0, 0.1], model="batch", priority=0)
    online = queue([0.5], model="web", priority=10)
    nb = next_batch([(offline, fw), (online, fw)], 1.0)
    assert (nb.model, nb.n) == ("web", 1)


def test_device_wakes_at_earliest_policy_time() -> None:
    slow = BATCHING.build({"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 50})
    fast = BATCHING.build({"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 10})
    nb = next_batch([(queue([0.0], model="a"), slow), (queue([0.0], model="b"), fast)], 0.001)
    assert nb.model is None
    assert nb.wake_s == pytest.approx(0.010)
    assert next_batch([], 0.0).model is None
