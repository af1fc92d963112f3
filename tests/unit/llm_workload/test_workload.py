"""LLM workloads: lengths, shared prefixes, classes, arrivals and their seeds."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.core.errors import ConfigError
from evenserve.workload.llm import (
    LlmRequestSampler,
    LlmUser,
    llm_open_loop,
    llm_users,
    parse_llm_workload,
)


def spec(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model": "llama",
        "rate_rps": 20.0,
        "prompt_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.6, "min": 16, "max": 900},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 64},
        "vocab": 1000,
    }
    raw.update(over)
    return raw


def test_open_loop_is_seeded_ordered_and_bounded() -> None:
    s = parse_llm_workload(spec(), "w")
    a = llm_open_loop(s, 7, 30.0)
    assert a == llm_open_loop(s, 7, 30.0)
    assert a != llm_open_loop(s, 8, 30.0)
    assert [r.request_id for r in a] == list(range(len(a)))
    times = [r.arrival_s for r in a]
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 30.0
    assert len(a) > 300  # 20 rps over 30 s: about 600
    for r in a:
        assert 16 <= r.prompt_tokens <= 900 and 1 <= r.max_tokens <= 64
        assert all(0 <= t < 1000 for t in r.prompt_ids)
        assert r.model == "llama" and r.ignore_eos
    assert llm_open_loop(s, 7, 30.0, max_requests=5) == a[:5]


def test_lognormal_mean_is_the_distribution_mean() -> None:
    s = parse_llm_workload(
        spec(prompt_tokens={"dist": "lognormal", "mean": 300, "sigma": 0.5, "max": 100000}), "w"
    )
    a = llm_open_loop(s, 1, 300.0)
    mean = sum(r.prompt_tokens for r in a) / len(a)
    assert 280 < mean < 320


@pytest.mark.parametrize(
    ("dist", "allowed"),
    [
        ({"dist": "fixed", "value": 40}, {40}),
        ({"dist": "fixed", "value": 40, "max": 30}, {30}),
        ({"dist": "uniform", "min": 3, "max": 5}, {3, 4, 5}),
        ({"dist": "empirical", "values": [2, 9, 700], "max": 100}, {2, 9, 100}),
        ({"dist": "lognormal", "mean": 50, "sigma": 0.0}, {50}),
    ],
)
def test_length_distributions_draw_within_their_values(
    dist: dict[str, Any], allowed: set[int]
) -> None:
    s = parse_llm_workload(spec(output_tokens=dist), "w")
    seen = {r.max_tokens for r in llm_open_loop(s, 3, 20.0)}
    assert seen <= allowed
    if len(allowed) > 1:
        assert seen == allowed  # 400 draws over 3 values see each


def test_shared_prefix_groups_start_prompts_with_their_prefix() -> None:
    pg = {"groups": 3, "tokens": 32, "share": 0.5}
    s = parse_llm_workload(spec(prefix_groups=pg), "w")
    a = llm_open_loop(s, 5, 50.0)
    heads: dict[tuple[int, ...], int] = {}
    for r in a:
        heads[r.prompt_ids[:32]] = heads.get(r.prompt_ids[:32], 0) + 1
    shared = sorted(heads.values(), reverse=True)
    assert len([n for n in shared if n > 1]) == 3  # three prefixes, each shared
    grouped = sum(shared[:3])
    assert 0.4 < grouped / len(a) < 0.6
    # The same seed and shapes without groups: every prompt length and output is the same.
    plain = llm_open_loop(parse_llm_workload(spec(), "w"), 5, 50.0)
    assert [(r.prompt_tokens, r.max_tokens, r.arrival_s) for r in plain] == [
        (r.prompt_tokens, r.max_tokens, r.arrival_s) for r in a
    ]


def test_a_prompt_shorter_than_the_prefix_is_the_prefix_start() -> None:
    pg = {"groups": 1, "tokens": 64, "share": 1.0}
    s = parse_llm_workload(
        spec(prefix_groups=pg, prompt_tokens={"dist": "uniform", "min": 10, "max": 100}), "w"
    )
    a = llm_open_loop(s, 2, 10.0)
    full = next(r.prompt_ids[:64] for r in a if r.prompt_tokens >= 64)
    for r in a:
        assert r.prompt_ids[: min(64, r.prompt_tokens)] == full[: r.prompt_tokens]


def test_classes_set_priority_and_targets() -> None:
    s = parse_llm_workload(
        spec(
            ttft_ms=500,
            tpot_ms=40,
            classes=[
                {"weight": 3, "priority": "online"},
                {"weight": 1, "priority": "offline", "ttft_ms": 5000, "tpot_ms": 200},
            ],
        ),
        "w",
    )
    a = llm_open_loop(s, 4, 50.0)
    kinds = {(r.priority, r.ttft_target_s, r.tpot_target_s) for r in a}
    assert kinds == {(10, 0.5, 0.04), (0, 5.0, 0.2)}
    online = sum(r.priority == 10 for r in a) / len(a)
    assert 0.65 < online < 0.85


def test_closed_loop_users_have_unique_ids_and_their_own_draws() -> None:
    s = parse_llm_workload(spec(rate_rps=None, users=3, think_ms=100), "w")
    users = llm_users(s, 9)
    ids = [u.next_request(float(k)).request_id for k in range(4) for u in users]
    assert sorted(ids) == list(range(12))
    # A user's draws do not depend on the others'.
    alone = LlmUser(s, 9, 1)
    again = LlmUser(s, 9, 1)
    first = [alone.next_request(0.0) for _ in range(3)]
    assert first == [again.next_request(0.0) for _ in range(3)]
    assert all(u.think_s() >= 0 for u in users)
    assert LlmUser(parse_llm_workload(spec(rate_rps=None, users=1), "w"), 9, 0).think_s() == 0


def test_request_record_carries_class_and_targets() -> None:
    s = parse_llm_workload(spec(ttft_ms=250, priority="offline"), "w")
    r = LlmRequestSampler(s, 1).draw(42, 1.5)
    rec = r.record()
    assert (rec.request_id, rec.scheduled_s, rec.prompt_tokens) == (42, 1.5, r.prompt_tokens)
    assert (rec.priority, rec.ttft_target_s, rec.tpot_target_s) == (0, 0.25, None)
    assert rec.output_tokens == 0 and rec.outcome == "completed"


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"users": 4}, "rate_rps or users"),
        ({"rate_rps": None}, "rate_rps or users"),
        ({"prompt_tokens": {"dist": "lognormal", "mean": 5}}, "prompt_tokens.lognormal.sigma"),
        ({"output_tokens": {"dist": "uniform", "min": 9, "max": 2}}, "max: must be >= min"),
        ({"output_tokens": {"dist": "zipf"}}, "output_tokens"),
        ({"prefix_groups": {"groups": 0, "tokens": 4, "share": 0.5}}, "prefix_groups.groups"),
        ({"prefix_groups": {"groups": 2, "tokens": 4, "share": 1.5}}, "prefix_groups.share"),
        ({"priority": "urgent"}, "priority: unknown class"),
        ({"classes": [{"weight": 1, "priority": "x"}]}, "classes.0.priority"),
        ({"vocab": 1}, "vocab"),
        ({"tokens": 3}, "tokens"),
        (
            {"rate_rps": None, "users": 2, "phases": [{"start_s": 0, "end_s": 1, "multiplier": 2}]},
            "phases",
        ),
    ],
)
def test_bad_workloads_name_the_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=r"^w\.yaml: .*" + field.replace(".", r"\.")):
        parse_llm_workload(spec(**over), "w.yaml")


def test_open_and_closed_loop_helpers_refuse_the_other_kind() -> None:
    with pytest.raises(ConfigError, match="needs users"):
        llm_users(parse_llm_workload(spec(), "w"), 1)
    with pytest.raises(ConfigError, match="needs rate_rps"):
        llm_open_loop(parse_llm_workload(spec(rate_rps=None, users=1), "w"), 1, 1.0)


@given(
    lo=st.integers(1, 50),
    width=st.integers(0, 500),
    mean=st.floats(1, 2000),
    sigma=st.floats(0, 3),
    seed=st.integers(0, 2**32),
)
def test_lognormal_lengths_stay_clipped(
    lo: int, width: int, mean: float, sigma: float, seed: int
) -> None:
    dist = {"dist": "lognormal", "mean": mean, "sigma": sigma, "min": lo, "max": lo + width}
    s = parse_llm_workload(spec(prompt_tokens=dist, output_tokens=dist), "w")
    sampler = LlmRequestSampler(s, seed)
    for i in range(20):
        r = sampler.draw(i, 0.0)
        assert lo <= r.prompt_tokens <= lo + width and lo <= r.max_tokens <= lo + width
