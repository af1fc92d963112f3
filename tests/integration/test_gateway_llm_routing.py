"""The gateway's LLM router in front of evenserve's emulated LLM engines configured as
foreign OpenAI-compatible backends (``kind: openai``: a name and a URL, nothing else): the
models read from their ``/v1/models``, their signals from their vLLM-named ``/metrics``,
requests routed and answered (streamed and whole, through the ``openai`` client), the
router's accounting back to zero in flight, a refusal answered 429 with Retry-After when no
engine can meet the TTFT target, and a backend whose ``/metrics`` stops answering still
routed, on the router's own accounting."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai")

from evenserve.cluster.file import parse_cluster  # noqa: E402
from evenserve.gateway.server import Gateway  # noqa: E402
from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.app import Worker  # noqa: E402
from evenserve.worker.options import WorkerOptions  # noqa: E402
from evenserve.worker.repository import load_llm_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402
from tests.integration.fake_v2 import serving  # noqa: E402
from tests.integration.test_worker_openai import STEP_PROFILE  # noqa: E402

#: The most any wait below takes before the test fails (never a timing assertion).
LIMIT_S = 30.0
ENGINE = "{mode: continuous-chunked, max_num_seqs: 8, num_blocks: 2000}"


def repository(root: Path, models: list[str]) -> tuple[Path, Path]:
    """A profile set and a repository of fast emulated LLMs ``models``."""
    pset, repo = root / "set", root / "repo"
    pset.mkdir(parents=True)
    for m in models:
        (pset / f"{m}.yaml").write_text(STEP_PROFILE.format(name=m, c0=0.2, cpu=0))
        d = repo / m
        d.mkdir(parents=True)
        (d / "model.yaml").write_text(
            f"kind: llm\nruntime: emulated\nttft_ms: 1000\ntpot_ms: 100\nengine: {ENGINE}\n"
        )
    return pset, repo


@contextlib.contextmanager
def worker(root: Path, models: list[str]) -> Iterator[BackgroundWorker]:
    pset, repo = repository(root, models)
    options = WorkerOptions(device=parse_device(f"emulated:{pset}"))
    with BackgroundWorker(Worker([], options, llm_entries=load_llm_repository(repo))) as w:
        yield w


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[tuple[BackgroundWorker, BackgroundWorker]]:
    """w0 serves ``chat``; w1 serves ``chat`` and ``solo``."""
    with worker(tmp_path / "w0", ["chat"]) as w0, worker(tmp_path / "w1", ["chat", "solo"]) as w1:
        yield w0, w1


class MetricsTap:
    """An ASGI app relaying a worker's ``/metrics`` (a server's separate metrics port, as
    Triton's 8002): stopping it is the backend's metrics no longer answering."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        async with httpx.AsyncClient() as c:
            r = await c.get(self.url + "/metrics")
        await send({"type": "http.response.start", "status": r.status_code,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")]})  # fmt: skip
        await send({"type": "http.response.body", "body": r.content})


def cluster(w0: str, w1: str, w1_metrics: str | None = None, **gateway: Any) -> Any:
    b1: dict[str, Any] = {"name": "w1", "url": w1, "kind": "openai"}
    if w1_metrics is not None:
        b1["signals"] = {"url": w1_metrics}
    raw = {
        "gateway": {
            "admin": {"token": "test-token-123456"},
            "overload": {"enabled": False},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 5_000},
            "health": {"interval_ms": 100, "timeout_ms": 5_000},
            # evenserve's emulated engines tokenize bytes: one character a token.
            "llm": {"chars_per_token": 1, "stale_after_ms": 300},
            **gateway,
        },
        "backends": [{"name": "w0", "url": w0, "kind": "openai"}, b1],
    }
    return parse_cluster(raw, Path("."))


@contextlib.asynccontextmanager
async def gateway(cfg: Any) -> AsyncIterator[tuple[Gateway, str]]:
    g = Gateway(cfg)
    async with serving(g) as served:
        await until(lambda: all(v.sample is not None for v in g.llm.router.engines.values())
                    and len(g.llm.router.engines) == 3, "every engine sampled")  # fmt: skip
        yield g, served.url


async def until(cond: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + LIMIT_S
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"not within {LIMIT_S} s: {what}")
        await asyncio.sleep(0.02)


def client(url: str) -> Any:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def settled(g: Gateway) -> bool:
    r = g.llm.router
    return r.in_flight() == 0 and all(
        v.own_waiting == v.own_running == v.own_committed_tokens == v.own_context_tokens == 0
        for v in r.engines.values()
    )


async def test_openai_backends_known_by_url_routed_and_accounted(
    workers: tuple[BackgroundWorker, BackgroundWorker],
) -> None:
    w0, w1 = workers
    async with gateway(cluster(w0.url, w1.url)) as (g, url):
        assert sorted(g.llm.router.engines) == ["w0/chat", "w1/chat", "w1/solo"]
        # The engines' KV configuration came from their /metrics (vllm:cache_config_info),
        # and with it the router's prefix memory for them (0 before: no prefix affinity).
        assert all(v.kv_blocks == v.prefix_capacity == 2000 for v in g.llm.router.engines.values())
        c = client(url)
        try:
            assert sorted(m.id for m in (await c.models.list()).data) == ["chat", "solo"]
            raw = await c.completions.with_raw_response.create(
                model="chat", prompt="Hello, world", max_tokens=9
            )
            assert raw.headers["x-evenserve-backend"] in ("w0", "w1")
            r = raw.parse()
            assert r.usage is not None and r.usage.completion_tokens == 9
            stream = await c.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "tell me"}],
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [ch async for ch in stream]
            assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 12
            # Streamed without usage: the router counts the text events.
            text = [ch.choices[0].text async for ch in
                    await c.completions.create(model="solo", prompt="abc", max_tokens=5,
                                               stream=True) if ch.choices]  # fmt: skip
            assert len("".join(text)) == 5

            async def one(i: int) -> str:
                got = await c.chat.completions.with_raw_response.create(
                    model="chat", messages=[{"role": "user", "content": f"q{i}" * 40}],
                    max_tokens=6,
                )  # fmt: skip
                assert len(got.parse().choices[0].message.content or "") == 6
                return str(got.headers["x-evenserve-backend"])

            used = await asyncio.gather(*(one(i) for i in range(12)))
            assert set(used) <= {"w0", "w1"}
            # A client that leaves mid-stream: the try ends once all the same.
            await until(lambda: settled(g), "every answered try ended")
            gone = await c.completions.create(model="chat", prompt="x", max_tokens=3000,
                                              stream=True)  # fmt: skip
            await gone.__anext__()
            assert g.llm.router.in_flight() == 1
            await gone.close()
        finally:
            await c.close()
        await until(lambda: settled(g), "the router's accounting back to zero in flight")
        # first_token and done were called with the answers' figures: speeds were learned.
        learned = [v for v in g.llm.router.engines.values() if v.learned_tpot_s is not None]
        assert learned and all(v.learned_base_s is not None for v in learned)
        async with httpx.AsyncClient() as h:
            text_metrics = (await h.get(f"{url}/metrics")).text
        for e in ("w0/chat", "w1/chat", "w1/solo"):
            assert (
                f'evenserve_gateway_llm_engine_signal_age_seconds{{engine="{e}"}}' in text_metrics
            )


