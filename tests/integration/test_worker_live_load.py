"""Live loads on the worker: an emulated load takes its load time (in the loading thread) and
holds its weights in the device's memory account; a load that does not fit is refused; the
inference requests that arrive while a model is LOADING wait for it (HTTP and gRPC), bounded
by ``load_wait_s``, and a failed load answers them 503. Loads are held on a threading.Event
by patching the emulated runtime's ``load_sleep`` (no duration is asserted)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from evenserve.core.options import DeviceOptions
from evenserve.core.profile import MB
from evenserve.core.scenario import COLD_LOAD_BYTES_PER_S, COLD_LOAD_FIXED_S
from evenserve.core.wire import LOAD_PATH, LOAD_WAIT_HEADER, REPOSITORY_INDEX_PATH
from evenserve.runtime import emulated
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.device import GIB
from evenserve.worker.models.control import ModelControlError
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from tests.app_client import worker_client

from .worker_repo import MODELS, PROFILE, metric_samples, write_repo

X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
#: Weights of the models of the emulated device's profile set (MB), and its memory (GiB):
#: "big" fits alone, "big" and "other" together do not, "small" always does.
WEIGHTS_MB = {"big": 3000.0, "other": 3000.0, "small": 100.0}
MEMORY_GB = 5.0


class Gate:
    """Replaces ``emulated.load_sleep``: records each load's time, holds loads until opened
    (``fail``: the held loads then raise)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.slept: list[float] = []
        self.fail: str | None = None

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        assert self.opened.wait(60), "the test never opened the gate"
        if self.fail is not None:
            raise RuntimeError(self.fail)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    monkeypatch.setattr(emulated, "load_sleep", g)
    yield g
    g.opened.set()  # never leave a loading thread behind


def _repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository of emulated models (those of worker_repo and the memory ones) and a profile
    set for the emulated device (every model's profile, named like it)."""
    models = {**MODELS, **{m: MODELS["em"] for m in WEIGHTS_MB}}
    repo = write_repo(tmp_path, models)
    pset = tmp_path / "set"
    pset.mkdir()
    for m in models:
        weights = WEIGHTS_MB.get(m, PROFILE["weights_mb"])
        (pset / f"{m}.yaml").write_text(
            yaml.safe_dump({**PROFILE, "model": m, "weights_mb": weights})
        )
    return repo, pset


def _service(
    tmp_path: Path, device: str = "cpu", load_wait_s: float = 10.0, startup: list[str] | None = None
) -> Worker:
    repo, pset = _repo(tmp_path)
    dev = parse_device(f"emulated:{pset}" if device == "emulated" else device)
    opts = WorkerOptions(
        device=dev,
        run=DeviceOptions(memory_gb=MEMORY_GB),
        model_control="explicit",
        repository=repo,
        load_wait_s=load_wait_s,
    )
    return Worker(load_repository(repo, startup) if startup else [], opts)


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[Worker, httpx.AsyncClient]]:
    service = _service(tmp_path)
    await service.start()
    async with worker_client(service, timeout=60) as c:
        yield service, c
    await service.stop()


