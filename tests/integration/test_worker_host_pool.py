"""The host pool on the worker: a cold load writes the model's entry, an unload keeps it, the
next load is warm (source host) and takes the warm load time; a changed config loads cold;
two workers on one pool share it (unloaded on one, warm on the other); a torch model
reloads from its entry (a copy of its file). The chosen sleep is
asserted through the emulated runtime's injectable ``load_sleep``, never a wall time."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from evenserve.core.profile import MB
from evenserve.core.scenario import default_load_times_s
from evenserve.core.wire import repository_path
from evenserve.runtime import emulated
from evenserve.runtime.device import parse_device
from evenserve.runtime.host_pool import HostPool
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from tests.app_client import worker_client

from .worker_repo import MODELS, PROFILE, metric_samples, write_repo

WEIGHTS = PROFILE["weights_mb"] * MB


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Each emulated load's chosen sleep (seconds); nothing is slept."""
    out: list[float] = []
    monkeypatch.setattr(emulated, "load_sleep", out.append)
    yield out


def _repo(tmp_path: Path) -> Path:
    models = {
        **MODELS,
        # One with its own warm load time.
        "own": {**MODELS["em"], "emulated": {**MODELS["em"]["emulated"], "warm_load_ms": 7}},
    }
    return write_repo(tmp_path, models)


def _service(repo: Path, pool: Path | None, startup: list[str] | None = None) -> Worker:
    return Worker(
        load_repository(repo, startup) if startup else [],
        WorkerOptions(
            device=parse_device("cpu"),
            model_control="explicit",
            repository=repo,
            host_pool=pool,
            host_pool_bytes=100 * MB,
        ),
    )


async def _started(service: Worker) -> Worker:
    service.load()
    await service.start()
    return service


@pytest.fixture
async def worker(
    tmp_path: Path, slept: list[float]
) -> AsyncIterator[tuple[Worker, httpx.AsyncClient]]:
    service = await _started(_service(_repo(tmp_path), tmp_path / "pool"))
    async with worker_client(service, timeout=60) as c:
        yield service, c
    await service.stop()


async def test_load_unload_load_again_is_warm_and_takes_the_warm_time(
    worker: tuple[Worker, httpx.AsyncClient], slept: list[float]
) -> None:
    service, c = worker
    cold_s, warm_s = default_load_times_s(WEIGHTS)
    r = await c.post(repository_path("em", "load"))
    assert r.status_code == 200 and r.json()["load_source"] == "disk"
    assert slept == [cold_s]
    assert service.control.host_pool is not None
    (entry,) = service.control.host_pool.entries()
    assert entry.model == "em" and entry.size_bytes == int(WEIGHTS)
    assert service.control.host_pool.path(entry.key).stat().st_size == int(WEIGHTS)

    assert (await c.post(repository_path("em", "unload"))).status_code == 200
    assert [e.model for e in service.control.host_pool.entries()] == ["em"]  # kept warm
    r = await c.post(repository_path("em", "load"))
    assert r.status_code == 200 and r.json()["load_source"] == "host"
    assert slept == [cold_s, warm_s]
    stats = (await c.get("/v2/models/em/stats")).json()["model_stats"][0]
    assert stats["evenserve_load"]["load_source"] == "host"
    config = (await c.get("/v2/models/em/config")).json()
    runtime = json.loads(config["parameters"]["evenserve_runtime"]["string_value"])
    assert runtime["load_source"] == "host" and runtime["warm_load_ms"] == round(warm_s * 1e3, 3)
    page = service.metrics.render()[0].decode()
    loads = metric_samples(page, "evenserve_model_load_sources_total")
    assert loads['evenserve_model_load_sources_total{model="em",source="disk"}'] == 1.0
    assert loads['evenserve_model_load_sources_total{model="em",source="host"}'] == 1.0

    # model.yaml's own warm time is what a warm load sleeps.
    await c.post(repository_path("own", "load"))
    await c.post(repository_path("own", "unload"))
    assert (await c.post(repository_path("own", "load"))).json()["load_source"] == "host"
    assert slept[-1] == 0.007