async def test_a_ttft_target_no_engine_can_meet_is_refused_429_with_retry_after(
    workers: tuple[BackgroundWorker, BackgroundWorker],
) -> None:
    w0, w1 = workers
    async with gateway(cluster(w0.url, w1.url)) as (g, url), httpx.AsyncClient() as h:
        body = {"model": "chat", "prompt": "Hello", "max_tokens": 4}
        r = await h.post(f"{url}/v1/completions", json=body,
                         headers={"x-evenserve-ttft-ms": "0.001"})  # fmt: skip
        assert r.status_code == 429
        assert re.fullmatch(r"[1-9][0-9]*", r.headers["retry-after"])
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_error", "ttft-unreachable")
        c = client(url)
        try:
            with pytest.raises(openai.RateLimitError):
                await c.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                    extra_headers={"x-evenserve-ttft-ms": "0.001"},
                )  # fmt: skip
            # A target the engines can meet is served.
            ok = await c.completions.create(
                model="chat",
                prompt="Hello",
                max_tokens=4,
                extra_headers={"x-evenserve-ttft-ms": "60000"},
            )
            assert ok.usage is not None and ok.usage.completion_tokens == 4
        finally:
            await c.close()
        text = (await h.get(f"{url}/metrics")).text
        assert (
            'evenserve_gateway_llm_refusals_total{model="chat",reason="ttft-unreachable"} 2.0'
            in text
        )
        assert 'model="chat",outcome="overloaded"' in text
        assert settled(g)