async def _until(cond: Any, what: str) -> None:
    """Wait on the loop for a condition (no duration is asserted)."""
    for _ in range(100_000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


def _load_waits(service: Worker, model: str) -> float:
    page = service.metrics.render()[0].decode()
    samples = metric_samples(page, "evenserve_load_wait_seconds_count")
    return samples.get(f'evenserve_load_wait_seconds_count{{model="{model}"}}', 0.0)


# -- the emulated load time ---------------------------------------------------------------------
def test_the_load_time_is_load_ms_else_derived_from_the_weights(tmp_path: Path, gate: Gate) -> None:
    gate.opened.set()
    repo, pset = _repo(tmp_path)
    (repo / "small" / "model.yaml").write_text(
        yaml.safe_dump({**MODELS["em"], "emulated": {"profile": "profile.yaml", "load_ms": 250}})
    )
    entries = load_repository(repo, ["big", "small"])
    service = Worker(
        entries, WorkerOptions(device=parse_device(f"emulated:{pset}"), profiles_dir=None)
    )
    service.load()
    derived = COLD_LOAD_FIXED_S + WEIGHTS_MB["big"] * MB / COLD_LOAD_BYTES_PER_S
    assert sorted(gate.slept) == sorted([derived, 0.25])
    assert service.models["small"].description["load_ms"] == 250.0


async def test_a_load_sleeps_in_the_loading_thread_while_the_loop_serves(
    worker: tuple[Worker, httpx.AsyncClient], gate: Gate
) -> None:
    service, c = worker
    gate.opened.set()
    await service.control.load_model("em")
    gate.opened.clear()
    load = asyncio.ensure_future(service.control.request_load("pair"))
    await _until(lambda: len(gate.slept) == 2, "the load sleeps")
    # The loop is not blocked: another model answers while pair loads.
    assert (await c.post("/v2/models/em/infer", json=X)).status_code == 200
    assert not load.done()
    report = (await c.get(LOAD_PATH)).json()
    assert report["loading_models"] == ["pair"] and "pair" not in report["queued_by_model"]
    gate.opened.set()
    await load
    assert (await c.get(LOAD_PATH)).json()["loading_models"] == []


# -- memory --------------------------------------------------------------------------------------
async def test_memory_rises_on_load_falls_on_unload_and_a_load_that_does_not_fit_is_refused(
    tmp_path: Path, gate: Gate
) -> None:
    service = _service(tmp_path, "emulated")
    await service.start()
    async with worker_client(service, timeout=60) as c:

        async def used() -> float:
            return float((await c.get(LOAD_PATH)).json()["memory_used_bytes"])

        assert await used() == 0.0
        load = asyncio.ensure_future(c.post("/v2/repository/models/big/load"))
        await _until(lambda: len(gate.slept) == 1, "big loads")
        # Held from the start of the load.
        assert await used() == WEIGHTS_MB["big"] * MB
        gate.opened.set()
        assert (await load).status_code == 200
        assert await used() == WEIGHTS_MB["big"] * MB
        assert (await c.get(LOAD_PATH)).json()["memory_total_bytes"] == MEMORY_GB * GIB

        r = await c.post("/v2/repository/models/other/load")
        free = MEMORY_GB * GIB - WEIGHTS_MB["big"] * MB
        assert r.status_code == 400
        assert r.json()["error"] == (
            "model 'other': load failed: not enough device memory: needs "
            f"{WEIGHTS_MB['other'] * MB / GIB:.2f} GiB, free {free / GIB:.2f} GiB "
            f"(of {MEMORY_GB:.2f} GiB)"
        )
        index = {m["name"]: m for m in (await c.post(REPOSITORY_INDEX_PATH)).json()}
        assert index["other"]["state"] == "UNAVAILABLE"
        assert "not enough device memory" in index["other"]["reason"]
        assert await used() == WEIGHTS_MB["big"] * MB  # the refused load holds nothing
        assert len(gate.slept) == 1  # and never started

        # A reload of the model filling the device fits: its own weights are given back.
        assert (await c.post("/v2/repository/models/big/load")).status_code == 200
        assert (await c.post("/v2/repository/models/small/load")).status_code == 200
        assert await used() == (WEIGHTS_MB["big"] + WEIGHTS_MB["small"]) * MB
        assert (await c.post("/v2/repository/models/big/unload")).status_code == 200
        assert await used() == WEIGHTS_MB["small"] * MB
        assert (await c.post("/v2/repository/models/other/load")).status_code == 200
        assert await used() == (WEIGHTS_MB["other"] + WEIGHTS_MB["small"]) * MB
        assert (await c.post("/v2/models/other/infer", json=X)).status_code == 200
    await service.stop()


async def test_a_reload_that_does_not_fit_leaves_the_old_model_serving(
    tmp_path: Path, gate: Gate
) -> None:
    gate.opened.set()
    service = _service(tmp_path, "emulated", startup=["small"])
    service.load()
    await service.start()
    await service.control.load_model("other")
    with pytest.raises(ModelControlError) as err:
        await service.control.load_model("small", {"emulated": {"profile_name": "big"}})
    assert err.value.status == 400 and "not enough device memory" in str(err.value)
    assert service.models.state("small").state == "READY"
    async with worker_client(service, timeout=60) as c:
        assert (await c.post("/v2/models/small/infer", json=X)).status_code == 200
    await service.stop()


# -- requests that wait for a load ---------------------------------------------------------------
async def test_requests_arriving_during_a_load_are_all_answered_after_it(
    worker: tuple[Worker, httpx.AsyncClient], gate: Gate
) -> None:
    service, c = worker
    load = asyncio.ensure_future(c.post("/v2/repository/models/em/load"))
    await _until(lambda: len(gate.slept) == 1, "em loads")
    calls = [asyncio.ensure_future(c.post("/v2/models/em/infer", json=X)) for _ in range(20)]
    await _until(lambda: service.control.loads.waiting("em") == 20, "the requests wait")
    assert not any(f.done() for f in calls)
    gate.opened.set()
    assert (await load).status_code == 200
    answers = [await f for f in calls]
    assert [r.status_code for r in answers] == [200] * 20
    assert all(float(r.headers[LOAD_WAIT_HEADER]) > 0 for r in answers)
    assert _load_waits(service, "em") == 20.0
    # A request once it is READY waits for nothing: no header.
    r = await c.post("/v2/models/em/infer", json=X)
    assert r.status_code == 200 and LOAD_WAIT_HEADER not in r.headers
    assert service.models["em"].stats.json()["inference_stats"]["success"]["count"] == 21


async def test_past_the_bound_a_waiting_request_gets_503_with_retry_after(
    tmp_path: Path, gate: Gate
) -> None:
    service = _service(tmp_path, load_wait_s=0.02)
    await service.start()
    async with worker_client(service, timeout=60) as c:
        load = asyncio.ensure_future(c.post("/v2/repository/models/em/load"))
        await _until(lambda: len(gate.slept) == 1, "em loads")
        r = await c.post("/v2/models/em/infer", json=X)
        assert r.status_code == 503
        assert r.json()["error"] == "model 'em' is still loading after 20 ms"
        assert int(r.headers["retry-after"]) >= 1 and LOAD_WAIT_HEADER in r.headers
        # Not for metadata: those still answer at once.
        assert (await c.get("/v2/models/em")).json()["error"] == "model 'em' is loading"
        gate.opened.set()
        assert (await load).status_code == 200
        assert (await c.post("/v2/models/em/infer", json=X)).status_code == 200
        page = service.metrics.render()[0].decode()
        requests = metric_samples(page, "evenserve_worker_requests_total")
        assert requests['evenserve_worker_requests_total{model="em",outcome="unavailable"}'] == 1
    await service.stop()


async def test_a_failed_load_answers_its_waiting_requests_503(
    worker: tuple[Worker, httpx.AsyncClient], gate: Gate
) -> None:
    service, c = worker
    gate.fail = "the weights are corrupt"
    load = asyncio.ensure_future(c.post("/v2/repository/models/em/load"))
    await _until(lambda: len(gate.slept) == 1, "em loads")
    calls = [asyncio.ensure_future(c.post("/v2/models/em/infer", json=X)) for _ in range(5)]
    await _until(lambda: service.control.loads.waiting("em") == 5, "the requests wait")
    gate.opened.set()
    r = await load
    expected = "model 'em': load failed: RuntimeError: the weights are corrupt"
    assert r.status_code == 500 and r.json()["error"] == expected
    answers = [await f for f in calls]
    assert [(a.status_code, a.json()["error"]) for a in answers] == [(503, expected)] * 5
    assert service.models.state("em").state == "UNAVAILABLE"
    assert (await c.post("/v2/models/em/infer", json=X)).status_code == 404
    assert _load_waits(service, "em") == 5.0


async def test_a_shutdown_answers_the_requests_waiting_for_a_load(
    tmp_path: Path, gate: Gate
) -> None:
    service = _service(tmp_path)
    await service.start()
    async with worker_client(service, timeout=60) as c:
        load = asyncio.ensure_future(c.post("/v2/repository/models/em/load"))
        await _until(lambda: len(gate.slept) == 1, "em loads")
        call = asyncio.ensure_future(c.post("/v2/models/em/infer", json=X))
        await _until(lambda: service.control.loads.waiting("em") == 1, "the request waits")
        service.begin_drain()
        r = await call
        assert r.status_code == 503 and r.json()["error"] == "the worker is shutting down"
        gate.opened.set()
        assert (await load).status_code == 503
    await service.stop()


# -- gRPC ----------------------------------------------------------------------------------------
grpc = pytest.importorskip("grpc")


def _grpc_request(model: str) -> Any:
    from tritonclient.grpc import service_pb2

    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


async def test_grpc_requests_wait_for_a_load_and_past_the_bound_get_unavailable(
    tmp_path: Path, gate: Gate
) -> None:
    from tritonclient.grpc import service_pb2_grpc

    from evenserve.worker.grpc_api import GrpcServer

    service = _service(tmp_path)
    await service.start()
    server = GrpcServer(service.plane, "127.0.0.1", 0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            load = asyncio.ensure_future(service.control.request_load("em"))
            await _until(lambda: len(gate.slept) == 1, "em loads")
            calls = [stub.ModelInfer(_grpc_request("em"), timeout=60) for _ in range(8)]
            await _until(lambda: service.control.loads.waiting("em") == 8, "the requests wait")
            gate.opened.set()
            await load
            for call in calls:
                resp = await call
                assert resp.model_name == "em"
                trailing = dict(await call.trailing_metadata())
                assert float(trailing[LOAD_WAIT_HEADER]) > 0
            assert _load_waits(service, "em") == 8.0

            # The bound: a reload held past it.
            service.options.load_wait_s = 0.02
            gate.opened.clear()
            reload = asyncio.ensure_future(service.control.request_load("em"))
            await _until(lambda: service.models.state("em").state == "LOADING", "em reloads")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelInfer(_grpc_request("em"), timeout=60)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "model 'em' is still loading after 20 ms"
            meta = dict(err.value.trailing_metadata() or ())
            assert int(meta["retry-after"]) >= 1 and LOAD_WAIT_HEADER in meta

            # A failed load: UNAVAILABLE with its error.
            service.options.load_wait_s = 10.0
            gate.fail = "no disk"
            waiting = stub.ModelInfer(_grpc_request("em"), timeout=60)
            await _until(lambda: service.control.loads.waiting("em") == 1, "the request waits")
            gate.opened.set()
            with pytest.raises(ModelControlError):
                await reload
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await waiting
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "model 'em': load failed: RuntimeError: no disk"
    finally:
        await server.stop(0)
        await service.stop()


def test_models_at_startup_that_do_not_fit_are_refused_before_loading(
    tmp_path: Path, gate: Gate
) -> None:
    from evenserve.core.errors import ConfigError

    service = _service(tmp_path, "emulated", startup=["big", "other"])
    with pytest.raises(ConfigError) as err:
        service.load()
    assert str(err.value) == (
        "not enough device memory for the models: needs 5.86 GiB (big 2.93 GiB, other "
        "2.93 GiB), the device has 5.00 GiB"
    )
    assert gate.slept == []
