"""TorchStepExecutor: batched, chunked and recomputed sequences give the tokens the model
gives each sequence alone (transformers' generate, greedy, float32)."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pydantic import ValidationError  # noqa: E402

from evenserve.core.errors import ConfigError  # noqa: E402
from evenserve.core.llm import StepEntry, StepExecutor  # noqa: E402
from evenserve.runtime.llm.tokenizer import ByteTokenizer  # noqa: E402
from evenserve.runtime.llm.torch_executor import (  # noqa: E402
    TINY_LLAMA,
    LlmTorchParams,
    TorchStepExecutor,
    build_executor,
    parameter_count,
)

#: Wider initial weights than the default (0.02) separate the logits: no near-ties.
CONFIG = {**TINY_LLAMA, "initializer_range": 0.2}
SEED = 1
N_OUT = 12
PAD = 258


def _executor(**kw: Any) -> TorchStepExecutor:
    torch.set_num_threads(1)
    kw.setdefault("seed", SEED)
    kw.setdefault("config", CONFIG)
    return build_executor(Path("."), LlmTorchParams(**kw))


def _prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(256) for _ in range(n)] for n in (5, 23, 40, 9, 17, 31)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Each prompt alone through generate (greedy), checked free of near-ties."""
    model = copy.deepcopy(_executor().model)
    model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = None
    outs = []
    with torch.inference_mode():
        for p in _prompts():
            ids = torch.tensor([p])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=N_OUT,
                min_new_tokens=N_OUT,
                do_sample=False,
                pad_token_id=PAD,
                output_logits=True,
                return_dict_in_generate=True,
            )
            for logits in out.logits:  # the test means something only without near-ties
                top = logits[0].topk(2).values
                assert float(top[0] - top[1]) > 1e-4
            outs.append(out.sequences[0, len(p) :].tolist())
    assert len({tuple(o) for o in outs}) == len(outs)
    return outs


def _run(
    ex: StepExecutor,
    prompts: Sequence[list[int]],
    *,
    chunk: int = 10**9,
    max_batch: int = 10**9,
) -> list[list[int]]:
    """Continuous batching in miniature: decodes plus prompt chunks (of ``chunk`` tokens)
    each step, at most ``max_batch`` sequences running, a finished one freed at once."""
    waiting = list(range(len(prompts)))
    running: list[int] = []
    fed = dict.fromkeys(waiting, 0)
    out: dict[int, list[int]] = {i: [] for i in waiting}
    feed = [list(p) for p in prompts]
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(waiting.pop(0))
        entries = []
        for i in running:
            if fed[i] < len(feed[i]):
                toks = feed[i][fed[i] : fed[i] + chunk]
                entries.append(StepEntry(i, toks, fed[i], fed[i] + len(toks) == len(feed[i])))
            else:
                entries.append(StepEntry(i, [out[i][-1]], len(feed[i]) + len(out[i]) - 1, True))
        got = ex.step(entries)
        assert set(got) == {e.seq_id for e in entries if e.sample}
        for e in entries:
            if fed[e.seq_id] < len(feed[e.seq_id]):
                fed[e.seq_id] += len(e.tokens)
            if e.seq_id in got:
                out[e.seq_id].append(got[e.seq_id])
        for i in list(running):
            if len(out[i]) >= N_OUT:
                running.remove(i)
                ex.free(i)
    return [out[i] for i in range(len(prompts))]


def test_one_sequence_alone_matches_generate(reference: list[list[int]]) -> None:
    ex = _executor()
    got = [_run(ex, [p])[0] for p in _prompts()]
    assert got == reference
    assert ex.active_seqs == 0


def test_all_together_match_generate(reference: list[list[int]]) -> None:
    assert _run(_executor(), _prompts()) == reference


def test_chunked_prefill_and_admission_as_others_finish_match_generate(
    reference: list[list[int]],
) -> None:
    # chunks of 7 (prompts split into up to 6), at most 3 running: later ones join mid-way
    # while others decode; slots freed by finished sequences are reused
    assert _run(_executor(max_seqs=1), _prompts(), chunk=7, max_batch=3) == reference


def test_preemption_by_recompute_matches_generate(reference: list[list[int]]) -> None:
    ex = _executor()
    prompts = _prompts()
    # run sequence 2 for 5 tokens beside the others, free it, then recompute its prompt and
    # its 5 tokens from position 0 and go on: its tokens are still generate's
    first = _run_partial(ex, prompts[2], 2, 5)
    ex.free(2)
    assert first == reference[2][:5]
    rest = _continue(ex, 2, [*prompts[2], *first], N_OUT - 5, chunk=8)
    assert [*first, *rest] == reference[2]