async def test_a_backend_whose_metrics_stop_answering_is_routed_on_accounting(
    workers: tuple[BackgroundWorker, BackgroundWorker],
) -> None:
    w0, w1 = workers
    tap = serving(MetricsTap(w1.url))
    served_tap = await tap.__aenter__()
    stopped = False
    try:
        async with gateway(cluster(w0.url, w1.url, f"{served_tap.url}/metrics")) as (g, url):
            router = g.llm.router
            solo = router.engines["w1/solo"]
            await tap.__aexit__(None, None, None)
            stopped = True
            now = g.clock.now
            await until(lambda: (solo.age_s(now()) or 0.0) > 0.3, "w1's signals stale")
            await until(lambda: g.registry.states["w1"].last_error is not None
                        and "metrics" in (g.registry.states["w1"].last_error or ""),
                        "the failed scrape noted")  # fmt: skip
            assert g.registry.is_healthy("w1")  # metrics are advisory: never an ejection
            c = client(url)
            try:
                stream = await c.completions.create(model="solo", prompt="hello", max_tokens=3000,
                                                    stream=True)  # fmt: skip
                await stream.__anext__()
                # Its own accounting: the open request runs there.
                assert (solo.own_running, solo.own_waiting) == (1, 0)
                # No correction from the stale sample: the router's own counts alone.
                await until(lambda: solo.extra_running == solo.extra_waiting == 0
                            and solo.extra_kv_tokens == 0, "corrections dropped")  # fmt: skip
                raw = await c.completions.with_raw_response.create(
                    model="solo", prompt="again", max_tokens=4
                )
                assert raw.headers["x-evenserve-backend"] == "w1"
                assert raw.parse().usage.completion_tokens == 4
                await stream.close()
            finally:
                await c.close()
            await until(lambda: settled(g), "accounting back to zero")
            fresh = router.engines["w0/chat"]
            assert (fresh.age_s(now()) or 0.0) < (solo.age_s(now()) or 0.0)
    finally:
        if not stopped:
            await tap.__aexit__(None, None, None)


async def test_evenserve_workers_engines_come_from_their_load_reports(
    workers: tuple[BackgroundWorker, BackgroundWorker],
) -> None:
    """The same workers as KServe backends (the default kind): their load reports name their
    engines with the step profile, which the router then predicts from."""
    w0, w1 = workers
    raw = {
        "gateway": {
            "admin": {"token": "test-token-123456"},
            "overload": {"enabled": False},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 5_000},
            "llm": {"chars_per_token": 1},
        },
        "backends": [{"name": "w0", "url": w0.url}, {"name": "w1", "url": w1.url}],
    }
    async with gateway(parse_cluster(raw, Path("."))) as (g, url):
        engines = g.llm.router.engines
        assert sorted(engines) == ["w0/chat", "w1/chat", "w1/solo"]
        assert all(v.profile is not None and v.profile.c0_s == 0.0002 for v in engines.values())
        assert all(v.kv_blocks == 2000 and v.max_num_seqs == 8 for v in engines.values())
        c = client(url)
        try:
            stream = await c.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                stream=True,
            )  # fmt: skip
            chunks = [ch async for ch in stream]
            assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 5
            r = await c.completions.create(model="solo", prompt="abc", max_tokens=3)
            assert r.usage is not None and r.usage.completion_tokens == 3
        finally:
            await c.close()
        await until(lambda: settled(g), "accounting back to zero")


