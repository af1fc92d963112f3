"""The pool bench's pieces (``experiment.llm_pool_live``) without a live run: what it writes
for each device's worker and for the gateway (loaded by their own loaders), the scenario both
sides run (time-scaled), the simulator's arrivals reproduced, the live run's figures through
the simulator's summary, the comparison's arithmetic, and the OpenAI client's target headers
and refusal reason. No timing is asserted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import RealClock
from evenserve.core.llm import GenerationRecord, load_step_profiles
from evenserve.experiment.llm_live import scale_profile_set
from evenserve.experiment.llm_pool_live import (
    PREFIX_MAX_BLOCKS,
    REFUSED,
    LiveRun,
    classic_arrivals,
    compare,
    engine_counters,
    gateway_cluster,
    live_figures,
    live_pool_run,
    llm_requests,
    request_rows,
    scale_routing,
    scaled_pool,
    stale_s,
    write_device_repo,
)
from evenserve.gateway.llm_router import id_block_hashes
from evenserve.loadgen.openai_client import OpenAiStreamClient
from evenserve.sched.engine import prompt_hashes
from evenserve.sim.llm import LlmSimRequest
from evenserve.sim.llm_pool import run_pool_arm
from evenserve.sim.llm_pool_scenario import LlmPoolScenario, load_llm_pool_scenario
from evenserve.worker.repository import load_llm_repository, load_repository
from evenserve.workload.llm import LlmRequest

ROOT = Path(__file__).resolve().parents[3]
K = 5.0


@pytest.fixture(scope="module")
def base() -> LlmPoolScenario:
    return load_llm_pool_scenario(ROOT / "scenarios" / "llm-pool.yaml")


@pytest.fixture
def scaled(base: LlmPoolScenario, tmp_path: Path) -> LlmPoolScenario:
    sets = sorted({d.profiles for d in base.doc.devices})
    pdirs = {s: scale_profile_set(base.profile_dir(s), tmp_path / "p" / s, K) for s in sets}
    return scaled_pool(base, 4.0, 1.0, 0.5, 256, K, pdirs, drain_s=10.0)


def test_the_scaled_scenario_is_k_times_slower(base: LlmPoolScenario,
                                               scaled: LlmPoolScenario) -> None:  # fmt: skip
    d, b = scaled.doc, base.doc
    assert (d.duration_s, d.warmup_s, d.drain_s) == (4.0 * K, 1.0 * K, 10.0 * K)
    assert d.signals.scrape_s == b.signals.scrape_s * K
    (_, chat), (_, chat0) = scaled.workloads[0], base.workloads[0]
    assert chat.rate_rps == pytest.approx((chat0.rate_rps or 0) * 0.5 / K)
    assert chat.vocab == 256
    assert chat.phases[0].start_s == chat0.phases[0].start_s * K
    assert chat.tpot_ms == (chat0.tpot_ms or 0) * K
    assert chat.classes[0].ttft_ms == (chat0.classes[0].ttft_ms or 0) * K
    assert d.classic[0].rate_rps == pytest.approx(b.classic[0].rate_rps * 0.5 / K)
    assert d.classic[0].slo_ms == b.classic[0].slo_ms * K
    # routing parameters in seconds, and a stale arm's staleness
    assert d.arms["kv-load"].routing["staleness_s"] == 2.0 * K
    assert stale_s(scaled, "predicted-ttft-stale5") == 5.0 * K
    assert stale_s(scaled, "predicted-ttft") == 0.0
    # each device's profile set is the scaled copy
    for dev in d.devices:
        prof = load_step_profiles(scaled.profile_dir(dev.profiles))["llama-3.1-8b"]
        prof0 = load_step_profiles(base.profile_dir(
            next(x.profiles for x in b.devices if x.name == dev.name)))["llama-3.1-8b"]  # fmt: skip
        assert prof.c0_s == pytest.approx(prof0.c0_s * K)


def test_scale_routing_scales_seconds_only() -> None:
    assert scale_routing("round-robin", K) == "round-robin"
    spec = {"policy": "predicted-ttft", "default_base_s": 0.05, "default_s_per_token": 1e-5,
            "headroom": 0.5, "refuse_over": 0.9}  # fmt: skip
    out = scale_routing(spec, K)
    assert out["default_base_s"] == pytest.approx(0.25)
    assert out["default_s_per_token"] == pytest.approx(5e-5)
    assert (out["headroom"], out["refuse_over"], out["policy"]) == (0.5, 0.9, "predicted-ttft")


def test_each_devices_repository_loads_as_the_worker_loads_it(
    scaled: LlmPoolScenario, tmp_path: Path
) -> None:
    for dev in scaled.doc.devices:
        repo = write_device_repo(scaled, dev.name, tmp_path / "repos")
        (llm,) = load_llm_repository(repo)
        c = llm.config
        assert (c.runtime, c.tokenizer, c.tpot_ms) == ("emulated", "byte", 50.0 * K)
        e = c.engine
        assert (e.mode, e.max_num_batched_tokens, e.max_num_seqs, e.num_blocks) == (
            "continuous-chunked", 512, 256, 4096,
        )  # fmt: skip
        assert e.prefix_caching is True
        classic = sorted(m.name for m in load_repository(repo, check_profiles=False))
        assert classic == sorted(dev.classic)
        raw = yaml.safe_load((repo / "resnet50" / "model.yaml").read_text())
        assert raw["slo_ms"] == 25.0 * K and raw["batching"]["max_batch_delay_ms"] == 2.0 * K


def test_the_gateway_cluster_file_is_the_arms_router_on_the_scenarios_signals(
    scaled: LlmPoolScenario,
) -> None:
    urls = {d.name: f"http://127.0.0.1:{9000 + i}" for i, d in enumerate(scaled.doc.devices)}
    raw = gateway_cluster(scaled, "kv-load", urls, 8123)
    g = parse_cluster(raw, Path(".")).config.gateway
    assert g.llm_routing == {"policy": "kv-load", "staleness_s": 2.0 * K}
    assert g.seed == scaled.doc.seed and g.port == 8123
    assert g.signals.interval_ms == pytest.approx(1000.0 * K)
    assert g.signals.idle_interval_ms == pytest.approx(1000.0 * K)
    assert g.signals.stale_after_ms > g.signals.interval_ms
    assert (g.llm.chars_per_token, g.llm.prefix_block_tokens) == (1.0, 16)
    assert g.llm.prefix_max_blocks == PREFIX_MAX_BLOCKS
    assert g.forward.retries == 0 and g.overload.enabled is False
    assert [b["name"] for b in raw["backends"]] == list(urls)


def test_a_stale_arms_gateway_holds_its_samples_back_as_long(scaled: LlmPoolScenario) -> None:
    urls = {d.name: f"http://127.0.0.1:{9000 + i}" for i, d in enumerate(scaled.doc.devices)}
    stale = parse_cluster(
        gateway_cluster(scaled, "predicted-ttft-stale5", urls, 8123), Path(".")
    ).config.gateway
    fresh = parse_cluster(gateway_cluster(scaled, "predicted-ttft", urls, 8123), Path("."))
    assert stale.llm.signal_delay_ms == pytest.approx(5000.0 * K)
    assert fresh.config.gateway.llm.signal_delay_ms == 0.0
    # the held samples' corrections are not dropped as stale (the simulator drops none)
    assert stale.llm.stale_after_ms > stale.llm.signal_delay_ms + stale.signals.interval_ms


def test_the_gateways_block_names_match_the_engines_blocks() -> None:
    """Two prompts share as many leading names at the gateway (ids in blocks of 16) as the
    engine's cache shares blocks of them (``prompt_hashes``)."""
    shared = list(range(100, 100 + 16 * 5 + 7))
    for tail in ([1, 2, 3], [9] * 40):
        a, b = shared + tail, [*shared, 7, *tail]

        def lead(x: list[int], y: list[int]) -> int:
            return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                        min(len(x), len(y)))  # fmt: skip

        gateway = lead(id_block_hashes(a, 16), id_block_hashes(b, 16))
        assert gateway == lead(prompt_hashes(tuple(a), 16), prompt_hashes(tuple(b), 16)) == 5


