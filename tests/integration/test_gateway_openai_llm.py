"""The official ``openai`` client through the gateway in front of a worker serving LLMs (an
emulated engine, and the tiny real model when torch is installed): models, completions and
chat, streamed and whole, usage counts, and the errors, relayed in OpenAI's shape."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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
from tests.integration.test_worker_openai import llm_repo  # noqa: E402

TINY = (
    "llm_torch: {config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,"
    " num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 259,"
    " max_position_embeddings: 256}, seed: 3}\n"
)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[BackgroundWorker]:
    pset, repo = llm_repo(tmp_path)
    has_torch = True
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        has_torch = False
    if has_torch:
        d = repo / "tiny"
        d.mkdir()
        (d / "model.yaml").write_text(
            "kind: llm\nruntime: llm_torch\nmax_model_len: 256\n"
            "engine: {mode: continuous, max_num_seqs: 4, num_blocks: 64}\n" + TINY
        )
    options = WorkerOptions(device=parse_device(f"emulated:{pset}"))
    service = Worker([], options, llm_entries=load_llm_repository(repo))
    with BackgroundWorker(service) as w:
        yield w


@contextlib.asynccontextmanager
async def gateway(w: BackgroundWorker) -> AsyncIterator[openai.AsyncOpenAI]:
    raw = {
        "gateway": {
            "routing": "queue-aware",
            "admin": {"token": "test-token-123456"},
            "overload": {"enabled": False},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
        },
        "backends": [{"name": "w0", "url": w.url, "models": sorted(w.worker.llms)}],
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with serving(g) as served:
        c = openai.AsyncOpenAI(
            base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60
        )
        try:
            yield c
        finally:
            await c.close()


async def test_through_the_gateway(worker: BackgroundWorker) -> None:
    async with gateway(worker) as c:
        ids = sorted(m.id for m in (await c.models.list()).data)
        assert {"chat", "slow"} <= set(ids)
        r = await c.completions.create(model="chat", prompt="Hello", max_tokens=7)
        assert r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 7)
        assert len(r.choices[0].text) == 7
        stream = await c.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [ch async for ch in stream]
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 10
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
        with pytest.raises(openai.NotFoundError) as nf:
            await c.completions.create(model="nope", prompt="x", max_tokens=1)
        assert nf.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            await c.completions.create(model="chat", prompt="x", max_tokens=1, n=3)
        assert bad.value.param == "n"
        with pytest.raises(openai.BadRequestError) as long:
            await c.completions.create(model="chat", prompt="x" * 5000, max_tokens=10)
        assert long.value.code == "context_length_exceeded"
        a = await c.completions.create(model="slow", prompt="a", max_tokens=3000, stream=True)
        await a.__anext__()  # it runs
        b = await c.completions.create(model="slow", prompt="b", max_tokens=3000, stream=True)
        with pytest.raises(openai.RateLimitError) as full:
            await c.completions.create(model="slow", prompt="c", max_tokens=5)
        assert full.value.status_code == 429
        assert full.value.response.headers.get("retry-after") is not None
        await a.close()
        await b.close()


async def test_the_tiny_real_model_streams_through_the_gateway(worker: BackgroundWorker) -> None:
    if "tiny" not in worker.worker.llms:
        pytest.skip("torch and transformers are not installed")
    async with gateway(worker) as c:
        stream = await c.completions.create(
            model="tiny", prompt="The cat", max_tokens=12, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = [ch async for ch in stream]
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 12
        assert chunks[-1].usage.prompt_tokens == len(b"The cat")
        whole = await c.completions.create(
            model="tiny", prompt="The cat", max_tokens=12, extra_body={"ignore_eos": True}
        )
        # Greedy on the same weights: the same tokens, streamed or whole.
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert whole.choices[0].text == text
