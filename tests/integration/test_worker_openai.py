"""The worker's OpenAI-compatible front, with the official ``openai`` client: /v1/models,
completions and chat, streamed and whole, usage counts, every error in OpenAI's shape, a
stream the client leaves mid-way (its sequence cancelled, its KV blocks freed), the vLLM-named
metrics; the tiny real model (random weights) streams through the same path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from evenserve.runtime.device import parse_device  # noqa: E402
from evenserve.worker.app import Worker  # noqa: E402
from evenserve.worker.options import WorkerOptions  # noqa: E402
from evenserve.worker.repository import load_llm_repository  # noqa: E402
from evenserve.worker.server import BackgroundWorker  # noqa: E402

STEP_PROFILE = """kind: llm-step
model: {name}
device: test
runtime: emulated
precision: bf16
source: a test's (fast steps)
c0_ms: {c0}
prefill_us_per_token: 1.0
decode_us_per_seq: 1.0
cpu_ms_per_output_token: {cpu}
weights_gib: 0.001
kv_bytes_per_token: 1024
device_memory_gib: 1.0
max_model_len: 4096
"""


def llm_folder(root: Path, name: str, engine: str, extra: str = "") -> None:
    d = root / "repo" / name
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(
        f"kind: llm\nruntime: emulated\nttft_ms: 1000\ntpot_ms: 100\nengine: {engine}\n{extra}"
    )


def llm_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A profile set with two fast emulated LLMs' step profiles, and a repository serving
    them: ``chat`` (chunked, 8 sequences) and ``slow`` (one sequence, one waiting; its tokens
    become visible 0.5 ms after their step, its profile's CPU per output token)."""
    pset = tmp_path / "set"
    pset.mkdir()
    (pset / "chat.yaml").write_text(STEP_PROFILE.format(name="chat", c0=0.2, cpu=0))
    (pset / "slow.yaml").write_text(STEP_PROFILE.format(name="slow", c0=1.0, cpu=0.5))
    llm_folder(tmp_path, "chat", "{mode: continuous-chunked, max_num_seqs: 8, num_blocks: 2000}")
    llm_folder(
        tmp_path, "slow", "{mode: continuous, max_num_seqs: 1, max_waiting: 1, num_blocks: 1000}"
    )
    return pset, tmp_path / "repo"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[BackgroundWorker]:
    pset, repo = llm_repo(tmp_path)
    options = WorkerOptions(device=parse_device(f"emulated:{pset}"))
    service = Worker([], options, llm_entries=load_llm_repository(repo))
    with BackgroundWorker(service) as w:
        yield w


def client(w: BackgroundWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{w.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_completions_and_usage(served: BackgroundWorker) -> None:
    c = client(served)
    assert sorted(m.id for m in c.models.list().data) == ["chat", "slow"]
    r = c.completions.create(model="chat", prompt="Hello, world", max_tokens=9)
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].text) == 9  # the emulated model's tokens are one ASCII byte each
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len("Hello, world"), 9)
    # Token ids as the prompt.
    r = c.completions.create(model="chat", prompt=[72, 105], max_tokens=3)
    assert r.usage is not None and r.usage.prompt_tokens == 2
    chat = c.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].message.role == "assistant"
    assert len(chat.choices[0].message.content or "") == 4


