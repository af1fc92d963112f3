"""An emulated LLM under placement on the worker (design 0022): on disk until loaded (its
cold load), put to sleep by an unload (its engine off the device, weights in host memory: a
request for it is 404 as for a classic model not loaded), woken by a load (its warm load, the
folder's ``placement.warm_load_ms``), requests during the wake wait for it and are answered;
the load report carries ``engine_utilization``; a wake the device's memory cannot hold is
refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from evenserve.core.options import DeviceOptions
from evenserve.runtime.device import parse_device
from evenserve.runtime.host_pool import HostPool
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_llm_repository
from evenserve.worker.server import BackgroundWorker

STEP = """kind: llm-step
model: {name}
device: test
runtime: emulated
precision: bf16
source: a test's (fast steps)
c0_ms: 2.0
prefill_us_per_token: 1.0
decode_us_per_seq: 1.0
cpu_ms_per_output_token: 0
weights_gib: {weights}
kv_bytes_per_token: 1024
device_memory_gib: 8.0
max_model_len: 1024
"""

PLACED = (
    "kind: llm\nruntime: emulated\nttft_ms: 1000\ntpot_ms: 50\n"
    "engine: {{mode: continuous-chunked, max_num_seqs: 8}}\n"
    "placement: {{kv_tokens: {kv}, cold_load_ms: {cold}, warm_load_ms: {warm},"
    " capacity: {{prompt_tokens: 100, output_tokens: 20}}}}\n"
)


def placed_repo(
    root: Path, names: dict[str, float], cold_ms: float = 400, warm_ms: float = 150
) -> tuple[Path, Path]:
    """A profile set and a repository of placed emulated LLMs (name -> weights GiB), each
    with a KV cache of 2048 tokens (2 MiB)."""
    pset, repo = root / "set", root / "repo"
    pset.mkdir()
    for name, w in names.items():
        (pset / f"{name}.yaml").write_text(STEP.format(name=name, weights=w))
        d = repo / name
        d.mkdir(parents=True)
        (d / "model.yaml").write_text(PLACED.format(kv=2048, cold=cold_ms, warm=warm_ms))
    return pset, repo


def start_worker(
    pset: Path,
    repo: Path,
    awake: set[str],
    memory_gb: float | None = None,
    pool: Path | None = None,
) -> BackgroundWorker:
    device = f"emulated:{pset}"
    options = WorkerOptions(
        device=parse_device(device),
        model_control="explicit",
        repository=repo,
        repository_poll_s=3600.0,
        host_pool=pool,
        host_pool_bytes=0.0 if pool is None else 4 * 2**30,
        **({} if memory_gb is None else {"run": DeviceOptions(memory_gb=memory_gb)}),
    )
    service = Worker([], options, llm_entries=load_llm_repository(repo), llm_awake=awake)
    return BackgroundWorker(service)


@pytest.fixture
def one(tmp_path: Path) -> Iterator[BackgroundWorker]:
    pset, repo = placed_repo(tmp_path, {"llm": 0.5})
    with start_worker(pset, repo, set()) as w:
        yield w


def state(c: httpx.Client, name: str) -> dict[str, str]:
    index = c.post("/v2/repository/index").json()
    return next(m for m in index if m["name"] == name)


def complete(c: httpx.Client, model: str = "llm") -> httpx.Response:
    return c.post("/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": 4})


def slept(w: BackgroundWorker) -> list[float]:
    """The emulated load times the worker's LLM loads sleep, recorded as they are asked."""
    asked: list[float] = []
    res = w.worker.residency

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await asyncio.sleep(seconds)

    res._sleep = sleep
    return asked


def test_cold_load_then_sleep_then_wake(one: BackgroundWorker) -> None:
    asked = slept(one)
    with httpx.Client(base_url=one.url, timeout=30) as c:
        st = state(c, "llm")
        assert st["state"] == "UNAVAILABLE" and "disk" in st["reason"]
        r = complete(c)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "not loaded here" in r.json()["error"]["message"]
        rep = c.get("/v2/evenserve/load").json()
        assert rep["llm_by_model"] == {} and rep["engine_utilization"] == 0.0
        r = c.post("/v2/repository/models/llm/load")
        assert r.status_code == 200, r.text
        assert r.json()["load_source"] == "disk" and asked == [0.4]  # cold_load_ms
        assert state(c, "llm")["state"] == "READY"
        assert complete(c).status_code == 200
        rep = c.get("/v2/evenserve/load").json()
        assert rep["llm_by_model"]["llm"]["kv_blocks"] == 2048 // 16
        assert 0.0 < rep["engine_utilization"] <= 1.0
        # Sleep: the engine leaves the device; weights stay in host memory.
        used = rep["memory_used_bytes"]
        assert c.post("/v2/repository/models/llm/unload").status_code == 200
        st = state(c, "llm")
        assert st["state"] == "UNAVAILABLE" and "asleep" in st["reason"]
        r = complete(c)
        assert r.status_code == 404
        rep = c.get("/v2/evenserve/load").json()
        assert rep["llm_by_model"] == {} and rep["memory_used_bytes"] < used
        # A second unload is refused: it is not loaded.
        assert c.post("/v2/repository/models/llm/unload").status_code == 400
        # Wake: from host memory, the warm load's time.
        r = c.post("/v2/repository/models/llm/load")
        assert r.status_code == 200 and r.json()["load_source"] == "host"
        assert asked == [0.4, 0.15]  # then warm_load_ms: a wake from host memory
        assert complete(c).status_code == 200
        metrics = c.get("/metrics").text
        assert 'evenserve_model_load_sources_total{model="llm",source="disk"} 1.0' in metrics
        assert 'evenserve_model_load_sources_total{model="llm",source="host"} 1.0' in metrics