def test_live_arrivals_are_the_simulators(scaled: LlmPoolScenario) -> None:
    run = run_pool_arm(scaled, "round-robin")
    sim_llm = sorted((r.scheduled_s, r.prompt_tokens) for r in run.records)
    live_llm = sorted(
        (r.arrival_s, r.prompt_tokens) for r, _ in llm_requests(scaled, "round-robin")
    )
    assert live_llm == sim_llm
    sim_classic = sorted(
        (r.arrival_s, dev, m) for dev, ar in run.devices.items()
        for m, reqs in ar.classic.items() for r in reqs
    )  # fmt: skip
    live_classic = [(t, dev, m) for t, dev, m, _ in classic_arrivals(scaled)]
    assert live_classic == sim_classic


def test_an_arms_rate_scale_applies_to_the_live_requests(base: LlmPoolScenario) -> None:
    doc = base.doc.model_copy(deep=True)
    doc.arms["predicted-ttft"].rate_scale = 3.0
    doc.duration_s, doc.warmup_s = 20.0, 0.0
    sc = LlmPoolScenario(doc, base.source, base.base_dir)
    n1 = len(llm_requests(sc, "round-robin"))
    n3 = len(llm_requests(sc, "predicted-ttft"))
    assert n3 > 2 * n1


def _rec(rid: int, t: float, outcome: str = "completed", ttft: float = 0.1) -> GenerationRecord:
    r = GenerationRecord(request_id=rid, model="llama-3.1-8b", scheduled_s=t, prompt_tokens=100,
                         ttft_target_s=1.0, tpot_target_s=0.05)  # fmt: skip
    r.outcome = outcome
    if outcome == "completed":
        r.token_times_s = [t + ttft, t + ttft + 0.02, t + ttft + 0.04]
        r.finished_s = t + ttft + 0.04
    else:
        r.finished_s = t
    return r


