"""The watch loop's rules (``WatchPolicy``: one ``step`` per window, pure; the package's
docstring), what they compare (``Figures``), the gateway and the simulator as they see them
(``WatchClient``, ``Predictor``), and ``run_watch``: the rules every window on an injected
clock."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from evenserve.core.errors import EvenserveError

Params = dict[str, Any]
Record = dict[str, Any]


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


def params_key(params: Params) -> str:
    """A parameter set as a key: the same set, the same key."""
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
    """The loop's rules (the package's docstring); one ``step`` per window."""

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
            or params_key(best) == params_key(params)
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
        if params_key(best) in self.banned:
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
        self.banned[params_key(pend.params)] = self.windows
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
