"""The parameter set, its versioned store and the same set on a simulator arm."""

from __future__ import annotations

import json

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ArmSpec
from evenserve.policy.params import (
    Params,
    ParamStore,
    UnknownVersionError,
    VersionConflictError,
    apply_to_arm,
    parse_expected_version,
    parse_params,
    parse_put_body,
    parse_rollback_body,
    parse_update,
)

QA = {"policy": "queue-aware", "queue_weight": 0.5}


def test_update_keeps_only_the_keys_given_and_normalizes_routing() -> None:
    up = parse_update({"routing": QA})
    assert set(up) == {"routing"}
    assert up["routing"]["policy"] == "queue-aware" and up["routing"]["queue_weight"] == 0.5
    assert len(up["routing"]) > 2  # every param of the policy, as GET /admin/routing shows
    up = parse_update(
        {"batching_per_model": {"m": {"policy": "fixed-window", "max_batch_size": 8}}}
    )
    assert up == {"batching_per_model": {"m": {"policy": "fixed-window", "max_batch_size": 8}}}
    assert parse_update({"class_headroom": None}) == {"class_headroom": None}
    assert parse_update({"batching_per_model": {"m": "none"}}) == {
        "batching_per_model": {"m": {"policy": "none"}}
    }


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (
            {"batching_per_model": {"resnet50": {"policy": "fixed-window", "max_batch_size": 0}}},
            "params.batching_per_model.resnet50.max_batch_size:",
        ),
        (
            {"batching_per_model": {"m": {"policy": "nope"}}},
            "params.batching_per_model.m.policy: unknown batching policy 'nope'",
        ),
        ({"routing": {"policy": "queue-aware", "queue_weight": -1}}, "params.routing.queue_weight"),
        ({"class_headroom": 2}, "params.class_headroom:"),
        ({"class_headroom": "x"}, "params.class_headroom:"),
        ({"learn_profiles": 1}, "params.learn_profiles: expected true, false or null"),
        ({"learn_profiles": "yes"}, "params.learn_profiles:"),
        ({"batching": {}}, "params.batching: unknown parameter"),
        ({"batching_per_model": [1]}, "params.batching_per_model: expected an object"),
        ([1], "params: expected a JSON object"),
    ],
)
def test_bad_input_names_the_field(raw: object, names: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_update(raw)
    assert names in str(err.value)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        # As JSON reads them from a request body: 1e400 is inf; NaN and Infinity are literals
        # Python's json takes.
        (
            '{"routing": {"policy": "queue-aware", "queue_weight": 1e400}}',
            "params.routing.queue_weight: inf is not a finite number",
        ),
        (
            '{"batching_per_model": {"m": {"policy": "fixed-window", "max_batch_delay_ms": NaN}}}',
            "params.batching_per_model.m.max_batch_delay_ms: nan is not a finite number",
        ),
        ('{"class_headroom": -Infinity}', "params.class_headroom: -inf is not a finite number"),
        ('{"routing": {"policy": "p", "w": [1, -1e999]}}', "params.routing.w.1: -inf is not"),
    ],
)
def test_numbers_that_are_not_finite_are_refused_naming_the_field(body: str, names: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_update(json.loads(body))
    assert names in str(err.value)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({}, "params: required"),
        ({"note": "x"}, "params: required"),
        ({"params": {}}, "params: empty, nothing to change"),
        ({"parms": {"class_headroom": 0.5}}, "parms: unknown field"),
        ({"params": {"class_headroom": 0.5}, "expected": 3}, "expected: unknown field"),
        ({"params": {"class_headroom": 1e400}}, "params.class_headroom: inf is not a finite"),
    ],
)
def test_a_put_body_must_change_something_and_have_only_known_fields(
    body: dict[str, object], names: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_put_body(body)
    assert names in str(err.value)
    assert parse_put_body({"params": {"class_headroom": 0.5}, "note": "n", "expected_version": 2})
    with pytest.raises(ConfigError, match="version: unknown field"):
        parse_rollback_body({"to_version": 1, "version": 2})
    assert parse_rollback_body({"to_version": 1, "expected_version": 2, "note": "n"})


def test_merge_is_per_key_and_per_model() -> None:
    base = parse_params(
        {
            "routing": "round-robin",
            "batching_per_model": {"a": {"policy": "none"}, "b": {"policy": "none"}},
            "class_headroom": 0.5,
        }
    )
    new = base.merged(parse_update({"batching_per_model": {"b": {"policy": "static"}}}))
    assert new.routing == base.routing and new.class_headroom == 0.5
    assert new.batching_per_model == {"a": {"policy": "none"}, "b": {"policy": "static"}}
    off = new.merged(parse_update({"class_headroom": None}))
    assert off.class_headroom is None and off.batching_per_model == new.batching_per_model
    assert base.batching_per_model["b"] == {"policy": "none"}  # unchanged


def test_store_versions_conflicts_history_bound_and_rollback_targets() -> None:
    store = ParamStore(Params(class_headroom=0.5), 100.0, history_limit=3)
    assert store.version == 1 and store.current.source == "startup"
    store.check(None)
    store.check(1)
    with pytest.raises(VersionConflictError) as err:
        store.check(7)
    assert err.value.current == 1 and "current version (1)" in str(err.value)
    for i in range(4):
        store.commit(Params(class_headroom=0.1 * (i + 1)), 101.0 + i, f"n{i}", "put")
    assert store.version == 5
    assert [v.version for v in store.history] == [3, 4, 5]  # bounded: the last 3
    assert store.get(4).params.class_headroom == pytest.approx(0.3)
    with pytest.raises(UnknownVersionError, match=r"kept: 3\.\.5"):
        store.get(1)
    view = store.to_json()
    assert view["version"] == 5 and [h["version"] for h in view["history"]] == [3, 4, 5]
    assert view["history"][-1]["note"] == "n3" and view["history"][-1]["applied_unix_s"] == 104.0
    assert "routing" not in store.to_json(include_routing=False)["params"]


def test_expected_version_must_be_a_positive_integer() -> None:
    assert parse_expected_version(None) is None and parse_expected_version(3) == 3
    for bad in (0, -1, True, "3", 1.5):
        with pytest.raises(ConfigError, match="expected_version"):
            parse_expected_version(bad)


def test_apply_to_arm_sets_routing_batching_and_headroom() -> None:
    arm = ArmSpec(
        routing="round-robin",
        batching={"policy": "fixed-window", "max_batch_size": 4},
        batching_per_model={"a": "none", "b": "none"},
    )
    params = parse_params(
        {
            "routing": QA,
            "batching_per_model": {"b": {"policy": "fixed-window", "max_batch_size": 8}},
            "class_headroom": 0.7,
        }
    )
    out = apply_to_arm(arm, params)
    assert out.routing["policy"] == "queue-aware"
    assert out.batching_per_model == {
        "a": "none",
        "b": {"policy": "fixed-window", "max_batch_size": 8},
    }
    assert out.class_headroom == 0.7 and out.batching == arm.batching
    # A worker's set (no routing) leaves the arm's routing as it is.
    assert apply_to_arm(arm, Params()).routing == "round-robin"


def test_learn_profiles_is_validated_merged_serialized_and_put_on_an_arm() -> None:
    assert parse_update({"learn_profiles": True}) == {"learn_profiles": True}
    assert parse_update({"learn_profiles": None}) == {"learn_profiles": None}
    base = Params(class_headroom=0.5)
    assert base.learn_profiles is None and base.to_json()["learn_profiles"] is None
    on = base.merged(parse_update({"learn_profiles": True}))
    assert on.learn_profiles is True and on.class_headroom == 0.5
    assert on.to_json(include_routing=False)["learn_profiles"] is True
    assert on.merged(parse_update({"class_headroom": None})).learn_profiles is True
    assert on.merged(parse_update({"learn_profiles": None})).learn_profiles is None
    arm = ArmSpec(routing="round-robin", batching="none", learn_profiles=True)
    assert apply_to_arm(arm, Params()).learn_profiles is True  # None: the arm's own
    assert apply_to_arm(arm, Params(learn_profiles=False)).learn_profiles is False
    off = arm.model_copy(update={"learn_profiles": False})
    assert apply_to_arm(off, Params(learn_profiles=True)).learn_profiles is True