def test_the_live_runs_figures_go_through_the_simulators_summary(
    scaled: LlmPoolScenario,
) -> None:
    w0 = scaled.doc.warmup_s
    live = LiveRun(
        records=[_rec(1, w0 + 1), _rec(2, w0 + 2, ttft=2.0), _rec(3, w0 + 3, REFUSED)],
        workload_of={1: "chat", 2: "tenants", 3: "tenants"},
        refused=1,
        wall_s=scaled.doc.duration_s + 1,
    )
    live.classic = {d.name: {m: [] for m in d.classic} for d in scaled.doc.devices}
    r = LlmSimRequest(9, "resnet50", w0 + 1, 10, None, 1)
    r.done_s, r.outcome = w0 + 1.001, "completed"
    live.classic["h100-0"]["resnet50"].append(r)
    counters = {"h100-0": {"requests": 2.0, "preemptions": 1.0, "prefix_queries": 200.0,
                           "prefix_hits": 50.0}}  # fmt: skip
    live.engine_of = {1: "h100-0", 2: "a100-1"}
    run = live_pool_run(scaled, "predicted-ttft", live, counters)
    rows = request_rows(run)
    assert [r[0] for r in rows] == ["chat", "tenants", "tenants"]
    assert rows[0][3] == pytest.approx(0.1) and rows[0][5:] == ["h100-0", 3, pytest.approx(0.04)]
    assert rows[2][3:6] == [None, REFUSED, None]
    f = live_figures(scaled, run)
    assert f["llm"]["requests"] == 3 and f["llm"]["completed"] == 2
    assert f["llm"]["met_targets"] == 1  # the second missed its TTFT target
    assert f["refused_by_router"] == 1
    assert f["admitted"] == {"worst_ttft_over_target": 2.0, "over_target": 1, "with_target": 2}
    assert f["by_workload"]["tenants"]["requests"] == 2
    assert f["classic"]["resnet50"]["completed"] == 1
    h = f["devices"]["h100-0"]
    assert (h["routed"], h["preemptions"], h["prefix_cache_hit_rate"]) == (2, 1, 0.25)
    assert h["utilization"] is None and h["kv_usage"] is None
    assert f["devices"]["a100-1"]["routed"] == 0


