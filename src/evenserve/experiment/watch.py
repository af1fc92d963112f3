"""The watch loop (``evenserve tune --watch URL --every 5m``): tune on the recent traffic, apply
a change only when the simulator predicts it better by a margin, roll it back when live P99
says otherwise.

Theory of operation. Every window (``--every``) the loop pulls the gateway's request log of
the window just ended (``GET /admin/log``) and the parameters in force (``GET /admin/params``),
and takes one of these steps; at most one change (an apply or a rollback) per window:

1. **Evaluate a pending change**: one the loop applied at the start of the window just
   ended, or one anybody else applied (a version the loop did not know: judged on the
   requests that arrived after its ``applied_unix_s`` when they span half a window or more,
   else over the next window). The simulator replays those same arrivals under the new
   parameters and under the previous ones; the live P99 is compared with both, each
   multiplied by the calibration (below). The change is rolled back
   (``POST /admin/params/rollback`` to the previous version) when

   - live P99 > (1 + ``rollback_over``) x calibrated prediction of the new parameters (the
     loop's own change: the issue's guardrail, 15 % by default), or
   - live P99 > (1 + ``rollback_over``) x calibrated prediction of the previous parameters
     on the same traffic (any change: it made things worse than not changing would have).

   Otherwise it is kept. Either way nothing else changes in that window.
2. **Otherwise tune.** The calibration is updated: live P99 / simulated P99 of the parameters
   in force, on the same window (the live path costs what the simulator leaves out: HTTP
   hops, a busy host), clamped to [0.5, 4]. The tuner searches from the parameters in force
   on the window's arrivals; the best candidate is pushed (``PUT /admin/params`` with the
   expected version) only if its predicted P99 is at least ``margin`` (10 %) below the
   current parameters' predicted P99 on the same arrivals, with predicted goodput no lower
   than the current's x (1 - ``goodput_tolerance``). Each window's search first tries the
   best sets of the last three windows (``SimPredictor.elite``): a small
   budget a window adds up to a longer search across windows.

No oscillation: a change needs a margin to be applied and is judged over a whole window
after it; a rolled-back parameter set is not applied again for ``cooldown_windows`` windows;
a window with fewer than ``min_requests`` answered requests decides nothing.

The rules (``WatchPolicy``) are pure: the gateway and the simulator come in through the
``WatchClient`` and ``Predictor`` protocols, so tests drive them with fakes.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np

from evenserve.core.errors import EvenserveError
from evenserve.experiment import tune as tuning
from evenserve.httpio.params_client import get_params, push_params, rollback_params
from evenserve.sim.loader import LoadedScenario

Params = dict[str, Any]
Record = dict[str, Any]
#: Earlier windows' best sets each window's search tries first.
ELITE = 3


@dataclass(frozen=True)
class Figures:
    """What the loop compares: P99 of answered requests (ms), goodput (in-SLO answers per
    second) and how many requests were answered."""

    p99_ms: float | None
    goodput_rps: float
    answered: int


class WatchClient(Protocol):
    """The gateway, as the loop sees it (``gateway`` admin API)."""

    def get_params(self) -> dict[str, Any]: ...

    def put_params(self, params: Params, expected_version: int, note: str) -> dict[str, Any]: ...

    def rollback(self, to_version: int, expected_version: int, note: str) -> dict[str, Any]: ...

    def pull_log(self, since_unix_s: float) -> list[Record]: ...

    def learned_scales(self) -> dict[str, dict[str, float]]:
        """Per backend, per model, the learned profile scale (profiles that learn)."""
        ...


class Predictor(Protocol):
    """The simulator, as the loop sees it: replay recorded arrivals under parameters;
    ``observe_devices`` hands it the backends' learned profile scales each window."""

    def observe_devices(self, scales: Mapping[str, Mapping[str, float]]) -> None: ...

    def predict(self, records: Sequence[Record], params: Params) -> Figures: ...

    def tune(self, records: Sequence[Record], params: Params) -> tuple[Params, Figures]: ...


def live_figures(
    records: Sequence[Record], slo_ms: Mapping[str, float], window_s: float
) -> Figures:
    """Figures of recorded answers: P99 over status-200 answers, goodput over ``window_s``."""
    ok = [r for r in records if r.get("status") == 200 and r.get("latency_ms") is not None]
    if not ok:
        return Figures(None, 0.0, 0)
    lat = np.array([float(r["latency_ms"]) for r in ok])
    good = sum(1 for r in ok if float(r["latency_ms"]) <= slo_ms.get(str(r.get("model")), math.inf))
    return Figures(float(np.percentile(lat, 99)), good / window_s if window_s > 0 else 0.0, len(ok))


def _key(params: Params) -> str:
    return json.dumps(params, sort_keys=True)


