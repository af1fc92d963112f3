"""The live side of an LLM scenario: a worker serving a tiny emulated LLM (a step profile
written here), driven by the load generator's streaming client (``run_open_loop``) with the
requests ``workload.llm`` draws for the simulator. Every request must complete with the token
count it asked for, the usage the stream reported and its prompt's length; no timing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from evenserve.core.clock import RealClock
from evenserve.loadgen.openai_client import OpenAiStreamClient, StreamedReply, run_open_loop
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_llm_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.workload.llm import LlmWorkloadSpec, llm_open_loop

STEP_PROFILE = """kind: llm-step
model: tiny-llm
device: test device (synthetic)
runtime: emulated
precision: bf16
source: synthetic, for a test (fast steps)
c0_ms: 0.3
prefill_us_per_token: 1.0
decode_us_per_seq: 1.0
weights_gib: 0.001
kv_bytes_per_token: 1024
device_memory_gib: 1.0
max_model_len: 2048
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[BackgroundWorker]:
    pset = tmp_path / "set"
    pset.mkdir()
    (pset / "tiny-llm.yaml").write_text(STEP_PROFILE)
    folder = tmp_path / "repo" / "tiny-llm"
    folder.mkdir(parents=True)
    (folder / "model.yaml").write_text(
        "kind: llm\nruntime: emulated\ntokenizer: byte\ntpot_ms: 50\n"
        "engine: {mode: continuous-chunked, max_num_seqs: 8, max_num_batched_tokens: 64}\n"
    )
    entries = load_llm_repository(tmp_path / "repo")
    service = Worker(
        [], WorkerOptions(device=parse_device(f"emulated:{pset}")), llm_entries=entries
    )
    with BackgroundWorker(service) as w:
        yield w


def workload(**over: object) -> LlmWorkloadSpec:
    spec = {
        "model": "tiny-llm",
        "rate_rps": 200.0,
        "prompt_tokens": {"dist": "uniform", "min": 8, "max": 150},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 24},
        "prefix_groups": {"groups": 2, "tokens": 32, "share": 0.5},
        "vocab": 256,  # the byte-level tokenizer's ids
        "ttft_ms": 5000,
        "tpot_ms": 1000,
    }
    spec.update(over)
    return LlmWorkloadSpec.model_validate(spec)


def test_open_loop_requests_complete_with_their_token_counts(served: BackgroundWorker) -> None:
    requests = llm_open_loop(workload(), seed=3, duration_s=10.0, max_requests=12)
    assert len(requests) == 12
    records = asyncio.run(run_open_loop(served.url, requests, RealClock(), timeout_s=60.0))
    assert len(records) == len(requests)
    for req, rec in zip(requests, records, strict=True):
        assert rec.outcome == "completed", rec
        assert rec.request_id == req.request_id and rec.model == "tiny-llm"
        assert rec.scheduled_s == req.arrival_s
        # The usage's prompt tokens: the very ids sent (a shared prefix and the rest).
        assert rec.prompt_tokens == req.prompt_tokens
        assert rec.output_tokens == req.max_tokens
        assert rec.token_times_s is not None
        assert rec.token_times_s == sorted(rec.token_times_s)
        assert rec.finished_s is not None and rec.finished_s >= rec.token_times_s[-1]
        assert rec.ttft_target_s == 5.0 and rec.tpot_target_s == 1.0


def test_one_stream_counts_match_the_final_usage(served: BackgroundWorker) -> None:
    (req,) = llm_open_loop(workload(output_tokens={"dist": "fixed", "value": 17}), 5, 10.0, 1)

    async def send() -> StreamedReply:
        async with OpenAiStreamClient(served.url, RealClock(), timeout_s=60.0) as c:
            return await c.send(req, 0.0)

    reply = asyncio.run(send())
    assert reply.record.outcome == "completed"
    assert reply.finish_reason == "length"
    assert reply.usage_tokens == reply.counted_tokens == 17
    # One byte-level character per emulated token.
    assert len(reply.text) == 17


def test_a_prompt_past_the_context_is_refused_not_lost(served: BackgroundWorker) -> None:
    spec = workload(prompt_tokens={"dist": "fixed", "value": 2040}, prefix_groups=None)
    spec = spec.model_copy(update={"output_tokens": workload().output_tokens})
    requests = llm_open_loop(spec, seed=1, duration_s=10.0, max_requests=3)
    records = asyncio.run(run_open_loop(served.url, requests, RealClock(), timeout_s=60.0))
    for req, rec in zip(requests, records, strict=True):
        if req.prompt_tokens + req.max_tokens > 2048:
            assert rec.outcome == "http-400" and not rec.token_times_s
        else:
            assert rec.outcome == "completed" and rec.output_tokens == req.max_tokens