async def test_a_changed_config_loads_cold(
    worker: tuple[Worker, httpx.AsyncClient], slept: list[float]
) -> None:
    _, c = worker
    await c.post(repository_path("em", "load"))
    await c.post(repository_path("em", "unload"))
    body = {"parameters": {"config": {"max_batch_size": 4}}}
    r = await c.post(repository_path("em", "load"), json=body)
    assert r.json()["load_source"] == "disk"  # another digest: the old entry is not read


async def test_without_a_pool_every_load_is_cold(tmp_path: Path, slept: list[float]) -> None:
    service = await _started(_service(_repo(tmp_path), None))
    async with worker_client(service, timeout=60) as c:
        for _ in range(2):
            r = await c.post(repository_path("em", "load"))
            assert r.json()["load_source"] == "disk"
            await c.post(repository_path("em", "unload"))
    assert slept == [default_load_times_s(WEIGHTS)[0]] * 2
    await service.stop()


async def test_two_workers_share_the_pool(tmp_path: Path, slept: list[float]) -> None:
    repo, pool = _repo(tmp_path), tmp_path / "pool"
    a = await _started(_service(repo, pool, ["em"]))  # loaded at startup: cold, into the pool
    b = await _started(_service(repo, pool))
    assert a.models["em"].load_info["load_source"] == "disk"
    async with worker_client(a, timeout=60) as ca, worker_client(b, timeout=60) as cb:
        assert (await ca.post(repository_path("em", "unload"))).status_code == 200
        r = await cb.post(repository_path("em", "load"))
        assert r.json()["load_source"] == "host"
    assert slept == list(default_load_times_s(WEIGHTS))
    await a.stop()
    await b.stop()


async def test_an_evicted_entry_is_written_again_at_the_unload(
    tmp_path: Path, slept: list[float]
) -> None:
    # The controller's rule: a model that leaves a device is warm again. A pool of 15 MB
    # holds one model of 10 MB: b's cold load evicts a's entry, a's unload brings it back.
    repo = write_repo(tmp_path, {"a": MODELS["em"], "b": MODELS["em"]})
    service = _service(repo, tmp_path / "pool")
    service.options.host_pool_bytes = 15 * MB
    service.control.host_pool = HostPool(tmp_path / "pool", 15 * MB)
    await _started(service)
    pool = service.control.host_pool
    async with worker_client(service, timeout=60) as c:
        await c.post(repository_path("a", "load"))
        await c.post(repository_path("b", "load"))
        assert [e.model for e in pool.entries()] == ["b"]
        await c.post(repository_path("a", "unload"))
        assert [e.model for e in pool.entries()] == ["a"]
        await c.post(repository_path("b", "unload"))
        assert [e.model for e in pool.entries()] == ["b"]
        assert (await c.post(repository_path("b", "load"))).json()["load_source"] == "host"
    await service.stop()


async def test_a_torch_model_reloads_from_the_pool(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    repo = tmp_path / "repo"
    (repo / "lin").mkdir(parents=True)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; still served
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(torch.nn.Linear(4, 2)), str(repo / "lin" / "m.pt"))
    (repo / "lin" / "model.yaml").write_text(
        json.dumps(
            {
                "runtime": "torch",
                "max_batch_size": 4,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                "torch": {"file": "m.pt"},
            }
        )
    )
    service = await _started(_service(repo, tmp_path / "pool"))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    async with worker_client(service, timeout=60) as c:
        assert (await c.post(repository_path("lin", "load"))).json()["load_source"] == "disk"
        want = (await c.post("/v2/models/lin/infer", json=body)).json()["outputs"]
        await c.post(repository_path("lin", "unload"))
        assert service.control.host_pool is not None
        (entry,) = service.control.host_pool.entries()
        assert entry.size_bytes == (repo / "lin" / "m.pt").stat().st_size
        assert (await c.post(repository_path("lin", "load"))).json()["load_source"] == "host"
        assert (await c.post("/v2/models/lin/infer", json=body)).json()["outputs"] == want
    await service.stop()


async def test_a_pool_removed_under_the_worker_never_fails_a_load(
    worker: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = worker
    assert service.control.host_pool is not None
    shutil.rmtree(service.control.host_pool.directory)
    r = await c.post(repository_path("em", "load"))
    assert r.status_code == 200 and r.json()["load_source"] == "disk"
    assert (await c.post(repository_path("em", "unload"))).status_code == 200