async def test_requests_during_a_wake_wait_for_it_and_are_answered(
    one: BackgroundWorker,
) -> None:
    async with httpx.AsyncClient(base_url=one.url, timeout=30) as c:
        load = asyncio.ensure_future(c.post("/v2/repository/models/llm/load"))
        while (await c.post("/v2/repository/index")).json()[0]["state"] != "LOADING":
            await asyncio.sleep(0.01)
        body = {"model": "llm", "prompt": "hi", "max_tokens": 3}
        rs = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3)))
        assert [r.status_code for r in rs] == [200, 200, 200]
        assert (await load).status_code == 200


def test_a_wake_the_memory_cannot_hold_is_refused(tmp_path: Path) -> None:
    pset, repo = placed_repo(tmp_path, {"a": 0.6, "b": 0.6})
    with (
        start_worker(pset, repo, {"a"}, memory_gb=1.0) as w,
        httpx.Client(base_url=w.url, timeout=30) as c,
    ):
        assert state(c, "a")["state"] == "READY"
        r = c.post("/v2/repository/models/b/load")
        assert r.status_code == 400 and "not enough device memory" in r.text
        assert state(c, "b")["state"] == "UNAVAILABLE"
        assert c.post("/v2/repository/models/a/unload").status_code == 200
        assert c.post("/v2/repository/models/b/load").status_code == 200
        assert state(c, "b")["state"] == "READY"


def test_an_llm_without_a_placement_section_is_not_slept(tmp_path: Path) -> None:
    pset, repo = placed_repo(tmp_path, {"llm": 0.5})
    (repo / "llm" / "model.yaml").write_text(
        "kind: llm\nruntime: emulated\nengine: {max_num_seqs: 4, num_blocks: 128}\n"
    )
    with start_worker(pset, repo, {"llm"}) as w, httpx.Client(base_url=w.url, timeout=30) as c:
        r = c.post("/v2/repository/models/llm/unload")
        assert r.status_code == 400 and "placement: section" in r.text
        assert complete(c).status_code == 200


def test_the_placement_section_is_validated_naming_the_field(tmp_path: Path) -> None:
    from evenserve.core.errors import ConfigError
    from evenserve.worker.llm.config import load_llm_model

    pset, repo = placed_repo(tmp_path, {"llm": 0.5})
    path = repo / "llm" / "model.yaml"
    text = path.read_text()
    path.write_text(text.replace("max_num_seqs: 8", "max_num_seqs: 8, num_blocks: 64"))
    with pytest.raises(ConfigError, match=r"engine\.num_blocks"):
        load_llm_model(repo / "llm")
    path.write_text(text.replace("warm_load_ms: 150", "warm_load_ms: 900"))
    with pytest.raises(ConfigError, match="warm_load_ms"):
        load_llm_model(repo / "llm")
    path.write_text(text.replace("kv_tokens: 2048", "kv_tokens: 64"))
    entry = load_llm_model(repo / "llm")
    from evenserve.worker.llm.hosting import build_llm

    with pytest.raises(ConfigError, match=r"placement\.kv_tokens"):
        build_llm(entry, pset, emulated=True)


def test_a_wake_on_another_worker_of_the_host_is_warm_from_its_pool(tmp_path: Path) -> None:
    # The controller plans one warm pool per host: an LLM put to sleep on one device wakes
    # warm on another. Without the pool the second worker loaded it cold (its own state
    # knew only its own LLMs).
    pset, repo = placed_repo(tmp_path, {"llm": 0.5})
    pool = tmp_path / "pool"
    with start_worker(pset, repo, set(), pool=pool) as a:
        asked_a = slept(a)
        with httpx.Client(base_url=a.url, timeout=30) as c:
            r = c.post("/v2/repository/models/llm/load")
            assert r.status_code == 200 and r.json()["load_source"] == "disk"
            assert c.post("/v2/repository/models/llm/unload").status_code == 200
        assert asked_a == [0.4]
        entries = HostPool(pool, 4 * 2**30).entries()
        # Counted at its weights' bytes; the file takes no host memory (the emulation holds
        # no weights).
        assert [(e.model, e.size_bytes) for e in entries] == [("llm", 2**29)]
        assert all(p.stat().st_size == 0 for p in pool.glob("*.entry"))
    with start_worker(pset, repo, set(), pool=pool) as b:
        asked_b = slept(b)
        with httpx.Client(base_url=b.url, timeout=30) as c:
            r = c.post("/v2/repository/models/llm/load")
            assert r.status_code == 200 and r.json()["load_source"] == "host"
            assert complete(c).status_code == 200
        assert asked_b == [0.15]  # warm_load_ms
    # A worker without the pool loads it cold, as before.
    with start_worker(pset, repo, set()) as c3:
        asked = slept(c3)
        with httpx.Client(base_url=c3.url, timeout=30) as c:
            assert c.post("/v2/repository/models/llm/load").json()["load_source"] == "disk"
        assert asked == [0.4]


def test_a_stopped_worker_keeps_its_awake_llms_in_the_pool(tmp_path: Path) -> None:
    pset, repo = placed_repo(tmp_path, {"llm": 0.5})
    pool = tmp_path / "pool"
    with start_worker(pset, repo, {"llm"}, pool=pool):
        assert HostPool(pool, 4 * 2**30).entries() == []  # awake from the start: no load
    assert [e.model for e in HostPool(pool, 4 * 2**30).entries()] == ["llm"]