def test_streaming_chat_one_chunk_per_step_and_final_usage(served: BackgroundWorker) -> None:
    c = client(served)
    chunks = list(
        c.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "tell me"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content) == 12
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == "length" and all(f is None for f in finish[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12
    stream = c.completions.create(model="chat", prompt="abc", max_tokens=5, stream=True)
    text = "".join(ch.choices[0].text for ch in stream if ch.choices)
    assert len(text) == 5


def test_errors_in_openai_shape(served: BackgroundWorker) -> None:
    c = client(served)
    with pytest.raises(openai.NotFoundError) as nf:
        c.completions.create(model="nope", prompt="x", max_tokens=1)
    assert nf.value.status_code == 404 and nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        c.completions.create(model="chat", prompt="x", max_tokens=1, n=2)
    assert bad.value.status_code == 400 and bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as bad:
        c.completions.create(model="chat", prompt="x", max_tokens=-1)
    assert bad.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as long:
        c.completions.create(model="chat", prompt="x" * 4000, max_tokens=200)
    assert long.value.code == "context_length_exceeded"


async def _queue_full(url: str) -> tuple[int, str | None]:
    c = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    # One sequence runs (max_num_seqs 1), one waits (max_waiting 1): the third is refused.
    a = await c.completions.create(model="slow", prompt="a", max_tokens=3000, stream=True)
    b = await c.completions.create(model="slow", prompt="b", max_tokens=3000, stream=True)
    try:
        await c.completions.create(model="slow", prompt="c", max_tokens=5)
    except openai.RateLimitError as exc:
        return exc.status_code, exc.response.headers.get("retry-after")
    finally:
        await a.close()
        await b.close()
        await c.close()
    return 200, None


def test_queue_full_is_429_with_retry_after(served: BackgroundWorker) -> None:
    status, retry = asyncio.run(_queue_full(served.url))
    assert status == 429 and retry is not None and int(retry) >= 1


def _engine_idle(w: BackgroundWorker, model: str, within_s: float = 10.0) -> bool:
    driver = w.worker.driver
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        with driver.lock:
            e = driver.sched.engines[model].engine
            if not e.has_work and e.kv.used == 0:
                return True
        time.sleep(0.01)
    return False


def test_a_client_that_leaves_mid_stream_frees_its_sequence(served: BackgroundWorker) -> None:
    c = client(served)
    stream = c.completions.create(model="slow", prompt="x", max_tokens=3000, stream=True)
    for got, _ in enumerate(stream, 1):
        if got == 3:
            break
    stream.close()
    assert _engine_idle(served, "slow"), "the cancelled sequence still holds the engine"
    with served.worker.driver.lock:
        cancelled = served.worker.driver.sched.engines["slow"].engine.counters.cancelled
    assert cancelled >= 1


def test_metrics_carry_vllm_names(served: BackgroundWorker) -> None:
    import httpx

    c = client(served)
    c.completions.create(model="chat", prompt="abc", max_tokens=4)
    text = httpx.get(f"{served.url}/metrics").text
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:cache_config_info", "vllm:request_success_total",
    ):  # fmt: skip
        assert f"{name}{{" in text, name
    assert 'vllm:generation_tokens_total{model_name="chat"} 4.0' in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="chat"} 1.0' in text


def test_promtool_finds_no_error_only_the_known_lints(served: BackgroundWorker) -> None:
    """``promtool check metrics`` parses the exposition; what it reports are lints only: the
    colons of vLLM's names (vLLM's own /metrics gets the same) and the DCGM exporter's
    camelCase labels of ``evenserve_worker_device_info``."""
    import shutil
    import subprocess

    import httpx

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    client(served).completions.create(model="chat", prompt="abc", max_tokens=4)
    text = httpx.get(f"{served.url}/metrics").text
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    problems = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    unknown = [
        p for p in problems
        if not p.startswith("vllm:") or "should not contain ':'" not in p
        if not (p.startswith("evenserve_worker_device_info") and "snake_case" in p)
    ]  # fmt: skip
    assert done.returncode in (0, 3), done.stderr  # 3: lint problems only, no parse error
    assert unknown == []
    assert any(p.startswith("vllm:num_requests_running") for p in problems)


def test_load_report_carries_each_engine(served: BackgroundWorker) -> None:
    import httpx

    from evenserve.core import wire

    c = client(served)
    stream = c.completions.create(model="slow", prompt="x" * 40, max_tokens=3000, stream=True)
    next(iter(stream))  # its first token came: it runs
    report = httpx.get(f"{served.url}{wire.LOAD_PATH}").json()
    stream.close()
    slow = report["llm_by_model"]["slow"]
    assert slow["running"] == 1 and slow["waiting"] == 0
    assert slow["kv_blocks"] == 1000 and slow["block_tokens"] == 16
    assert 0 < slow["kv_usage"] <= 1
    assert slow["step_profile"]["c0_ms"] == pytest.approx(1.0)
    assert report["llm_by_model"]["chat"]["running"] == 0


def test_kserve_v2_names_the_openai_routes_for_an_llm(served: BackgroundWorker) -> None:
    import httpx

    r = httpx.post(f"{served.url}/v2/models/chat/infer", json={"inputs": []})
    assert r.status_code == 404 and "/v1/completions" in r.json()["error"]
    index = httpx.post(f"{served.url}/v2/repository/index").json()
    assert {"name": "chat", "version": "1", "state": "READY"} in index


def test_an_llm_folder_is_not_loaded_by_model_control(tmp_path: Path) -> None:
    from evenserve.core.errors import ConfigError
    from evenserve.worker.repository import load_model

    _, repo = llm_repo(tmp_path)
    with pytest.raises(ConfigError, match=r"kind: llm.*--model-control none"):
        load_model(repo / "chat")


def test_usage_carries_the_prefix_caches_cached_tokens(served: BackgroundWorker) -> None:
    """OpenAI's ``usage.prompt_tokens_details.cached_tokens`` (vLLM's): the prompt tokens the
    engine's prefix cache gave; whole and in a stream's usage chunk."""
    c = client(served)
    prompt = [65 + i % 26 for i in range(40)]  # two whole 16-token blocks and a part
    r = c.completions.create(model="chat", prompt=prompt, max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    r = c.completions.create(model="chat", prompt=prompt, max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 32
    chunks = list(
        c.completions.create(
            model="chat", prompt=prompt, max_tokens=3, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens == 32