class BrokenOpenAI:
    """An OpenAI-compatible server that lists ``chat`` and ``cut``, reports itself idle in
    vLLM's names, answers every ``chat`` request 503 and cuts every ``cut`` stream after its
    first token (the connection dropped)."""

    METRICS = (
        'vllm:num_requests_waiting{model_name="chat"} 0\n'
        'vllm:num_requests_running{model_name="chat"} 0\n'
        'vllm:num_requests_waiting{model_name="cut"} 0\n'
    )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break

        async def answer(status: int, content: bytes, ctype: bytes) -> None:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", ctype)]})  # fmt: skip
            await send({"type": "http.response.body", "body": content})

        if path == "/v1/models":
            data = b'{"object":"list","data":[{"id":"chat"},{"id":"cut"}]}'
            return await answer(200, data, b"application/json")
        if path == "/metrics":
            return await answer(200, self.METRICS.encode(), b"text/plain")
        if b'"cut"' in body:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
            event = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
            await send({"type": "http.response.body", "body": event, "more_body": True})
            raise RuntimeError("the server fell over mid-stream")
        err = b'{"error":{"message":"busy","type":"server_error","param":null,"code":null}}'
        return await answer(503, err, b"application/json")


async def test_every_try_ends_once_retried_refused_or_cut(
    workers: tuple[BackgroundWorker, BackgroundWorker],
) -> None:
    """A backend answering 503 (the try retried elsewhere) and one cutting its stream: each
    try is ended once, the router's accounting back to zero."""
    w0, _w1 = workers
    async with serving(BrokenOpenAI()) as broken:
        raw = {
            "gateway": {
                "admin": {"token": "test-token-123456"},
                "overload": {"enabled": False},
                "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 5_000},
                "health": {"interval_ms": 100, "timeout_ms": 5_000},
                "llm": {"chars_per_token": 1},
                "llm_routing": "round-robin",  # every backend gets its turn
            },
            "backends": [
                {"name": "w0", "url": w0.url, "kind": "openai"},
                {"name": "bad", "url": broken.url, "kind": "openai"},
            ],
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        async with serving(g) as served:
            engines = g.llm.router.engines
            await until(lambda: len(engines) == 3 and all(v.sample for v in engines.values()),
                        "every engine sampled")  # fmt: skip
            c = client(served.url)
            try:
                backends = []
                for i in range(6):
                    raw_r = await c.completions.with_raw_response.create(
                        model="chat", prompt=f"p{i}", max_tokens=3
                    )
                    assert raw_r.parse().usage.completion_tokens == 3
                    backends.append(raw_r.headers["x-evenserve-backend"])
                assert set(backends) == {"w0"}  # the 503s were retried there
                stream = await c.completions.create(model="cut", prompt="x", max_tokens=9,
                                                    stream=True)  # fmt: skip
                with pytest.raises(openai.APIError):
                    async for _ in stream:
                        pass
            finally:
                await c.close()
            await until(lambda: settled(g), "accounting back to zero")
            async with httpx.AsyncClient() as h:
                text = (await h.get(f"{served.url}/metrics")).text
            assert re.search(r'evenserve_gateway_retries_total\{model="chat"\} [1-9]', text)
            assert 'backend="bad",model="cut",outcome="backend_error"' in text
