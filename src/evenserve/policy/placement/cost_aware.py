"""cost-aware: evict by what an eviction is expected to cost, not by recency (ours).

**Cost of evicting model m from device d.** If a request for m arrives before m is back, it
waits for the reload (``view.load_s(m)``: warm or cold). With m's demand ``r`` (requests per
second) and ``k`` READY replicas of m on other active devices, each serving up to
``c = capacity_rps(m)``, the rate the eviction leaves without a device is
``u = r`` when ``k = 0`` and ``u = max(0, r - k * c)`` otherwise (no cost when another
replica has the spare capacity). The expected cost is the requests that arrive during one
reload and must wait for it::

    cost(m, d) = u * load_s(m)

(``u * load_s`` is also the expected number of arrivals in the reload window, so a model
that is rarely asked for costs about its probability of being asked for before it is back).
A model with no demand (``r < idle_rps``, default 0.1 req/s) costs 0: among those, the
least recently used goes first.

**Which evictions.** To make room for a model on d, take d's evictable residents (READY, no
request outstanding there, not changed within ``hold_s``) in increasing cost per byte freed
(ties: least recently used, name), until the model fits; then drop, last chosen first, any
victim not needed after all. Greedy by cost per byte is the usual knapsack heuristic: it
frees the bytes at the least cost per byte, so one large idle model goes before several
small busy ones, which is what LRU gets wrong (the ModelMesh complaint: one large model's
load evicting most of the others, each of which then misses and reloads).

**What a miss may evict.** A miss for m is worth ``benefit = max(r_m, idle_rps) *
load_s(m)``: the requests of m that arrive during one load (the same unit as a cost). It
evicts only models whose cost, each and all together, is below that; when no device can
take m at that price the answer is ``[]`` (503 with Retry-After) and the right fix is more
memory (the ``demand`` autoscaler's memory-pressure rule sees m's demand and adds a
device). Why: with more weights wanted than memory, an eviction of a model with demand is
a miss later, whose reload evicts another (the thrash, where every load costs an eviction
and a reload). With the strict inequality two models cannot evict each other back and forth
at steady rates (the one worth more stays), and ``hold_s`` covers the drift of the rates.

**Where a miss goes.** Among the devices that can take it: first those with the free memory
already (no eviction at all: a load that evicts four small models counts four evictions),
then the least ``sum cost(victims) + balance_weight * utilization(d)`` (ties: fewer
evictions, more free bytes after the load, name). If no device can take it without evicting
a model changed within ``hold_s``, such models are considered too (a request is waiting).

**rebalance**, with ``R`` replicas (READY or LOADING) of m and ``c`` as above:

- down first: ``R >= 2`` and ``r < low_utilization * (R - 1) * c``: unload one READY replica
  without outstanding requests (the least recently used one, ties: busiest device, name).
  ``R - 1 >= 1`` keeps one replica while ``r > 0`` (a cache keeps even an idle model until
  its memory is wanted). Not before the demand estimates have observed for ``hold_s``
  (``ClusterView.observed_s``): a rate of 0 read over the first second of a gateway that
  was started before its traffic is no evidence, and without this rule the first rebalance
  took every replica of the configured layout off a device (the one the tie-break picks)
  before the first request came (design note 0022). The idle unload below counts from the
  first view that saw the model resident, so it waits ``idle_unload_s`` from the start too.
- then up, hottest first: ``R >= 1``, none LOADING, and ``r > target_utilization * R * c``:
  one more replica where a miss would go, in free memory or in the room of models without
  demand only (cost 0): never a model with demand, which would miss and whose reload would
  evict another.
- then busy devices: a device over ``busy_utilization`` (0.85) gets one more replica,
  elsewhere, of its READY model with the largest ``share = r / (R * c)`` (the fraction of a
  device each replica is kept busy by; not one LOADING anywhere, nor changed in this call,
  nor unloaded within ``hold_s``), placed as above, and only on a device below
  ``target_utilization`` (a replica on a busy device relieves nothing). ``c`` is the
  capacity at full batches, which small batches do not reach: the per-model rule misses a
  device made busy by several models, or by one at small batches; the device's own
  utilization does not.
- no pre-loads (an unhosted model is placed by its first miss).
- last, with ``idle_unload_s`` set (None: off): every evictable resident without demand
  (``r < idle_rps``) that no request used here for ``idle_unload_s``, and not changed here
  within ``hold_s``, is unloaded: into host memory (warm), an LLM engine put to sleep, to
  be woken by its next miss (design note 0022). Off, an idle model stays until its memory
  is wanted.

**Hysteresis.** The policy keeps, per (model, device), when it last loaded or unloaded it
there. Nothing changed within ``hold_s`` is undone: rebalance does not unload a model it
loaded there, nor reload one it unloaded there, within ``hold_s``; a model's replica count
does not go down within ``hold_s`` of adding one anywhere, nor up within ``hold_s`` of
rebalance removing one (a miss's eviction makes room: it is not a removal, and holding the
model's count after it left a hot model short of replicas for ``hold_s``). A miss's load
is recorded like a rebalance's, so the hold covers it too. The state depends only on the
sequence of views and actions, so the policy is deterministic.

Params: ``target_utilization`` (0.7), ``low_utilization`` (0.3), ``hold_s`` (10),
``balance_weight`` (1.0, in the unit of a cost: requests), ``idle_rps`` (0.1),
``busy_utilization`` (0.85), ``idle_unload_s`` (None).
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from evenserve.policy.placement.base import (
    LOADING,
    PLACEMENT,
    Action,
    ClusterView,
    DeviceView,
    Load,
    Unload,
)
from evenserve.policy.placement.common import (
    apply_actions,
    argmin,
    evictable,
    fits,
    free_after,
    plan,
    prune,
    ready_replicas,
    share,
    targets,
)
from evenserve.policy.registry import PolicyParams


class CostAwareParams(PolicyParams):
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    low_utilization: float = Field(default=0.3, ge=0, le=1)
    hold_s: float = Field(default=10.0, ge=0)
    balance_weight: float = Field(default=1.0, ge=0)
    idle_rps: float = Field(default=0.1, ge=0)
    busy_utilization: float = Field(default=0.85, gt=0, le=1)
    idle_unload_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _low_below_target(self) -> CostAwareParams:
        if self.low_utilization >= self.target_utilization:
            raise ValueError("low_utilization must be below target_utilization")
        return self


def eviction_cost(view: ClusterView, model: str, device: str, idle_rps: float = 0.0) -> float:
    """``u * load_s(model)``: the requests expected to wait for a reload (module docstring);
    0 for a model whose demand is below ``idle_rps`` (no demand)."""
    rate = view.rate_rps.get(model, 0.0)
    if rate < idle_rps:
        return 0.0
    others = ready_replicas(view, model, besides=device)
    unserved = max(0.0, rate - others * view.models[model].capacity_rps) if others else rate
    return unserved * view.load_s(model)


@PLACEMENT.register(
    "cost-aware", CostAwareParams, "evict by expected reload cost; replicas follow demand"
)
class CostAwarePlacement:
    def __init__(self, params: CostAwareParams) -> None:
        self.params = params
        #: (model, device) -> (when, "load" | "unload") of this policy's last change there.
        self._changed: dict[tuple[str, str], tuple[float, str]] = {}
        #: (model, device) -> the first rebalance that saw it resident there (idle unloads).
        self._seen: dict[tuple[str, str], float] = {}

    def _used_s(self, d: DeviceView, model: str, now_s: float) -> float:
        """When ``model`` was last used on ``d``: a request sent there, else the first view
        this policy saw it resident there in (a model never asked for is not idle since
        forever: it was just placed, or the run just began)."""
        first = self._seen.setdefault((model, d.name), now_s)
        return d.last_used_s.get(model, first)

    # -- hysteresis --------------------------------------------------------------------

    def _held(self, model: str, device: str, now_s: float) -> bool:
        last = self._changed.get((model, device))
        return last is not None and now_s - last[0] < self.params.hold_s

    def _recent(self, model: str, kind: str, now_s: float) -> bool:
        return any(
            m == model and k == kind and now_s - t < self.params.hold_s
            for (m, _), (t, k) in self._changed.items()
        )

    def _record(self, now_s: float, actions: list[Action], *, miss: bool = False) -> None:
        """Remember each change; a miss's unloads as "evict": they make room and do not
        count as a replica removed (which would hold the model's replica count)."""
        for a in actions:
            kind = "load" if isinstance(a, Load) else "evict" if miss else "unload"
            self._changed[(a.model, a.device)] = (now_s, kind)

    # -- choosing victims and a device -------------------------------------------------

    def _victims(
        self, view: ClusterView, model: str, d: DeviceView, budget: float, with_held: bool
    ) -> tuple[list[str], float] | None:
        """The evictions making room for ``model`` on ``d`` (each and all costing less than
        ``budget``) and their total cost, or None."""
        costs = {
            m: eviction_cost(view, m, d.name, self.params.idle_rps)
            for m in evictable(d)
            if with_held or not self._held(m, d.name, view.now_s)
        }
        if budget <= 0.0:  # only models without demand may go
            costs = {m: c for m, c in costs.items() if c == 0.0}
        elif math.isfinite(budget):
            costs = {m: c for m, c in costs.items() if c < budget}
        order = sorted(
            costs,
            key=lambda m: (
                costs[m] / max(view.models[m].device_bytes, 1.0),
                d.last_used_s.get(m, -math.inf),
                m,
            ),
        )
        chosen: list[str] = []
        for m in order:
            if fits(d, view.models, model, chosen):
                break
            chosen.append(m)
        if not fits(d, view.models, model, chosen):
            return None
        chosen = prune(d, view.models, model, chosen)
        total = sum(costs[m] for m in chosen)
        if 0.0 < budget < math.inf and chosen and total >= budget:
            return None
        return chosen, total

    def _place(
        self, view: ClusterView, model: str, budget: float, with_held: bool, rebalancing: bool
    ) -> list[Action]:
        options = []
        for d in targets(view, model):
            if rebalancing and self._held(model, d.name, view.now_s):
                continue
            found = self._victims(view, model, d, budget, with_held)
            if found is None:
                continue
            victims, cost = found
            key = (
                1 if victims else 0,  # free memory first: no eviction at all if possible
                cost + self.params.balance_weight * d.utilization,
                len(victims),
                -free_after(d, view.models, model, victims),
                d.name,
            )
            options.append((key, plan(model, d.name, victims)))
        return argmin(options)

    # -- the interface -----------------------------------------------------------------

    def on_miss(self, model: str, view: ClusterView) -> list[Action]:
        if view.hosts(model):
            return []
        benefit = max(view.rate_rps.get(model, 0.0), self.params.idle_rps) * view.load_s(model)
        actions = self._place(view, model, benefit, with_held=False, rebalancing=False)
        if not actions:
            actions = self._place(view, model, benefit, with_held=True, rebalancing=False)
        self._record(view.now_s, actions, miss=True)
        return actions

    def rebalance(self, view: ClusterView) -> list[Action]:
        p, now = self.params, view.now_s
        actions: list[Action] = []
        work = view
        evidence = view.observed_s >= p.hold_s
        for model in sorted(view.models) if evidence else []:  # down first: frees memory
            rate, cap = view.rate_rps.get(model, 0.0), view.models[model].capacity_rps
            hosts = work.hosts(model)
            if len(hosts) < 2 or not rate < p.low_utilization * (len(hosts) - 1) * cap:
                continue
            if self._recent(model, "load", now):
                continue
            idle = [
                d
                for d in hosts
                if d.ready(model)
                and d.outstanding.get(model, 0) == 0
                and not self._held(model, d.name, now)
            ]
            if not idle:
                continue
            d = min(
                idle,
                key=lambda d: (d.last_used_s.get(model, -math.inf), -d.utilization, d.name),
            )
            step: list[Action] = [Unload(model, d.name)]
            actions += step
            work = apply_actions(work, step)

        def overflow(model: str) -> float:
            cap = view.models[model].capacity_rps
            replicas = len(work.hosts(model))
            return view.rate_rps.get(model, 0.0) - p.target_utilization * replicas * cap

        hot = [
            m
            for m in view.models
            if work.hosts(m)
            and not any(d.models.get(m) == LOADING for d in work.hosts(m))
            and overflow(m) > 0
            and not self._recent(m, "unload", now)
        ]
        for model in sorted(hot, key=lambda m: (-overflow(m) / view.models[m].capacity_rps, m)):
            # A replica takes free memory, or the room of models without demand: never a
            # model with demand (it would miss, and its reload evict another: the thrash).
            step = self._place(work, model, 0.0, with_held=False, rebalancing=True)
            actions += step
            work = apply_actions(work, step)

        # A busy device: one more replica, elsewhere, of its model with the most work.
        for d in sorted(work.devices, key=lambda d: d.name):
            if not d.active or d.utilization <= p.busy_utilization:
                continue
            movable = [
                m
                for m, state in d.models.items()
                if state != LOADING
                and not any(h.models.get(m) == LOADING for h in work.hosts(m))
                and not self._recent(m, "unload", now)
                and not any(a.model == m for a in actions)  # nothing undone in one call
            ]
            if not movable:
                continue
            model = max(movable, key=lambda m: (share(work, m), m))
            step = self._place(work, model, 0.0, with_held=False, rebalancing=True)
            if (
                step
                and work.device(next(a.device for a in step if isinstance(a, Load))).utilization
                < p.target_utilization
            ):
                actions += step
                work = apply_actions(work, step)

        if p.idle_unload_s is not None:  # idle models go to host memory (asleep)
            touched = {(a.model, a.device) for a in actions}
            for d in sorted(work.devices, key=lambda d: d.name):
                if not d.active:
                    continue
                for m, name in [k for k in self._seen if k[1] == d.name]:
                    if m not in d.models:  # it left: a later placement starts afresh
                        del self._seen[(m, name)]
                for m in evictable(d):
                    if (
                        (m, d.name) not in touched
                        and view.rate_rps.get(m, 0.0) < p.idle_rps
                        and now - self._used_s(d, m, now) >= p.idle_unload_s
                        and not self._held(m, d.name, now)
                    ):
                        actions.append(Unload(m, d.name))
        self._record(now, actions)
        return actions