def _run_partial(ex: TorchStepExecutor, prompt: list[int], seq_id: int, n: int) -> list[int]:
    out = [ex.step([StepEntry(seq_id, prompt, 0, True), StepEntry(99, [1, 2, 3], 0, True)])[seq_id]]
    other = 3
    while len(out) < n:
        got = ex.step(
            [
                StepEntry(99, [7], other, True),
                StepEntry(seq_id, [out[-1]], len(prompt) + len(out) - 1, True),
            ]
        )
        other += 1
        out.append(got[seq_id])
    ex.free(99)
    return out


def _continue(
    ex: TorchStepExecutor, seq_id: int, context: list[int], n: int, chunk: int
) -> list[int]:
    """Prefill ``context`` in chunks (only the last chunk samples), then decode: the ``n``
    tokens after ``context``."""
    pos = 0
    out: list[int] = []
    while pos < len(context):
        toks = context[pos : pos + chunk]
        last = pos + len(toks) == len(context)
        got = ex.step([StepEntry(seq_id, toks, pos, last)])
        assert (seq_id in got) == last
        pos += len(toks)
        if last:
            out.append(got[seq_id])
    while len(out) < n:
        out.append(
            ex.step([StepEntry(seq_id, [out[-1]], len(context) + len(out) - 1, True)])[seq_id]
        )
    return out


def test_a_start_before_the_end_recomputes_from_there(reference: list[list[int]]) -> None:
    ex = _executor()
    p = _prompts()[1]
    ex.step([StepEntry(5, p, 0, True)])
    # feed the last 6 prompt tokens again from their position: the cache past it is rewritten
    got = ex.step([StepEntry(5, p[-6:], len(p) - 6, True)])
    assert got[5] == reference[1][0]


def test_wrong_entries_are_refused_with_the_sequence_named() -> None:
    ex = _executor(max_model_len=64)
    with pytest.raises(ValueError, match="seq 3: start 4 but the executor holds no cache"):
        ex.step([StepEntry(3, [1], 4, True)])
    ex.step([StepEntry(3, [1, 2], 0, True)])
    with pytest.raises(ValueError, match="seq 3: start 5 is past the 2 tokens"):
        ex.step([StepEntry(3, [1], 5, True)])
    with pytest.raises(ValueError, match="seq 3: twice in one step"):
        ex.step([StepEntry(3, [1], 2, True), StepEntry(3, [1], 2, True)])
    with pytest.raises(ValueError, match="seq 4: token id 300 is outside"):
        ex.step([StepEntry(4, [300], 0, True)])
    with pytest.raises(ValueError, match="seq 4: 65 tokens exceed max_model_len 64"):
        ex.step([StepEntry(4, [1] * 65, 0, True)])
    with pytest.raises(ValueError, match="seq 4: a step entry needs at least one token"):
        ex.step([StepEntry(4, [], 0, True)])
    assert ex.step([]) == {}


def test_a_chunk_that_does_not_sample_returns_nothing() -> None:
    ex = _executor()
    assert ex.step([StepEntry(1, [1, 2, 3], 0, False)]) == {}
    assert set(ex.step([StepEntry(1, [4], 3, True), StepEntry(2, [5, 6], 0, False)])) == {1}


def test_temperature_sampling_is_seeded() -> None:
    p = _prompts()[2]

    def sample(seed: int) -> list[int]:
        ex = _executor(temperature=1.0, seed=seed)
        toks = [ex.step([StepEntry(0, p, 0, True)])[0]]
        for i in range(15):
            toks.append(ex.step([StepEntry(0, [toks[-1]], len(p) + i, True)])[0])
        return toks

    a = sample(3)
    assert a == sample(3)
    assert all(0 <= t < CONFIG["vocab_size"] for t in a)
    assert a != sample(4)


def test_bfloat16_runs_and_reports_its_kv_bytes() -> None:
    ex = _executor(dtype="bfloat16")
    got = ex.step([StepEntry(0, [1, 2, 3], 0, True), StepEntry(1, [4], 0, True)])
    assert set(got) == {0, 1}
    # 2 layers x 2 KV heads x head_dim 16 x (K and V) x 2 bytes
    assert ex.kv_bytes_per_token == 2 * 2 * 16 * 2 * 2


def test_describe_and_resident_bytes() -> None:
    ex = _executor()
    d = ex.describe()
    assert d["runtime"] == "torch-llm" and d["architecture"] == "LlamaForCausalLM"
    assert d["weights"] == "random (seed 1), llama config"
    assert d["dtype"] == "float32" and d["sampling"] == "greedy"
    assert d["parameters"] == parameter_count(CONFIG)
    assert d["kv_bytes_per_token"] == ex.kv_bytes_per_token == 2 * 2 * 16 * 2 * 4
    before = ex.resident_bytes()
    assert before > d["weights_bytes"]  # the KV slots count
    ex.step([StepEntry(i, [1, 2], 0, True) for i in range(40)])  # more slots than it had
    assert ex.resident_bytes() > before