@dataclass
class Pending:
    """A change being judged over the window after it."""

    version: int
    previous_version: int
    previous_params: Params
    params: Params
    own: bool


@dataclass
class WatchEvent:
    """One window's step: ``action`` is apply, keep, rollback, hold, noticed, skip or error
    (the step failed: the gateway did not answer, or refused a change)."""

    window: int
    unix_s: float
    action: str
    reason: str
    version: int | None = None
    live_p99_ms: float | None = None
    predicted_p99_ms: float | None = None
    calibration: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class WatchPolicy:
    """The loop's rules (see the module docstring); one ``step`` per window."""

    slo_ms: Mapping[str, float]
    window_s: float
    margin: float = 0.10
    rollback_over: float = 0.15
    goodput_tolerance: float = 0.005
    min_requests: int = 200
    cooldown_windows: int = 3
    calibration: float = 1.0
    known_version: int | None = None
    pending: Pending | None = None
    windows: int = 0
    banned: dict[str, int] = field(default_factory=dict)
    events: list[WatchEvent] = field(default_factory=list)

    def _event(self, now: float, action: str, reason: str, **kw: Any) -> WatchEvent:
        e = WatchEvent(self.windows, now, action, reason, **kw)
        self.events.append(e)
        return e

    def step(
        self, client: WatchClient, predictor: Predictor, records: Sequence[Record], now: float
    ) -> WatchEvent:
        self.windows += 1
        predictor.observe_devices(client.learned_scales())
        cur = client.get_params()
        version, params = int(cur["version"]), dict(cur["params"])
        if self.known_version is None:
            self.known_version = version
        live = live_figures(records, self.slo_ms, self.window_s)
        pend = self.pending
        if pend is not None and pend.version == version:
            self.pending = None
            return self._judge(client, predictor, records, pend, live, now)
        if version != self.known_version:
            prev = self._params_of(cur, self.known_version)
            pend = Pending(version, self.known_version, prev, params, own=False)
            self.known_version = version
            # Judged at once on the requests that arrived after it, when they are enough
            # (at least half a window of them); else over the next window.
            applied = self._applied_unix_s(cur, version)
            after = [r for r in records if float(r.get("unix_s", 0.0)) >= applied]
            if len(after) >= self.min_requests and _span_s(after) >= self.window_s / 2:
                return self._judge(
                    client,
                    predictor,
                    after,
                    pend,
                    live_figures(after, self.slo_ms, _span_s(after)),
                    now,
                )
            self.pending = pend
            return self._event(
                now,
                "noticed",
                f"version {version} was applied by someone else; judged over the next window",
                version=version,
                live_p99_ms=live.p99_ms,
            )
        self.pending = None
        if live.answered < self.min_requests or live.p99_ms is None:
            return self._event(
                now, "skip", f"{live.answered} answers in the window (< {self.min_requests})"
            )
        sim_now = predictor.predict(records, params)
        if sim_now.p99_ms and sim_now.p99_ms > 0:
            self.calibration = min(4.0, max(0.5, live.p99_ms / sim_now.p99_ms))
        best, best_fig = predictor.tune(records, params)
        for k in [k for k, w in self.banned.items() if self.windows - w > self.cooldown_windows]:
            del self.banned[k]
        if (
            best_fig.p99_ms is None
            or sim_now.p99_ms is None
            or _key(best) == _key(params)
            or best_fig.p99_ms > sim_now.p99_ms * (1.0 - self.margin)
            or best_fig.goodput_rps < sim_now.goodput_rps * (1.0 - self.goodput_tolerance)
        ):
            return self._event(
                now,
                "hold",
                "no candidate predicted better by the margin "
                f"({_ms(best_fig.p99_ms)} vs {_ms(sim_now.p99_ms)} ms predicted)",
                version=version,
                live_p99_ms=live.p99_ms,
                predicted_p99_ms=sim_now.p99_ms,
                calibration=self.calibration,
            )
        if _key(best) in self.banned:
            return self._event(
                now, "hold", "the best candidate was rolled back recently", version=version
            )
        out = client.put_params(
            best,
            version,
            f"watch: predicted P99 {_ms(best_fig.p99_ms)} ms vs {_ms(sim_now.p99_ms)} ms",
        )
        new_version = int(out["version"])
        self.pending = Pending(new_version, version, params, best, own=True)
        self.known_version = new_version
        return self._event(
            now,
            "apply",
            f"predicted P99 {_ms(best_fig.p99_ms)} ms vs {_ms(sim_now.p99_ms)} ms now "
            f"(x{self.calibration:.2f} live)",
            version=new_version,
            live_p99_ms=live.p99_ms,
            predicted_p99_ms=best_fig.p99_ms * self.calibration,
            calibration=self.calibration,
        )

    @staticmethod
    def _applied_unix_s(cur: Mapping[str, Any], version: int) -> float:
        for h in cur.get("history", []):
            if int(h["version"]) == version:
                return float(h.get("applied_unix_s", 0.0))
        return 0.0

    @staticmethod
    def _params_of(cur: Mapping[str, Any], version: int) -> Params:
        for h in cur.get("history", []):
            if int(h["version"]) == version:
                return dict(h["params"])
        raise ValueError(f"version {version} is not in the gateway's parameter history")

    def _judge(
        self,
        client: WatchClient,
        predictor: Predictor,
        records: Sequence[Record],
        pend: Pending,
        live: Figures,
        now: float,
    ) -> WatchEvent:
        if live.answered < self.min_requests or live.p99_ms is None:
            return self._event(
                now,
                "keep",
                f"version {pend.version}: {live.answered} answers, too few to judge",
                version=pend.version,
            )
        c = self.calibration
        new = predictor.predict(records, pend.params)
        old = predictor.predict(records, pend.previous_params)
        limit = 1.0 + self.rollback_over
        why = None
        if pend.own and new.p99_ms is not None and live.p99_ms > limit * c * new.p99_ms:
            why = f"live P99 {_ms(live.p99_ms)} ms > prediction {_ms(c * new.p99_ms)} ms + 15 %"
        elif old.p99_ms is not None and live.p99_ms > limit * c * old.p99_ms:
            why = (
                f"live P99 {_ms(live.p99_ms)} ms > the previous parameters' prediction "
                f"{_ms(c * old.p99_ms)} ms on the same traffic + 15 %"
            )
        if why is None:
            return self._event(
                now,
                "keep",
                f"version {pend.version}: live P99 {_ms(live.p99_ms)} ms within the guardrail",
                version=pend.version,
                live_p99_ms=live.p99_ms,
                predicted_p99_ms=None if new.p99_ms is None else c * new.p99_ms,
                calibration=c,
            )
        out = client.rollback(pend.previous_version, pend.version, f"watch rollback: {why}")
        self.banned[_key(pend.params)] = self.windows
        self.known_version = int(out["version"])
        return self._event(
            now,
            "rollback",
            f"version {pend.version} rolled back to {pend.previous_version}: {why}",
            version=self.known_version,
            live_p99_ms=live.p99_ms,
            predicted_p99_ms=None if new.p99_ms is None else c * new.p99_ms,
            calibration=c,
        )


