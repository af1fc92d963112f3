"""The Router's indexed decisions (``routing.finish_index``) are the full pass's, call for call.

Two routers hear the same events (load reports with busy time, sends, answers, staleness,
health, model sets, learned profiles, backends without a profile, overloads, a clock that
sometimes goes back); one decides through the policy's ``choose_indexed``, the other only
through its full ``choose``. Every decision must name the same backend. Figures are drawn
from small sets so that ties (broken by rotation) are common.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample, RequestInfo
from evenserve.policy.routing import ROUTING, Router, finish_index
from evenserve.policy.routing import router as router_module
from evenserve.policy.routing.finish_index import FinishIndex
from evenserve.policy.routing.work import settled_finish_s

GB = 1024.0**3
PROFILES = {
    "a": LatencyProfile.from_points("a", {1: 2.0, 4: 4.0, 8: 6.0}),
    "b": LatencyProfile.from_points("b", {1: 10.0, 4: 20.0, 8: 30.0}),
    "c": LatencyProfile.from_points("c", {1: 1.0, 8: 5.0}),
}
SPECS: list[Any] = [
    "least-expected-work",
    {"policy": "least-expected-work", "stale_penalty_ms": 0},
    "queue-aware",
    {"policy": "queue-aware", "queue_weight": 1.0, "utilization_weight": 0.0},
    {"policy": "queue-aware", "utilization_weight": 0.0, "memory_weight": 0.0},
]


def _pair(
    spec: Any, rng: random.Random, n: int, stale_after_s: float | None, gaps: bool
) -> list[Router]:
    routers = []
    for indexed in (True, False):
        r = Router(ROUTING.build(spec, random.Random(0)), stale_after_s=stale_after_s)
        if not indexed:
            r._indexed = None  # the full pass only
        routers.append(r)
    plan = random.Random(rng.random())
    for i in range(n):
        models = sorted(plan.sample(sorted(PROFILES), plan.randint(1, 3)))
        # Most backends have every profile; some lack one (the fallback cost: full pass).
        profiles = {m: PROFILES[m] for m in models if not gaps or plan.random() < 0.9}
        for r in routers:
            r.add_backend(f"d{i}", models, profiles=profiles, max_batch_size={"a": 4})
    return routers


def _sample(rng: random.Random, now: float, models: frozenset[str], calm: bool) -> LoadSample:
    total = rng.choice([None, 24 * GB])
    used = None if total is None else rng.choice([2 * GB, 2 * GB if calm else 23 * GB])
    extra: dict[str, Any] = {}
    if rng.random() < 0.2:
        extra = {
            "profile_scale": {m: rng.choice([1.0, 1.5]) for m in models},
            "observed_ms": {m: {4: rng.choice([4.0, 8.0])} for m in models},
        }
    return LoadSample(
        timestamp_s=now - rng.choice([0.0, 0.001, 0.004]),
        queue_depth=float(rng.randint(0, 6)),
        utilization=rng.choice([None, 0.0, 0.5, 0.5, 0.9, 1.2]),
        memory_used_bytes=used,
        memory_total_bytes=total,
        queued_by_model={m: rng.choice([0.0, 1.0, 2.0, 3.0, 7.0]) for m in models},
        busy_remaining_s=rng.choice([0.0, 0.0, 0.002, 0.003, 0.008]),
        max_batch_size={m: rng.choice([1, 4, 8]) for m in models},
        slo_s=rng.choice(
            [{}, {m: 0.5 for m in models}, {m: 0.5 if calm else 0.012 for m in models}]
        ),
        **extra,
    )


def _check_index(model: str, ix: FinishIndex) -> None:
    """What a refreshed index holds: settled finishes in order, the busy and stale ones in
    order of theirs, every busy one due in the heap, and each quick position's kept figures
    (by queued counts) the settled finish at those counts."""
    for p, tied in enumerate(ix.where):
        if tied is not None:
            assert ix.finish[p] == settled_finish_s(model, ix.views[p])
            assert p in tied and tied is ix.at[ix.finish[p]]
        else:
            assert ix.quick[p] is None
    assert ix.keys == sorted(f for f, t in ix.at.items() if t)
    assert all(t == sorted(t) for t in ix.at.values())
    assert ix.busy_order == sorted((ix.finish[p], p) for p in ix.busy)
    assert ix.stale_order == sorted((ix.finish[p], p) for p in ix.stale)
    assert {(t, p) for p, t in ix.busy.items()} <= set(ix.busy_due)
    for p, e in enumerate(ix.node):
        if e is not None:  # the entry of its queued counts now, which a send moves along
            assert ix.quick[p] is not None and p not in ix.dirty
            assert e[0] == ix.finish[p] and e[1] is ix.where[p]
    for p, q in enumerate(ix.quick):
        if q is not None:
            memo, counts = q
            assert counts is ix.views[p].queued_by_model
            e = memo.get(tuple(counts.values()))
            if e is not None:
                assert e[0] == settled_finish_s(model, ix.views[p]) and e[1] is ix.at[e[0]]
            # Every entry, those of earlier stays and other backends too (``memos``): the
            # settled finish at its counts (the first models of this dict, in its order).
            names = list(counts)
            view = copy.copy(ix.views[p])
            for seen, e in memo.items():
                view.queued_by_model = dict(zip(names, seen, strict=False))
                assert len(seen) <= len(names) and e[0] == settled_finish_s(model, view)
                assert e[1] is ix.at[e[0]]


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("seed", range(12))
def test_indexed_decisions_are_the_full_pass(
    spec: Any, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every candidate count through the index (the router skips it below a threshold).
    monkeypatch.setattr(router_module, "INDEX_MIN_CANDIDATES", 1)
    # Half the runs with few lists of tied positions kept (the empty ones dropped often).
    if seed % 2:
        monkeypatch.setattr(finish_index, "BUCKETS_MAX", 3)
    rng = random.Random(seed)
    n = rng.choice([1, 2, 5, 16, 40])
    # Some runs with gaps (a backend without a profile), overloads and tight SLOs, where the
    # index mostly declines; the others calm, where it mostly answers.
    calm = seed % 3 != 0
    fast, ref = _pair(spec, rng, n, rng.choice([None, 0.05]), not calm)
    names = [f"d{i}" for i in range(n)]
    out: list[tuple[str, str, int]] = []  # (backend, model, sent) awaiting an answer
    now = 0.0
    decisions = indexed = 0
    for step in range(1500):
        now += rng.choice([0.0, 0.0001, 0.0005, 0.002, 0.01])
        if rng.random() < 0.01:
            now -= 0.003  # a clock that goes back (the index leaves it to the full pass)
        x = rng.random()
        if x < 0.05 or step == 0:
            for name in names if rng.random() < 0.7 else rng.sample(names, 1):
                s = _sample(rng, now, fast.models_of(name), calm)
                for r in (fast, ref):
                    r.observe(name, s)
        elif x < 0.07:
            for r in (fast, ref):
                r.expire(now)
        elif x < 0.075:
            name, ok = rng.choice(names), rng.random() < 0.6
            for r in (fast, ref):
                r.set_healthy(name, ok)
        elif x < 0.08:
            name = rng.choice(names)
            models = sorted(rng.sample(sorted(PROFILES), rng.randint(1, 3)))
            profiles = {m: PROFILES[m] for m in models} if rng.random() < 0.8 else None
            for r in (fast, ref):
                r.set_models(name, models, profiles=profiles)
        elif x < 0.3 and out:
            i = rng.randrange(len(out))
            name, model, _ = out[i]
            k = sum(1 for o in out if o[0] == name and o[1] == model)
            m = rng.randint(1, k)
            when = None if rng.random() < 0.1 else now
            for r in (fast, ref):
                r.done(name, model, m, when)
            for _ in range(m):
                out.remove(next(o for o in out if o[0] == name and o[1] == model))
        else:
            model = rng.choice(sorted(PROFILES))
            req = RequestInfo(request_id=step, model=model, arrival_s=now)
            exclude = rng.sample(names, 1) if rng.random() < 0.05 else ()
            before = fast._indexed is not None and not exclude
            a = fast.choose(req, now, exclude)
            b = ref.choose(req, now, exclude)
            assert (a and a.name) == (b and b.name), (
                f"step {step}: {a and a.name} vs {b and b.name}"
            )
            decisions += 1
            indexed += before
            for model_ix, ix in fast._indexes.items():
                if not ix.dirty:  # what the index holds is the settled finish, exactly
                    _check_index(model_ix, ix)
            if a is not None:
                for r in (fast, ref):
                    r.sent(a.name, model, now)
                out.append((a.name, model, step))
    assert decisions > 500 and indexed > 400


def test_backends_of_one_kind_share_a_memo_and_a_model_new_to_the_counts_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two backends with the same profiles, caps and counted models share one memo of
    settled finishes; one then gets a send of ``b`` and the other of ``c``, models their
    counts did not name: the same values ((0, 1)) for other models, so neither may take the
    other's figure from that memo (``Router.sent`` takes them out of it)."""
    monkeypatch.setattr(router_module, "INDEX_MIN_CANDIDATES", 1)
    r = Router(ROUTING.build("least-expected-work", random.Random(0)))
    for name in ("d0", "d1"):
        r.add_backend(name, ["a", "b", "c"], profiles=PROFILES, max_batch_size={"a": 4})
        r.observe(name, LoadSample(timestamp_s=0.0, queue_depth=0.0, queued_by_model={"a": 0.0}))
    assert r.choose(RequestInfo(request_id=0, model="a", arrival_s=0.0), 0.0) is not None
    ix = r._indexes["a"]
    q0, q1 = ix.quick
    assert q0 is not None and q1 is not None and q0[0] is q1[0]  # one memo
    r.sent("d0", "b", 0.0)
    r.sent("d1", "c", 0.0)
    assert r.choose(RequestInfo(request_id=1, model="a", arrival_s=0.0), 0.0) is not None
    assert ix.finish[0] != ix.finish[1]
    _check_index("a", ix)


def test_few_candidates_are_decided_without_an_index() -> None:
    """Below ``INDEX_MIN_CANDIDATES`` hosts the full pass decides and no index is kept (no
    upkeep on sends and answers); at it, the index is built."""
    k = router_module.INDEX_MIN_CANDIDATES
    built = {}
    for n in (k - 1, k):
        r = Router(ROUTING.build("least-expected-work", random.Random(0)))
        for i in range(n):
            r.add_backend(f"d{i}", ["a"], profiles={"a": PROFILES["a"]})
        for i in range(3):
            picked = r.choose(RequestInfo(request_id=i, model="a", arrival_s=0.0), 0.0)
            assert picked is not None
            r.sent(picked.name, "a", 0.0)
        built[n] = "a" in r._indexes
    assert built == {k - 1: False, k: True}
