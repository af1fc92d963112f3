"""The poller's probes of a ``kind: openai`` backend against an httpx MockTransport on a
FakeClock: ``/v1/models`` as readiness and models (the LLM router's engines), its
``/metrics`` through the LLM mapping its names tell (or the configured engine), failures
that eject and those that only let signals go stale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.llm_router import LlmGateway
from evenserve.gateway.poller import Poller, openai_models
from evenserve.httpio.client import ConnectFailed, Reply
from evenserve.policy.routing import ROUTING

SGLANG = (
    'sglang:num_queue_reqs{model_name="qwen"} 3\nsglang:num_running_reqs{model_name="qwen"} 2\n'
)
VLLM = (
    'vllm:num_requests_waiting{model_name="qwen"} 1\n'
    'vllm:num_requests_running{model_name="qwen"} 4\n'
    'vllm:kv_cache_usage_perc{model_name="qwen"} 0.5\n'
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="900"} 1\n'
)


class Server:
    def __init__(self) -> None:
        self.up = True
        self.models_status = 200
        self.models_body: bytes = b'{"object": "list", "data": [{"id": "qwen"}]}'
        self.metrics: str | None = VLLM

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(self.models_status, content=self.models_body)
        if request.url.path == "/metrics" and self.metrics is not None:
            return httpx.Response(200, text=self.metrics)
        return httpx.Response(404)


def setup(**backend: Any) -> tuple[Poller, BackendRegistry, LlmGateway, FakeClock, Server]:
    raw = {"backends": [{"name": "v", "url": "http://v.test", "kind": "openai", **backend}]}
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(5.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("queue-aware"), clock, window=3, stale_after_s=0.5
    )
    llm = LlmGateway(cluster.config.gateway, clock, reg.is_healthy)
    srv = Server()
    client = httpx.AsyncClient(transport=httpx.MockTransport(srv.handler))

    async def fetch(url: str, timeout_s: float) -> Reply:
        try:
            r = await client.get(url)
        except httpx.ConnectError:
            raise ConnectFailed("connect-refused") from None
        return Reply(r.status_code, dict(r.headers), r.content, 0)

    return Poller(reg, cluster.config.gateway, clock, fetch=fetch, llm=llm), reg, llm, clock, srv


def test_probes_of_an_openai_backend() -> None:
    p, reg, *_ = setup()
    names = [getattr(probe, "func", None) for _, probe in p._probes(reg.states["v"])]
    assert names == [p.probe_openai_models, p.probe_llm_metrics]
    p, reg, *_ = setup(signals={"source": "none"})
    names = [getattr(probe, "func", None) for _, probe in p._probes(reg.states["v"])]
    assert names == [p.probe_openai_models]


async def test_models_admit_and_make_engines_and_metrics_feed_them() -> None:
    p, reg, llm, clock, srv = setup()
    st = reg.states["v"]
    await p.probe_openai_models(st)
    assert reg.is_healthy("v") and st.index == {"qwen": "READY"}
    assert sorted(llm.router.engines) == ["v/qwen"] and llm.handles("qwen")
    clock.advance(0.1)
    await p.probe_llm_metrics(st)
    v = llm.router.engines["v/qwen"]
    assert v.sample is not None and v.sample.taken_s == 5.1
    assert (v.sample.waiting, v.sample.running, v.kv_blocks, v.block_tokens) == (1, 4, 900, 16)
    assert (v.extra_waiting, v.extra_running) == (1, 4)
    classic = reg.router.view("v")
    assert classic.signals_fresh and classic.queue_depth == 1
    # The server drops a model and adds one: engines follow.
    srv.models_body = b'{"object": "list", "data": [{"id": "llama"}, {"id": "qwen"}]}'
    await p.probe_openai_models(st)
    assert sorted(llm.router.engines) == ["v/llama", "v/qwen"]


async def test_auto_engine_told_once_and_a_configured_engine_used_as_is() -> None:
    p, reg, llm, _clock, srv = setup()
    st = reg.states["v"]
    await p.probe_openai_models(st)
    srv.metrics = SGLANG
    await p.probe_llm_metrics(st)
    s = llm.router.engines["v/qwen"].sample
    assert s is not None and (s.waiting, s.running) == (3, 2)
    assert p._engines == {"v": "sglang"}
    p, reg, llm, _clock, srv = setup(engine="vllm")
    st = reg.states["v"]
    await p.probe_openai_models(st)
    srv.metrics = SGLANG  # not vLLM's names: no sample, noted
    await p.probe_llm_metrics(st)
    assert llm.router.engines["v/qwen"].sample is None and p._engines == {}
    assert "no vllm waiting metric" in (st.last_error or "")


async def test_failures_eject_by_the_model_list_never_by_the_metrics() -> None:
    p, reg, _llm, clock, srv = setup()
    st = reg.states["v"]
    await p.probe_openai_models(st)
    srv.metrics = "# nothing an LLM server says\nprocess_cpu_seconds_total 1\n"
    await p.probe_llm_metrics(st)
    assert reg.is_healthy("v") and "no LLM server's metrics" in (st.last_error or "")
    srv.metrics = None  # /metrics answers 404
    await p.probe_llm_metrics(st)
    assert reg.is_healthy("v") and "answered 404" in (st.last_error or "")
    srv.models_status = 503
    await p.probe_openai_models(st)
    assert not reg.is_healthy("v") and st.reason.startswith("not-ready")
    srv.models_status, srv.models_body = 200, b'{"data": "nope"}'
    await p.probe_openai_models(st)
    assert not reg.is_healthy("v") and st.reason.startswith("bad model list")
    srv.models_body = b'{"object": "list", "data": [{"id": "qwen"}]}'
    await p.probe_openai_models(st)
    assert reg.is_healthy("v")
    srv.up = False
    clock.advance(0.1)
    await p.probe_openai_models(st)
    assert not reg.is_healthy("v") and st.reason == "connect-refused"


def test_openai_models_reads_the_list_shape() -> None:
    assert openai_models(b'{"data": [{"id": "b"}, {"id": "a"}, {"x": 1}, 3]}') == ["a", "b"]
    assert openai_models(b'{"data": []}') == []
    assert openai_models(b"[1]") is None and openai_models(b"not json") is None