def _span_s(records: Sequence[Record]) -> float:
    times = [float(r.get("unix_s", 0.0)) for r in records]
    return max(times) - min(times) if times else 0.0


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def run_watch(
    client: WatchClient,
    predictor: Predictor,
    policy: WatchPolicy,
    *,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    windows: int | None = None,
    on_event: Callable[[WatchEvent], None] | None = None,
) -> list[WatchEvent]:
    """Run ``policy`` every ``policy.window_s`` (``windows`` of them, or until interrupted)."""
    start = now()
    done = 0
    while windows is None or done < windows:
        target = start + (done + 1) * policy.window_s
        wait = target - now()
        if wait > 0:
            sleep(wait)
        since = start + done * policy.window_s
        try:
            records = [r for r in client.pull_log(since) if float(r.get("unix_s", 0.0)) < target]
            ev = policy.step(client, predictor, records, now())
        except EvenserveError as exc:  # the gateway away, a 409, a worker's 502: next window
            policy.windows = max(policy.windows, done + 1)
            ev = policy._event(now(), "error", str(exc))
        if on_event is not None:
            on_event(ev)
        done += 1
    return policy.events


# -- the live gateway and the simulator behind the protocols ---------------------------------
class HttpWatchClient:
    """A gateway's ``/admin/params`` and ``/admin/log`` (the token in the header only)."""

    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s

    def get_params(self) -> dict[str, Any]:
        return get_params(self.url, self._token, timeout_s=self.timeout_s)

    def put_params(self, params: Params, expected_version: int, note: str) -> dict[str, Any]:
        return push_params(
            self.url, self._token, params, expected_version, note, timeout_s=self.timeout_s
        )

    def rollback(self, to_version: int, expected_version: int, note: str) -> dict[str, Any]:
        return rollback_params(
            self.url, self._token, to_version, expected_version, note, timeout_s=self.timeout_s
        )

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        try:
            r = httpx.get(
                f"{self.url}{path}",
                params=params,
                headers={"authorization": f"Bearer {self._token}"},
                timeout=self.timeout_s,
                trust_env=False,
            )
        except httpx.HTTPError as exc:
            raise EvenserveError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise EvenserveError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        return r

    def pull_log(self, since_unix_s: float) -> list[Record]:
        r = self._get("/admin/log", {"since_unix_s": repr(since_unix_s)})
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def learned_scales(self) -> dict[str, dict[str, float]]:
        return {
            b["name"]: {m: float(x) for m, x in b.get("profile_scale", {}).items() if x}
            for b in self._get("/admin/backends").json()["backends"]
        }


