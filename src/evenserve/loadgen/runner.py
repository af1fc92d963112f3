"""The load generator: closed-loop users, open-loop Poisson or trace replay against a v2 target.

Theory of operation. One asyncio loop (uvloop when installed). Requests go out through
``http.RawHttpClient`` (prebuilt requests on pooled keep-alive connections); the preflight
and the scraper use an aiohttp session. Before any load, the preflight (``target.preflight``)
checks the target and fetches each model's metadata for its payloads. Time zero is a moment
just after the preflight; every send has an intended time on that clock (see ``schedule``);
what is sent when comes from ``evenserve.workload``, as in the simulator:
- closed loop: ``users`` coroutines, each with a ``ClosedLoopUsers`` of its own (seeded
  ``{seed}:user:{u}``): thinking (exponential, mean ``think_s``), sending one request of a
  model drawn from the mix, waiting for its answer, thinking again; the first request comes
  after a think;
- open loop / trace: one scheduler coroutine walks the precomputed schedule (``--rate`` split
  over the mix into one Poisson stream per model, seeded as a scenario's ``rates_rps``; or
  the trace, or a scenario's arrivals passed in as one), waits for each intended time and
  starts the request as its own task (bounded by ``max_in_flight``: a send over that bound is
  recorded as dropped ``client-limit``, never queued in the generator).
Every request is recorded (model, intended and actual send time, answer time, status,
answering backend from ``x-evenserve-backend``, outcome). No new request is sent after
``duration_s`` or past ``max_requests``; the answers still out get ``drain_s`` to arrive, then
are cancelled and recorded as unfinished. A run whose first ``abort_after`` requests all fail
stops early: the target is clearly broken and the error summary says why.

The scraper (``scrape``) polls every backend meanwhile. Latency is measured from the intended
send time, so the generator's own lateness is never hidden (it is also reported on its own).
While the load runs the garbage collector is off (a full collection would be lag) and
``run_load`` lifts the sending thread to real-time priority where permitted (see
``schedule.sender_priority``). What a run is asked and gives back: ``spec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from evenserve.core.wire import infer_path
from evenserve.loadgen.http import MAX_IDLE_S, RawHttpClient
from evenserve.loadgen.payload import Payload, payload_from_file, payload_from_metadata
from evenserve.loadgen.schedule import LagStats, SendClock, sender_priority
from evenserve.loadgen.scrape import Scraper
from evenserve.loadgen.spec import LiveStats, LoadResult, LoadSpec, Sample
from evenserve.loadgen.target import (
    ErrorTally,
    classify_exception,
    classify_status,
    preflight,
)
from evenserve.workload import (
    Arrival,
    ClosedLoopUsers,
    mix_streams,
    open_loop_arrivals,
    replay,
    user_rng,
)


class LoadGenerator:
    def __init__(self, spec: LoadSpec, progress: Callable[[LiveStats], None] | None = None) -> None:
        spec.validate()
        self.spec = spec
        self.progress = progress
        self.samples: list[Sample] = []
        self.tally = ErrorTally()
        self.lag = LagStats()
        self.stats = LiveStats(duration_s=spec.duration_s)
        self.payloads: dict[str, Payload] = {}
        self.t0 = 0.0
        self._stop = asyncio.Event()
        self._aborted: str | None = None
        self._client = RawHttpClient(spec.target, spec.timeout_s, min(5.0, spec.timeout_s))
        self._prebuilt: dict[str, list[bytes]] = {}
        self._turn: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.clock = SendClock()

    # -- one request -----------------------------------------------------------------------
    def _wire(self, model: str, priority: int | None, deadline_ms: float | None) -> bytes:
        """The whole HTTP request for one send; prebuilt unless it carries parameters."""
        client = self._client
        p = self.payloads[model]
        params: dict[str, Any] = {}
        if priority is not None:
            params["priority"] = priority
        if deadline_ms is not None:
            params["timeout"] = int(deadline_ms * 1000)
        path = infer_path(model)
        if params:
            body, headers = p.with_parameters(params)
            return client.request_bytes(path, body, headers)
        cache = self._prebuilt.get(model)
        if cache is None:
            cache = [client.request_bytes(path, b, p.headers) for b in p.bodies]
            self._prebuilt[model] = cache
        self._turn[model] = k = self._turn.get(model, -1) + 1
        return cache[k % len(cache)]

    async def _send(
        self,
        model: str,
        intended_abs: float,
        user: int = -1,
        priority: int | None = None,
        deadline_ms: float | None = None,
    ) -> Sample:
        prio = priority if priority is not None else self.spec.model_priority.get(model)
        s = Sample(model, intended_abs - self.t0, user=user, priority=prio)
        self.samples.append(s)
        wire = self._wire(model, prio, deadline_ms)
        sent = time.perf_counter()
        s.sent_s = sent - self.t0
        if s.intended_s >= self.spec.warmup_s:
            self.lag.record(intended_abs, sent)
        st = self.stats
        st.sent += 1
        st.in_flight += 1
        try:
            s.status, s.backend, data, s.resent = await self._client.post(wire)
            done = time.perf_counter()
            if s.status == 200:
                s.done_s = done - self.t0
                s.outcome = "ok"
                st.ok += 1
                st.recent_ms.append((done - intended_abs) * 1000.0)
            else:
                s.outcome = classify_status(s.status)
                self._fail(s, data.decode(errors="replace").strip())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is counted, none is raised
            s.outcome = classify_exception(exc)
            self._fail(s, f"{type(exc).__name__}: {exc}")
        finally:
            st.in_flight -= 1
        return s

    def _fail(self, s: Sample, message: str) -> None:
        self.tally.add(s.outcome, s.model, message)
        st = self.stats
        st.failed += 1
        st.failures[s.outcome] = st.failures.get(s.outcome, 0) + 1
        if (
            self._aborted is None
            and st.ok == 0
            and st.failed >= self.spec.abort_after
            and s.outcome != "overloaded"
        ):
            self._aborted = (
                f"stopped early: the first {st.failed} requests all failed "
                f"({', '.join(f'{k} {v}' for k, v in st.failures.items())})"
            )
            self._stop.set()

    # -- drivers ---------------------------------------------------------------------------
    def _may_send(self, intended_abs: float) -> bool:
        return (
            not self._stop.is_set()
            and intended_abs - self.t0 < self.spec.duration_s
            and len(self.samples) < self.spec.max_requests
        )

    async def _user(self, user: int) -> None:
        spec = self.spec
        users = ClosedLoopUsers(spec.mix, spec.think_s, user_rng(spec.seed, user))
        nxt = self.t0 + users.think_s()
        while self._may_send(nxt):
            await self.clock.wait_until(nxt)
            if self._stop.is_set():
                return
            await self._send(users.draw_model(), nxt, user=user)
            nxt = time.perf_counter() + users.think_s()

    async def _open(self, schedule: list[Arrival]) -> None:
        for a in schedule:
            t = self.t0 + a.t_s
            if not self._may_send(t):
                return
            await self.clock.wait_until(t)
            if self._stop.is_set():
                return
            if self.stats.in_flight >= self.spec.max_in_flight:
                s = Sample(a.model, a.t_s, outcome="client-limit", priority=a.priority)
                self.samples.append(s)
                self._fail(s, f"{self.spec.max_in_flight} requests already in flight")
                continue
            task = asyncio.create_task(self._send(a.model, t, -1, a.priority, a.deadline_ms))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _report(self) -> None:
        while True:
            self.stats.elapsed_s = time.perf_counter() - self.t0
            if self.progress is not None:
                self.progress(self.stats)
            await asyncio.sleep(1.0)

    # -- the run ---------------------------------------------------------------------------
    def _schedule(self) -> list[Arrival]:
        """Open loop: ``rate_rps`` split over the mix, one Poisson stream per model seeded as
        the simulator seeds a scenario's ``rates_rps`` streams; or the trace, replayed."""
        spec = self.spec
        if spec.trace is not None:
            return replay(spec.trace, spec.duration_s, spec.max_requests, spec.trace_time_scale)
        assert spec.rate_rps is not None
        streams = mix_streams(spec.rate_rps, spec.mix)
        return open_loop_arrivals(streams, spec.seed, spec.duration_s, spec.max_requests)

    async def run(self) -> LoadResult:
        spec = self.spec
        schedule = self._schedule() if spec.mode() != "closed-loop" else []
        # Idle connections retired at 4 s (below the servers' keep-alive), as on the send path.
        connector = aiohttp.TCPConnector(
            limit=0, force_close=False, enable_cleanup_closed=True, keepalive_timeout=MAX_IDLE_S
        )
        timeout = aiohttp.ClientTimeout(total=spec.timeout_s, connect=min(5.0, spec.timeout_s))
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            models = spec.models()
            need_meta = {m for m in models if m not in spec.payload_files}
            meta = await preflight(session, spec.target, models, need_meta)
            for i, m in enumerate(models):
                if m in spec.payload_files:
                    self.payloads[m] = payload_from_file(m, spec.payload_files[m])
                else:
                    self.payloads[m] = payload_from_metadata(
                        m, meta[m], var_dim=spec.var_dim, seed=spec.seed + i,
                        encoding=spec.encoding,
                    )  # fmt: skip
            started_unix = time.time()
            self.t0 = time.perf_counter() + 0.05
            t0_unix = started_unix + (self.t0 - time.perf_counter())
            scraper = Scraper(spec.scrape, self.t0, spec.scrape_interval_s, spec.metrics_interval_s)
            scraper.start(session)
            self.clock.start()
            reporter = asyncio.create_task(self._report())
            if spec.mode() == "closed-loop":
                assert spec.users is not None
                drivers = [asyncio.create_task(self._user(u)) for u in range(spec.users)]
            else:
                drivers = [asyncio.create_task(self._open(schedule))]
            end_abs = self.t0 + spec.duration_s
            # Until the duration is over, the run is stopped, or the drivers are done (the
            # schedule or the request cap exhausted): whichever comes first.
            stopped = asyncio.ensure_future(self._stop.wait())
            drivers_done = asyncio.ensure_future(asyncio.wait(drivers))
            await asyncio.wait(
                [stopped, drivers_done],
                timeout=max(0.0, end_abs - time.perf_counter()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            end_s = min(spec.duration_s, time.perf_counter() - self.t0)
            for f in (stopped, drivers_done):
                f.cancel()
            self._stop.set()
            self.stats.draining = True
            # Senders stop on their own at the end; give the answers still out drain_s.
            pending = [d for d in drivers if not d.done()] + list(self._tasks)
            if pending:
                _, late = await asyncio.wait(pending, timeout=spec.drain_s)
                for t in late:
                    t.cancel()
                for t in late:
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
            await self.clock.stop()
            self._client.close()
            await scraper.final_sample(session)
            await scraper.stop()
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            self.stats.elapsed_s = time.perf_counter() - self.t0
            if self.progress is not None:
                self.progress(self.stats)
        return LoadResult(
            spec=spec,
            samples=self.samples,
            scrapes=scraper.data,
            errors=self.tally.to_json(),
            lag_ms=self.lag.summary_ms(),
            started_unix_s=started_unix,
            end_s=max(end_s, spec.warmup_s + 1e-6),
            aborted=self._aborted,
            connections=self._client.stats(),
            t0_unix_s=t0_unix,
        )


def run_load(
    spec: LoadSpec,
    progress: Callable[[LiveStats], None] | None = None,
    *,
    realtime: bool = True,
) -> LoadResult:
    """Run the load to completion on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop

        runner: Any = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.Runner()
    # No garbage-collector pauses while sending: a full collection over tens of thousands of
    # samples takes milliseconds, and would show up as scheduling lag. Collected afterwards.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with runner, sender_priority(realtime) as priority:
            result: LoadResult = runner.run(LoadGenerator(spec, progress).run())
        result.priority = priority
    finally:
        if gc_was_enabled:
            gc.enable()
        gc.collect()
    return result