def test_hub_names_and_missing_paths_are_refused(tmp_path: Path) -> None:
    for field in ("config", "weights"):
        with pytest.raises(ConfigError, match=f"llm_torch.{field}: 'meta-llama/Llama-3.2-1B'"):
            build_executor(tmp_path, LlmTorchParams(**{field: "meta-llama/Llama-3.2-1B"}))
    with pytest.raises(ConfigError, match=r"llm_torch\.config: required"):
        build_executor(tmp_path, LlmTorchParams())
    with pytest.raises(ValidationError, match="device"):
        LlmTorchParams(config=CONFIG, device="tpu")
    with pytest.raises(ValidationError, match="dtype"):
        LlmTorchParams(config=CONFIG, dtype="int4")


def test_a_config_json_and_a_saved_folder_load(tmp_path: Path, reference: list[list[int]]) -> None:
    import json

    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(CONFIG))
    from_file = build_executor(tmp_path, LlmTorchParams(config="cfg/config.json", seed=SEED))
    assert _run(from_file, _prompts()[:2]) == reference[:2]
    from_folder = build_executor(tmp_path, LlmTorchParams(config="cfg", seed=SEED))
    assert _run(from_folder, _prompts()[:1]) == reference[:1]
    # a save_pretrained folder: its weights, whatever the seed
    saved = copy.deepcopy(from_file.model)
    saved.set_attn_implementation("sdpa")
    saved.save_pretrained(tmp_path / "weights")
    loaded = build_executor(tmp_path, LlmTorchParams(weights="weights", seed=12345))
    assert loaded.describe()["weights"] == "pretrained: weights"
    assert _run(loaded, _prompts()[:2]) == reference[:2]
    with pytest.raises(ConfigError, match="not both"):
        build_executor(tmp_path, LlmTorchParams(weights="weights", config=CONFIG))


def test_the_tokenizer_sets_eos_and_must_fit_the_vocabulary() -> None:
    params = LlmTorchParams(config=CONFIG, seed=SEED)
    assert build_executor(Path("."), params, ByteTokenizer()).eos_token_id == 257
    assert build_executor(Path("."), params).eos_token_id is None
    ids = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    small = LlmTorchParams(config={**CONFIG, **ids, "vocab_size": 200})
    with pytest.raises(ConfigError, match="the tokenizer has 259 ids, the model's vocabulary 200"):
        build_executor(Path("."), small, ByteTokenizer())


def test_a_config_that_cannot_build_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"llm_torch\.config: cannot build a causal LM"):
        _executor(config={**CONFIG, "vocab_size": 200})  # padding id 258 outside it


def test_max_model_len_beyond_the_positions_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"llm_torch\.max_model_len: 4096 is more than"):
        _executor(max_model_len=4096)


def test_sampling_per_request_seeded_nucleus_and_greedy_side_by_side(
    reference: list[list[int]],
) -> None:
    """Each entry's own temperature, top_p and seed (an OpenAI request's), in one step:
    a greedy sequence keeps generate's tokens next to a sampled one; a seeded one repeats
    whatever else runs beside it; a nucleus too small for a second token is greedy."""
    p0, p1 = _prompts()[0], _prompts()[2]

    def run(entries_for: Any, n: int = 10) -> dict[int, list[int]]:
        ex = _executor()
        out: dict[int, list[int]] = {0: [], 1: []}
        got = ex.step([entries_for(0, p0, 0), entries_for(1, p1, 0)])
        for sid in (0, 1):
            out[sid].append(got[sid])
        for i in range(n - 1):
            got = ex.step([
                entries_for(0, [out[0][-1]], len(p0) + i),
                entries_for(1, [out[1][-1]], len(p1) + i),
            ])  # fmt: skip
            for sid in (0, 1):
                out[sid].append(got[sid])
        return out

    def mixed(seed: int) -> Any:
        def make(sid: int, toks: list[int], start: int) -> StepEntry:
            if sid == 0:  # greedy
                return StepEntry(sid, toks, start, True, 0.0)
            return StepEntry(sid, toks, start, True, 1.5, 0.95, seed)

        return make

    a, b = run(mixed(11)), run(mixed(11))
    assert a[1] == b[1]  # seeded: repeatable
    assert a[0] == reference[0][: len(a[0])]  # greedy beside it: generate's tokens
    assert run(mixed(12))[1] != a[1]
    nucleus = run(lambda sid, t, s: StepEntry(sid, t, s, True, 1.0, 1e-9, 5))
    assert nucleus[0] == reference[0][:10] and nucleus[1] == reference[2][:10]