def records_trace(records: Sequence[Record], path: Path) -> None:
    """Write ``records`` as a trace: sorted by ``unix_s``, ``t_s`` from the first."""
    rows = sorted(records, key=lambda r: float(r["unix_s"]))
    t0 = float(rows[0]["unix_s"]) if rows else 0.0
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "t_s": round(float(r["unix_s"]) - t0, 6)}) + "\n")


class SimPredictor:
    """The simulator on a scenario's placement (``loaded``, arm ``arm``): a window's recorded
    arrivals replayed as a trace under parameters (``tune.replay_trace``, ``tune.apply``);
    ``tune`` searches ``budget`` evaluations from the parameters in force (no sweep).

    Replaying with the learned profiles: a device whose backend (same name) reports learned
    profile scales runs, in the simulator, at their mean as its ``slowdown`` (what the
    device was measured to be, in place of what the scenario says); a device without them
    keeps the scenario's."""

    def __init__(self, loaded: LoadedScenario, arm: str, *, budget: int, seed: int) -> None:
        self.loaded = loaded
        self.arm = arm
        self.budget = budget
        self.seed = seed
        self._dir = Path(tempfile.mkdtemp(prefix="evenserve-watch-"))
        self._cache: dict[tuple[tuple[int, float, float], str], Figures] = {}
        self.evaluations = 0
        self._base = loaded
        #: The slowdown each device was given from its learned scales (the last window's).
        self.learned_slowdown: dict[str, float] = {}
        #: The best sets of earlier windows' searches (newest last): each window's search
        #: tries them first, so the loop's search goes on across windows.
        self.elite: list[Params] = []

    def observe_devices(self, scales: Mapping[str, Mapping[str, float]]) -> None:
        sc = self._base.scenario
        slow: dict[str, float] = {}
        for d in sc.devices:
            s = scales.get(d.name)
            if d.count == 1 and s:
                slow[d.name] = round(float(np.mean(list(s.values()))), 3)
        if slow == self.learned_slowdown:
            return
        self.learned_slowdown = slow
        devices = [
            d.model_copy(update={"slowdown": slow[d.name]}) if d.name in slow else d
            for d in sc.devices
        ]
        new_sc = sc.model_copy(update={"devices": devices})
        self.loaded = LoadedScenario(new_sc, self._base.base_dir, self._base.profile_sets)
        self._cache = {}

    def _replayed(self, records: Sequence[Record]) -> LoadedScenario:
        path = self._dir / "window.jsonl"
        records_trace(records, path)
        loaded = tuning.replay_trace(self.loaded, path)
        # The window is what was measured live: no warm-up of its own.
        sc = loaded.scenario.model_copy(update={"warmup_s": 0.0})
        return LoadedScenario(sc, loaded.base_dir, loaded.profile_sets)

    @staticmethod
    def _figures(summary: Mapping[str, Any]) -> Figures:
        f = tuning.figures(summary)
        return Figures(f["p99_ms"], float(f["goodput_rps"]), int(summary["requests"]["completed"]))

    @staticmethod
    def _window(records: Sequence[Record]) -> tuple[int, float, float]:
        if not records:
            return (0, 0.0, 0.0)
        times = [float(r["unix_s"]) for r in records]
        return (len(records), min(times), max(times))

    def predict(self, records: Sequence[Record], params: Params) -> Figures:
        """The window replayed under ``params`` (one simulation per window and set)."""
        w = self._window(records)
        key = (w, _key(params))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        fig = self._figures(tuning.evaluate(self._replayed(records), self.arm, self.seed, params))
        self._cache = {k: v for k, v in self._cache.items() if k[0] == w}
        self._cache[key] = fig
        return fig

    def tune(self, records: Sequence[Record], params: Params) -> tuple[Params, Figures]:
        loaded = tuning.apply(self._replayed(records), self.arm, params)
        now = _key(params)
        earlier = [p for p in self.elite if _key(p) != now][-ELITE:]
        res = tuning.tune(
            loaded,
            self.arm,
            seed=self.seed,
            budget=self.budget,
            sweep=False,
            candidates=earlier[: max(0, self.budget - 2)],
        )
        self.evaluations += res.evaluations
        best = res.best.params if res.best.params is not None else params
        if _key(best) != now and all(_key(best) != _key(p) for p in self.elite):
            self.elite = [*self.elite, best][-ELITE:]
        return best, self._figures(res.best.summary)
