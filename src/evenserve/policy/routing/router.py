"""The routing framework: keeps each backend's signal window, counts its own sends, and asks
the policy.

Theory of operation. A driver (the live gateway or the simulator) feeds ``observe`` with a
backend's load sample every poll interval (100 ms by default) and calls ``sent``/``done``
around each request it forwards. The router keeps the last ``window`` samples per backend and
maintains one mutable BackendView per backend, updated in O(1) on every event, so ``choose``
allocates nothing but the candidate list. The view's queue depth is the mean of the sampled
queue depths plus the requests sent since the newest sample, less those answered since
(``done``): a burst that lands between two polls sees its own earlier members and spreads
out instead of piling onto the backend that looked idlest at the last poll, and (one
gateway) a backend that drained since its report looks drained. A backend whose newest
sample is older than ``stale_after_s`` (checked by ``expire``) has unknown signals:
utilization and memory become None and its queue estimate falls back to the router's own
in-flight count.

Besides the signals, the router keeps what only it knows, exact and current: its own
in-flight count per backend and model, and, when the driver passes its clock to ``sent`` and
``done``, each backend's speed as it answers: per model an EWMA of latency / (requests in
flight there at the send + 1), the seconds each request ahead costs
(``BackendView.latency_per_request_s``). Requests of one model on one backend are answered
about in the order they were sent, so ``done`` pairs an answer with the oldest send. It needs
no profile, so a policy can tell a slow device from a fast one when the gateway has no
profile for it. A backend whose samples carry learned profile figures (profiles that learn:
``LoadSample.profile_scale``, ``observed_ms``) has its view's profiles rebuilt from the base
profiles it was added with (``core.profile_learning.learned_profile``), so profile-reading
policies see a device that slowed down as slow; once its samples stop carrying a model's
figures (learning turned off there), that model's profile is the base one again.
``refusal`` is the front door's overload rule (``routing.refusal``).

Decisions without a pass over every candidate. A policy with ``choose_indexed``
(least-expected-work, queue-aware) decides from a finish index per model
(``routing.finish_index``): each candidate's predicted finish kept in order and recomputed
only for the backends that changed since the last decision (the router tells the index of
every send, answer, load report, staleness and profile or batch-size change: ``_touch``,
``FinishIndex.sent`` and ``changed``), with the
same answer as the policy's full pass over the candidates (``choose``), which decides where
the index cannot (retries with ``exclude``, a backend that needs the fallback cost, a clock
that went back, an overloaded backend for queue-aware). The views are the router's: change
them only through its methods, or the indexes miss the change.

Several gateways in front of the same workers (``replicas``, the gateway's
``gateway.replicas``, the simulator arm's ``gateways``; design 0013). Each router hears every
backend's load report but only its own sends. With ``replicas = N`` > 1 a router counts each
of its sends since the newest sample ``1 + (N - 1) * peer_weight`` times in the queue
estimate (``queue_depth``, ``queued_by_model``; its answers settle as much): behind a
balancer that splits arrivals evenly the other N - 1 gateways send about as much, from
reports like its own, but not to the same backends send for send, so their share is shrunk
by ``peer_weight`` (0.75 by default; 1 counts them in full, which over-counts and costs P99 at
light load; 0 is the naive router). Without it, N routers each add only their own sends to
the same report, so a backend that looked idle at the last report takes N times what any of
them meant to send it before the next one (herding). The router's in-flight counts stay its
own (exact); the refusal rule reads only the reports.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.profile import LatencyProfile
from evenserve.core.profile_learning import learned_profile
from evenserve.core.types import BackendView, LoadSample, RequestInfo
from evenserve.policy.routing.base import RoutingPolicy
from evenserve.policy.routing.finish_index import FinishIndex
from evenserve.policy.routing.refusal import first_taker

#: Weight of the newest answer in a backend's learned seconds per request.
LEARN_ALPHA = 0.05
#: Answers a backend gives (per model) before its learned speed is used: until then the
#: policies take their fallback cost for it. One cold first answer (a model warming up) must
#: not brand a backend slow, and a backend judged slow gets no traffic to correct it.
LEARN_MIN_ANSWERS = 4


class _Lane:
    """What the router keeps of one model on one backend besides the view's figures, in one
    object (a send and an answer read one of these, not a dictionary each)."""

    __slots__ = ("count", "sends", "since", "value")

    def __init__(self) -> None:
        #: Of each request not yet answered, in send order, two entries: when it was sent
        #: and how many were in flight there before it (flat: no tuple per send).
        self.sends: deque[float] = deque()
        #: Sends since the newest sample, net of answers.
        self.since = 0
        #: The learned seconds per request and how many answers it is made of (a running
        #: mean for the first 1 / alpha answers, an EWMA after).
        self.value = 0.0
        self.count = 0


@dataclass(slots=True)
class _BackendState:
    view: BackendView
    models: frozenset[str]
    samples: deque[LoadSample]
    sent_since_sample: int = 0
    healthy: bool = True
    last_sample_s: float | None = None
    in_flight_by_model: dict[str, int] = field(default_factory=dict)
    #: Per model, what the router keeps of it here (made at its first send).
    lanes: dict[str, _Lane] = field(default_factory=dict)
    #: The view's ``queued_by_model`` (the same dict; the router replaces both together).
    queued: dict[str, float] = field(default_factory=dict)
    #: What the policies see (``BackendView.latency_per_request_s``): a model's learned
    #: seconds per request once it has LEARN_MIN_ANSWERS answers.
    learned: dict[str, float] = field(default_factory=dict)
    #: The mean of the sampled queues per model, without this router's sends: what the
    #: backend itself reported, the only evidence the refusal rule takes.
    sampled_queued: dict[str, float] = field(default_factory=dict)
    #: The profiles the backend was added with (profiles that learn start from these) and,
    #: per model, the learned figures its view's profile was last rebuilt from.
    base_profiles: dict[str, LatencyProfile] = field(default_factory=dict)
    learned_from: dict[str, tuple[float, Mapping[int, float]]] = field(default_factory=dict)
    #: The finish indexes this backend is in, and its position in each (``_touch``), and
    #: what they share (``FinishIndex.cells``): its queued work (cleared on every change)
    #: and its batch times by model and queued requests (cleared when its profiles or
    #: batch caps may have changed).
    slots: list[tuple[FinishIndex, int]] = field(default_factory=list)
    cell: list[Any] = field(default_factory=lambda: [None, None])


#: What ``Router.refusal`` keeps of a model's first host that could take a request: the
#: candidate list, when, the host, and its sampled queues and profiles then.
_Taker = tuple[
    Sequence[BackendView], float, _BackendState, dict[str, float], Mapping[str, LatencyProfile]
]

#: A model with fewer candidates than this is decided by the policy's full pass, without a
#: finish index (its upkeep on every send and answer costs more than a pass over a few
#: backends; the decisions are the same either way).
INDEX_MIN_CANDIDATES = 8

#: How much of the other gateways' sends a router adds to its own (``peer_weight``).
PEER_WEIGHT = 0.75


def _ewma_from(alpha: float) -> int:
    """An answer count n >= 1 from which ``1.0 / count <= alpha`` holds for every count
    (correctly rounded division only falls as the count grows)."""
    n = max(1, math.floor(1.0 / alpha) - 1)
    while 1.0 / n > alpha:
        n += 1
    return n


class Router:
    def __init__(
        self,
        policy: RoutingPolicy,
        *,
        window: int = 3,
        stale_after_s: float | None = None,
        learn_alpha: float = LEARN_ALPHA,
        replicas: int = 1,
        peer_weight: float = PEER_WEIGHT,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 < learn_alpha <= 1.0:
            raise ValueError("learn_alpha must be in (0, 1]")
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        if not 0.0 <= peer_weight <= 1.0:
            raise ValueError("peer_weight must be in [0, 1]")
        #: Gateways routing to these backends, this one included (module docstring): each
        #: own send since the newest sample counts this many times in the queue estimate.
        self.replicas = replicas
        #: What one own send since the newest sample counts in the queue estimate.
        self.send_weight = 1.0 + (replicas - 1) * peer_weight
        self.set_policy(policy)
        self.window = window
        self.stale_after_s = stale_after_s
        self.learn_alpha = learn_alpha
        #: Answers after which the running mean's weight (1 / count) is at most ``learn_alpha``
        #: for good: from then on ``done`` folds each answer in with ``learn_alpha`` alone.
        self._ewma_from = _ewma_from(learn_alpha)
        self._backends: dict[str, _BackendState] = {}
        self._by_model: dict[str, list[BackendView]] = {}
        #: Per model, the finish index over its candidates (built at the first decision of
        #: a policy that reads one; dropped when the candidates change).
        self._indexes: dict[str, FinishIndex] = {}
        #: Per model, the first host that could take a request at the last refusal check that
        #: found one, with what it was judged by (``refusal``).
        self._takers: dict[str, _Taker] = {}

    # -- membership -------------------------------------------------------------------------
    def add_backend(
        self,
        name: str,
        models: Iterable[str],
        *,
        profiles: Mapping[str, LatencyProfile] | None = None,
        max_batch_size: Mapping[str, int] | None = None,
        weight: float = 1.0,
    ) -> None:
        if name in self._backends:
            raise ValueError(f"backend {name!r} added twice")
        st = _BackendState(
            view=BackendView(
                name,
                profiles=dict(profiles or {}),
                max_batch_size=dict(max_batch_size or {}),
                weight=weight,
            ),
            models=frozenset(models),
            samples=deque(maxlen=self.window),
            base_profiles=dict(profiles or {}),
        )
        # The view reads the router's own counts and what it learned (the same dicts).
        st.view.in_flight_by_model = st.in_flight_by_model
        st.view.latency_per_request_s = st.learned
        st.view.queued_by_model = st.queued
        self._backends[name] = st
        self._rebuild()

    def set_models(
        self,
        name: str,
        models: Iterable[str],
        *,
        profiles: Mapping[str, LatencyProfile] | None = None,
    ) -> None:
        """``name`` now hosts ``models`` (the gateway learns this from the backend's
        repository index): candidates change at once. The backend's signal window, in-flight
        counts and health are kept; what the router knew of a removed model there (its
        learned speed, sends awaiting an answer, sampled queue, profile) is dropped, except
        its in-flight count while requests of it are still out (``done`` settles them).
        ``profiles`` (None: keep what it has) are the profiles of the new set's models."""
        st = self._backends[name]
        new = frozenset(models)
        if new == st.models and profiles is None:
            return
        v = st.view
        for m in st.models - new:
            if not st.in_flight_by_model.get(m):
                st.in_flight_by_model.pop(m, None)
            st.learned.pop(m, None)
            st.lanes.pop(m, None)
            st.sampled_queued.pop(m, None)
            st.queued.pop(m, None)
        profs = dict(v.profiles) if profiles is None else dict(profiles)
        if profiles is not None:
            # A model kept, on the same base profile, keeps what was learned of it there.
            old_base, st.base_profiles = st.base_profiles, dict(profiles)
            for m in list(st.learned_from):
                if m not in new or old_base.get(m) is not st.base_profiles.get(m):
                    del st.learned_from[m]
                elif m in v.profiles:
                    profs[m] = v.profiles[m]
        v.profiles = {m: p for m, p in profs.items() if m in new}
        changed = new != st.models
        st.models = new
        if changed:
            self._rebuild()
        else:
            self._touch(st, True)

    def models_of(self, name: str) -> frozenset[str]:
        return self._backends[name].models

    def set_policy(self, policy: RoutingPolicy) -> None:
        self.policy = policy
        #: The policy's decision from a finish index (``routing.finish_index``), if it has one.
        self._indexed = getattr(policy, "choose_indexed", None)

    def set_healthy(self, name: str, healthy: bool) -> None:
        st = self._backends[name]
        if st.healthy != healthy:
            st.healthy = healthy
            self._rebuild()

    def view(self, name: str) -> BackendView:
        return self._backends[name].view

    def learned_scales(self, name: str) -> dict[str, float]:
        """Per model, the learned scale its profile follows on backend ``name`` (profiles
        that learn; empty when the backend does not learn)."""
        return {m: scale for m, (scale, _obs) in self._backends[name].learned_from.items()}

    def candidates(self, model: str) -> Sequence[BackendView]:
        """Healthy backends hosting ``model``, in a stable order."""
        return self._by_model.get(model, ())

    def _rebuild(self) -> None:
        by_model: dict[str, list[BackendView]] = {}
        for st in self._backends.values():
            st.slots = []
            st.cell[0] = st.cell[1] = None
            if not st.healthy:
                continue
            for m in sorted(st.models):
                by_model.setdefault(m, []).append(st.view)
        self._by_model = by_model
        self._indexes = {}

    def _index(self, model: str, cands: list[BackendView]) -> FinishIndex:
        ix = self._indexes.get(model)
        if ix is None:
            states = [self._backends[v.name] for v in cands]
            ix = self._indexes[model] = FinishIndex(model, cands, [st.cell for st in states])
            for p, st in enumerate(states):
                st.slots.append((ix, p))
        return ix

    @staticmethod
    def _touch(st: _BackendState, signals: bool = False) -> None:
        """``st``'s view changed: its finish indexes recompute it (``signals``: its
        utilization, memory or SLO may have changed too)."""
        st.cell[0] = None
        if signals:
            st.cell[1] = None
        for ix, p in st.slots:
            ix.changed(p)
            if signals:
                ix.sig_dirty.add(p)
                ix.quick[p] = None

    def update_max_batch_size(self, name: str, caps: Mapping[str, int]) -> None:
        """Merge ``caps`` into what the router knows of how ``name`` batches each model
        (the simulator's placement, when a model becomes ready there before a report says
        so)."""
        st = self._backends[name]
        mbs = st.view.max_batch_size
        if isinstance(mbs, dict):
            mbs.update(caps)
        self._takers.clear()  # changed in place: the refusal rule judges anew
        self._touch(st, True)

    # -- signals ----------------------------------------------------------------------------
    def observe(self, name: str, sample: LoadSample) -> None:
        st = self._backends.get(name)
        if st is None:
            return
        st.samples.append(sample)
        st.last_sample_s = sample.timestamp_s
        st.sent_since_sample = 0
        for lane in st.lanes.values():
            lane.since = 0
        if sample.profile_scale or st.learned_from:
            self._learn(st, sample)
        self._refresh(st)
        if st.slots:
            self._touch(st, True)

    def _learn(self, st: _BackendState, sample: LoadSample) -> None:
        """Profiles that learn: the backend reports each model's learned scale and smoothed
        batch times; its view's profile becomes the base profile learned the same way
        (``core.profile_learning.learned_profile``), rebuilt only when the figures moved. A
        model learned before whose figures the report no longer carries (learning turned off
        there) goes back to its base profile."""
        observed = sample.observed_ms
        changed = False
        profiles = dict(st.view.profiles)
        for m in [m for m in st.learned_from if m not in sample.profile_scale]:
            del st.learned_from[m]
            base = st.base_profiles.get(m)
            if base is not None and m in st.models:
                profiles[m] = base
                changed = True
        for m, scale in sample.profile_scale.items():
            base = st.base_profiles.get(m)
            if base is None or m not in st.models:
                continue
            obs = observed.get(m, {})
            if st.learned_from.get(m) == (scale, obs):
                continue
            st.learned_from[m] = (scale, obs)
            profiles[m] = learned_profile(base, scale, obs)
            changed = True
        if changed:
            st.view.profiles = profiles

    def _refresh(self, st: _BackendState) -> None:
        v = st.view
        samples = st.samples
        n = len(samples)
        newest = samples[-1]
        v.signals_fresh = True
        r = self.send_weight
        v.queue_depth = sum(s.queue_depth for s in samples) / n + st.sent_since_sample * r
        utils = [s.utilization for s in samples if s.utilization is not None]
        v.utilization = sum(utils) / len(utils) if utils else None
        v.memory_total_bytes = newest.memory_total_bytes
        frees = [f for f in (s.memory_free_bytes for s in samples) if f is not None]
        v.memory_free_bytes = sum(frees) / len(frees) if frees else None
        v.busy_remaining_s = newest.busy_remaining_s
        v.sampled_at_s = newest.timestamp_s
        caps = newest.max_batch_size
        if caps and caps is not v.max_batch_size and caps != v.max_batch_size:
            v.max_batch_size = caps
        if newest.slo_s and newest.slo_s is not v.slo_s:
            v.slo_s = newest.slo_s
        if newest.max_queue and newest.max_queue is not v.max_queue:
            v.max_queue = newest.max_queue
        qbm: dict[str, float] = {}
        for s in samples:
            for m, q in s.queued_by_model.items():
                qbm[m] = qbm.get(m, 0.0) + q / n
        st.sampled_queued = dict(qbm)
        for m, lane in st.lanes.items():
            if lane.since:
                qbm[m] = qbm.get(m, 0.0) + lane.since * r
        v.queued_by_model = st.queued = qbm

    def expire(self, now_s: float) -> list[str]:
        """Mark backends whose newest sample is too old as unknown; return their names."""
        if self.stale_after_s is None:
            return []
        stale = []
        for name, st in self._backends.items():
            v = st.view
            if v.signals_fresh and (
                st.last_sample_s is None or now_s - st.last_sample_s > self.stale_after_s
            ):
                v.signals_fresh = False
                v.utilization = None
                v.memory_free_bytes = None
                v.queue_depth = float(v.in_flight)
                v.busy_remaining_s = 0.0
                v.queued_by_model = st.queued = {}
                stale.append(name)
                self._touch(st, True)
        return stale

    def signal_age_s(self, name: str, now_s: float) -> float | None:
        last = self._backends[name].last_sample_s
        return None if last is None else now_s - last

    # -- decisions --------------------------------------------------------------------------
    def choose(
        self, request: RequestInfo, now_s: float, exclude: Iterable[str] = ()
    ) -> BackendView | None:
        """The policy's pick among healthy hosts of the model (None if there are none)."""
        indexed = self._indexed
        if indexed is not None and not exclude:
            ix = self._indexes.get(request.model)
            if ix is None:
                cands = self._by_model.get(request.model)
                if not cands:
                    return None
                if len(cands) < INDEX_MIN_CANDIDATES:  # the full pass is cheaper
                    return self.policy.choose(request, cands, now_s)
                ix = self._index(request.model, cands)
            view = indexed(request, ix, now_s)  # None: the index cannot answer this one
            return view if view is not None else self.policy.choose(request, ix.views, now_s)
        cands = self._by_model.get(request.model)
        if not cands:
            return None
        if exclude:
            excluded = set(exclude)
            cands = [b for b in cands if b.name not in excluded]
            if not cands:
                return None
        return self.policy.choose(request, cands, now_s)

    def refusal(self, model: str, now_s: float) -> str | None:
        """Why the front door should refuse a request of ``model`` now (every healthy host
        full or predicted late past the model's SLO, on the hosts' own evidence: their
        sampled queues, without this router's sends since, which may be running rather than
        waiting), or None. See ``routing.refusal``; the gateway answers 429 with it, the
        simulator drops the request."""
        hosts = self._by_model.get(model, ())
        kept = self._takers.get(model)
        # The first host that could take one when last judged still can (``routing.refusal``:
        # its verdict holds later while its evidence is the same): a report replaces its
        # sampled queues (and brings every other figure it is judged by), new profiles
        # replace its profiles, new hosts make a new candidate list, and batch caps changed
        # in place clear what is kept; going stale only makes it "no evidence" (None) too.
        if kept is not None and kept[0] is hosts and now_s >= kept[1]:
            st = kept[2]
            if st.sampled_queued is kept[3] and st.view.profiles is kept[4]:
                return None
        states = [self._backends[b.name] for b in hosts]
        i, why = first_taker(model, hosts, now_s, [st.sampled_queued for st in states])
        if i >= 0:
            st = states[i]
            self._takers[model] = (hosts, now_s, st, st.sampled_queued, st.view.profiles)
        return why

    def sent(self, name: str, model: str, now_s: float | None = None) -> None:
        """A request of ``model`` goes to ``name`` (``now_s``: the driver's clock, to learn
        the backend's speed from when it is answered)."""
        st = self._backends[name]
        v = st.view
        n = v.in_flight
        lane = st.lanes.get(model)
        if lane is None:
            lane = st.lanes[model] = _Lane()
        if now_s is not None:
            sends = lane.sends
            sends.append(now_s)
            sends.append(n)
        v.in_flight = n + 1
        ifm = st.in_flight_by_model
        ifm[model] = ifm.get(model, 0) + 1
        r = self.send_weight
        v.queue_depth += r if v.signals_fresh else 1.0
        st.sent_since_sample += 1
        lane.since += 1
        qbm = st.queued
        q = qbm.get(model)
        qbm[model] = r if q is None else q + r
        slots = st.slots
        if slots:
            st.cell[0] = None
            if q is None:  # a model its counts did not name: their memo is not this one's
                for ix, p in slots:
                    ix.quick[p] = None
                    ix.changed(p)
            else:
                for ix, p in slots:
                    ix.sent(p, model)

    def done(self, name: str, model: str, n: int = 1, now_s: float | None = None) -> None:
        """``n`` requests of ``model`` sent to ``name`` finished (answered or failed); with
        ``now_s`` (the driver's clock) they were answered then, and the backend's learned
        seconds per request moves toward what they took (leave it None for a failure or a
        refusal: a quick 429 says nothing about the device's speed).

        Besides the in-flight count, this settles the queue estimate (fresh signals). One
        gateway (``replicas`` 1): an answer takes away what its send added, below the
        reported queue too (never below zero); between two reports the estimate is the
        reported queue plus the sends since, less the answers since (each answer is a request
        out of the queue or, when a batch ends, about one the next batch takes from it), so a
        backend that drained since its report looks drained. Until design 0016's saturation
        runs answers stopped at the reported queue, and a drained backend kept it until the
        next report and got no traffic while it sat idle: at 97 % of the devices' capacity
        least-expected-work and queue-aware had twice least-connections' P99. Several
        gateways: an answer takes away one of this router's sends since the report (each
        counted ``send_weight`` times) but never goes below the report, since the other
        gateways' sends, unseen here, may have filled the backend again (going below cost
        5-6 % P99 with two gateways on the seed scenario). Without settling at all, at high
        throughput the sends between two polls pile up (2,500 req/s and a 100 ms poll: +250
        on an idle backend), so the fastest backends look the most loaded and queue-aware's
        soft-overload rule fires on idle ones. The gateway and the simulator both call this
        (the simulator once per finished batch).
        """
        st = self._backends.get(name)
        if st is None:
            return
        v = st.view
        lane = st.lanes.get(model)
        sends = None if lane is None else lane.sends
        if sends and lane is not None:
            popleft = sends.popleft
            k = len(sends) >> 1  # two entries a send
            if n < k:
                k = n
            if now_s is None:
                for _ in range(k):
                    popleft()
                    popleft()
            elif k == 1 and lane.count >= self._ewma_from:  # one answer (the gateway's)
                sent_s = popleft()
                value = lane.value
                value = value + self.learn_alpha * ((now_s - sent_s) / (popleft() + 1) - value)
                lane.value = value
                lane.count = count = lane.count + 1
                if count >= LEARN_MIN_ANSWERS:
                    st.learned[model] = value
            elif k > 0:
                # The running mean, then EWMA, of latency / (in flight at the send + 1); the
                # first answer starts it at its own figure.
                alpha = self.learn_alpha
                value, count = lane.value, lane.count
                if count >= self._ewma_from:  # the weight is alpha for every one of them
                    for _ in range(k):
                        sent_s = popleft()
                        value = value + alpha * ((now_s - sent_s) / (popleft() + 1) - value)
                    count += k
                else:
                    for _ in range(k):
                        sent_s = popleft()
                        x = (now_s - sent_s) / (popleft() + 1)
                        if not count:
                            value = x
                        count += 1
                        w = 1.0 / count
                        if w <= alpha:
                            w = alpha
                        value = value + w * (x - value)
                lane.value, lane.count = value, count
                if count >= LEARN_MIN_ANSWERS:
                    st.learned[model] = value
        ifm = st.in_flight_by_model
        mine = ifm.get(model, 0)
        k = n if n < mine else mine  # never more of a model than were sent
        step: tuple[str, int] | None = None  # how the queued counts moved, when only so
        if k > 0:
            ifm[model] = mine - k
            v.in_flight -= k
            if not v.signals_fresh:
                q = v.queue_depth - k
                v.queue_depth = q if q > 0.0 else 0.0
            elif self.replicas == 1:  # every answer takes away what its send added
                q = v.queue_depth - k
                v.queue_depth = q if q > 0.0 else 0.0
                qbm = st.queued
                if model in qbm:
                    q = qbm[model] - k
                    qbm[model] = q if q > 0.0 else 0.0
                    step = (model, k)
            else:  # several gateways: down to the report, not below it
                since = st.sent_since_sample
                if since > 0:
                    r = self.send_weight
                    k = k if k < since else since
                    st.sent_since_sample = since - k
                    q = v.queue_depth - k * r
                    v.queue_depth = q if q > 0.0 else 0.0
                    mine = 0 if lane is None else lane.since
                    if mine > 0 and lane is not None:
                        k = k if k < mine else mine
                        lane.since = mine - k
                        qbm = st.queued
                        if model in qbm:
                            q = qbm[model] - k * r
                            qbm[model] = q if q > 0.0 else 0.0
        slots = st.slots
        if slots:
            st.cell[0] = None
            if step is None:
                for ix, p in slots:
                    ix.changed(p)
            else:  # the counts alone moved, by a step an index can follow as a send's
                for ix, p in slots:
                    ix.sent(p, step)