def test_compare_in_scenario_units_and_the_bound() -> None:
    def fig(goodput: float, ttft_p90: float, p50: float) -> dict[str, Any]:
        s = {"goodput_rps": goodput, "completed": 10, "ttft_ms": {"mean": ttft_p90,
             "p50": ttft_p90, "p90": ttft_p90, "p99": ttft_p90},
             "tpot_ms": {"mean": 50.0, "p90": 50.0}}  # fmt: skip
        classic = {"p50_ms": p50, "p99_ms": None, "goodput_rps": 0.0}
        return {"llm": s, "by_workload": {"chat": s}, "refused_by_router": 0,
                "classic": {"resnet50": classic}}  # fmt: skip

    live = fig(0.9, 600.0, 11.0)
    live["llm"] = {**live["llm"], "refused": {"unfinished": 3}}
    live["admitted"] = {"worst_ttft_over_target": 1.5, "over_target": 2}
    rows = {r["figure"]: r for r in compare(fig(1.0, 500.0, 10.0), live, k=5)}
    g = rows["LLM goodput rps"]
    assert (g["sim"], g["live"]) == (pytest.approx(5.0), pytest.approx(4.5))
    assert g["ratio"] == pytest.approx(0.9) and g["within"] is True
    t = rows["chat: TTFT p90 ms"]
    assert (t["sim"], t["live"]) == (pytest.approx(100.0), pytest.approx(120.0))
    assert t["within"] is False  # 20 % over
    assert rows["resnet50 P50 ms"]["within"] is True  # 10 %
    assert rows["resnet50 P99 ms"]["within"] is None  # no figure
    assert rows["resnet50 goodput rps"]["within"] is True  # 0 both sides
    assert rows["router refusals"]["within"] is True
    assert rows["LLM completed"]["sim"] == 10  # a count is not scaled
    u = rows["LLM unfinished"]  # none on one side counts 0
    assert (u["sim"], u["live"], u["within"]) == (0.0, 3.0, None)
    assert rows["chat: unfinished"]["within"] is True  # 0 both sides
    w = rows["admitted: worst TTFT / target"]
    assert (w["sim"], w["live"], w["within"]) == (None, 1.5, None)


def test_engine_counters_from_a_workers_metrics_text() -> None:
    text = "\n".join([
        "# TYPE evenserve_worker_llm_requests counter",
        'evenserve_worker_llm_requests_total{model_name="m",outcome="success"} 7.0',
        'evenserve_worker_llm_requests_total{model_name="m",outcome="cancelled"} 1.0',
        'evenserve_worker_llm_requests_total{model_name="other",outcome="success"} 5.0',
        "# TYPE vllm:num_preemptions counter",
        'vllm:num_preemptions_total{model_name="m"} 2.0',
        "# TYPE vllm:prefix_cache_queries counter",
        'vllm:prefix_cache_queries_total{model_name="m"} 320.0',
        "# TYPE vllm:prefix_cache_hits counter",
        'vllm:prefix_cache_hits_total{model_name="m"} 160.0',
        "",
    ])  # fmt: skip
    assert engine_counters(text, "m") == {
        "requests": 8.0, "preemptions": 2.0, "prefix_queries": 320.0, "prefix_hits": 160.0,
    }  # fmt: skip


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(status=429, text="{}", headers={"x-evenserve-reason": REFUSED,
                                                            "Retry-After": "2"})  # fmt: skip

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    await runner.cleanup()


async def test_the_client_sends_the_targets_and_reads_the_refusals_reason(
    echo: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = echo
    r = LlmRequest(1, "m", 0.0, (1, 2, 3), 4, priority=0, ttft_target_s=5.0, tpot_target_s=0.05)
    async with OpenAiStreamClient(url, RealClock(), target_headers=True) as c:
        reply = await c.send(r)
    async with OpenAiStreamClient(url, RealClock()) as c:
        await c.send(r)
    h = {k.lower(): v for k, v in seen[0].items()}
    assert (h["x-evenserve-ttft-ms"], h["x-evenserve-tpot-ms"]) == ("5000", "50")
    assert h["x-evenserve-priority"] == "0"
    assert reply.status == 429 and reply.reason == REFUSED and reply.retry_after_s == 2.0
    assert "x-evenserve-ttft-ms" not in {k.lower() for k in seen[1]}


def test_evenserve_bench_takes_a_pool_scenario_and_its_options() -> None:
    from typer.testing import CliRunner

    from evenserve.cli.main import app

    pool = str(ROOT / "scenarios" / "llm-pool.yaml")
    res = CliRunner().invoke(app, ["bench", "--scenario", pool, "--arms", "nope"])
    assert res.exit_code == 2 and "unknown arm 'nope'" in res.output
    res = CliRunner().invoke(app, ["bench", "--scenario", pool, "--rate-scale", "0"])
    assert res.exit_code == 2 and "--rate-scale: must be > 0" in res.output
    res = CliRunner().invoke(app, ["bench", "--scenario", pool, "--seed", "3"])
    assert res.exit_code == 2 and "not an LLM one" in res.output
    classic = str(ROOT / "scenarios" / "many-models.yaml")
    res = CliRunner().invoke(app, ["bench", "--scenario", classic, "--rate-scale", "0.5"])
    assert res.exit_code != 0 and "--rate-scale: only with an LLM scenario" in res.output
