"""Model control on the worker (Triton's repository extension): the index with every folder's
state, load (with a config override), unload (drained: no request lost), reload, the modes
none / explicit / poll, over HTTP in-process (httpx's MockTransport calls the handler) and
over sockets, and the load report and metrics that follow."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import yaml

from evenserve.core.wire import LOAD_PATH, REPOSITORY_INDEX_PATH, repository_path
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from tests.app_client import worker_client

from .worker_repo import MODELS, PROFILE, metric_samples, write_repo

X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
PAIR = {
    "inputs": [
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "mask", "datatype": "INT64", "shape": [1, 3], "data": [1, 1, 1]},
    ]
}
#: A slow model (600 ms a batch of one, one request a batch): for drain timeouts.
SLOW = {
    "runtime": "emulated",
    "max_batch_size": 1,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
    "emulated": {"profile": "profile.yaml"},
}
SLOW_PROFILE = {**PROFILE, "model": "slow", "points": [{"batch": 1, "latency_ms": 600.0}]}

Mode = Literal["none", "explicit", "poll"]


def _repo(tmp_path: Path) -> Path:
    repo = write_repo(tmp_path)
    d = repo / "slow"
    d.mkdir()
    (d / "model.yaml").write_text(yaml.safe_dump(SLOW))
    (d / "profile.yaml").write_text(yaml.safe_dump(SLOW_PROFILE))
    return repo


def _service(
    repo: Path,
    startup: list[str] | None,
    mode: Mode = "explicit",
    drain_timeout_s: float = 30.0,
) -> Worker:
    entries = load_repository(repo, startup) if startup else []
    return Worker(
        entries,
        WorkerOptions(
            device=parse_device("cpu"),
            model_control=mode,
            repository=repo,
            repository_poll_s=3600.0,  # tests drive poll_repository themselves
            drain_timeout_s=drain_timeout_s,
        ),
    )


def _client(service: Worker) -> httpx.AsyncClient:
    return worker_client(service, timeout=60)


async def _started(service: Worker) -> Worker:
    await asyncio.to_thread(service.load)
    await service.start()
    return service


@pytest.fixture
async def explicit(tmp_path: Path) -> AsyncIterator[tuple[Worker, httpx.AsyncClient]]:
    service = await _started(_service(_repo(tmp_path), ["em"]))
    async with _client(service) as c:
        yield service, c
    await service.stop()


def _states(index: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    return {m["name"]: (m["state"], m.get("reason")) for m in index}


async def _until(cond: Any, what: str) -> None:
    """Wait on the loop for a condition (no duration is asserted)."""
    for _ in range(100_000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


async def test_the_index_lists_every_folder_with_its_state(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    _, c = explicit
    index = (await c.post(REPOSITORY_INDEX_PATH)).json()
    assert index == [
        {"name": "em", "version": "1", "state": "READY"},
        {"name": "pair", "state": "UNAVAILABLE", "reason": "not loaded"},
        {"name": "slow", "state": "UNAVAILABLE", "reason": "not loaded"},
        {"name": "waits", "state": "UNAVAILABLE", "reason": "not loaded"},
    ]
    ready = (await c.post(REPOSITORY_INDEX_PATH, json={"ready": True})).json()
    assert ready == [{"name": "em", "version": "1", "state": "READY"}]
    bad = await c.post(REPOSITORY_INDEX_PATH, json={"ready": "yes"})
    assert bad.status_code == 400 and "ready" in bad.json()["error"]
    meta = (await c.get("/v2")).json()
    assert "model_repository" in meta["extensions"]


async def test_load_serve_unload_and_what_follows(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    assert (await c.post("/v2/models/pair/infer", json=PAIR)).status_code == 404
    v0 = (await c.get(LOAD_PATH)).json()["models_version"]
    assert (await c.get(LOAD_PATH)).json()["models_version"] == v0  # nothing moved
    r = await c.post(repository_path("pair", "load"))
    assert r.status_code == 200 and r.json()["load_source"] == "disk"  # no host pool
    assert r.json()["load_seconds"] >= 0
    v1 = (await c.get(LOAD_PATH)).json()["models_version"]
    assert v1 != v0  # the gateway reads the index again
    assert _states((await c.post(REPOSITORY_INDEX_PATH)).json())["pair"] == ("READY", None)
    assert (await c.get("/v2/models/pair/ready")).status_code == 200
    assert (await c.post("/v2/models/pair/infer", json=PAIR)).status_code == 200
    stats = (await c.get("/v2/models/stats")).json()["model_stats"]
    assert [s["name"] for s in stats] == ["em", "pair"]
    load = (await c.get(LOAD_PATH)).json()
    assert set(load["max_batch_size_by_model"]) == {"em", "pair"}

    r = await c.post(repository_path("pair", "unload"))
    assert r.status_code == 200 and r.json() == {}
    assert (await c.get(LOAD_PATH)).json()["models_version"] not in (v0, v1)
    assert _states((await c.post(REPOSITORY_INDEX_PATH)).json())["pair"] == (
        "UNAVAILABLE",
        "unloaded",
    )
    r = await c.post("/v2/models/pair/infer", json=PAIR)
    assert r.status_code == 404
    stats = (await c.get("/v2/models/stats")).json()["model_stats"]
    assert [s["name"] for s in stats] == ["em"]  # an unloaded model's stats are dropped
    assert service.driver.sched.models == ("em",)
    load = (await c.get(LOAD_PATH)).json()
    assert set(load["queued_by_model"]) == {"em"}
    r = await c.post(repository_path("pair", "unload"))
    assert r.status_code == 400
    assert r.json()["error"] == "model 'pair' is not loaded (state UNAVAILABLE: unloaded)"
    page = service.metrics.render()[0].decode()
    loads = metric_samples(page, "evenserve_model_loads_total")
    assert loads['evenserve_model_loads_total{model="pair",outcome="success"}'] == 1.0
    unloads = metric_samples(page, "evenserve_model_unloads_total")
    assert unloads['evenserve_model_unloads_total{model="pair"}'] == 1.0


async def test_a_worker_may_start_with_no_model_and_serve_one_later(tmp_path: Path) -> None:
    service = await _started(_service(_repo(tmp_path), None))
    async with _client(service) as c:
        assert (await c.get("/v2/health/ready")).status_code == 200
        assert (await c.post(REPOSITORY_INDEX_PATH, json={"ready": True})).json() == []
        assert (await c.get(LOAD_PATH)).json()["queued_by_model"] == {}
        assert (await c.post(repository_path("em", "load"))).status_code == 200
        assert (await c.post("/v2/models/em/infer", json=X)).status_code == 200
    await service.stop()


async def test_the_config_override_replaces_fields_and_its_errors_name_them(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    # Triton's shape: the config as a JSON string.
    body = {"parameters": {"config": json.dumps({"max_batch_size": 4})}}
    assert (await c.post(repository_path("pair", "load"), json=body)).status_code == 200
    assert (await c.get("/v2/models/pair/config")).json()["max_batch_size"] == 4
    # An object works too; loading a READY model reloads it with the new config.
    body = {"parameters": {"config": {"max_batch_size": 2}}}
    assert (await c.post(repository_path("pair", "load"), json=body)).status_code == 200
    assert (await c.get("/v2/models/pair/config")).json()["max_batch_size"] == 2
    # A bad override is refused naming the field, and the model loaded stays served.
    body = {"parameters": {"config": json.dumps({"max_batch_size": 0})}}
    r = await c.post(repository_path("pair", "load"), json=body)
    assert r.status_code == 400
    assert "max_batch_size" in r.json()["error"] and "config override" in r.json()["error"]
    assert service.models.state("pair").state == "READY"
    assert (await c.post("/v2/models/pair/infer", json=PAIR)).status_code == 200
    # ... and a model not loaded whose override is bad is UNAVAILABLE with the reason.
    body = {"parameters": {"config": json.dumps({"runtime": "nope"})}}
    r = await c.post(repository_path("waits", "load"), json=body)
    assert r.status_code == 400 and "runtime" in r.json()["error"]
    state, reason = _states((await c.post(REPOSITORY_INDEX_PATH)).json())["waits"]
    assert state == "UNAVAILABLE" and reason is not None and reason.startswith("load failed: ")
    for bad, field in (
        ({"parameters": {"config": "{not json"}}, "parameters.config"),
        ({"parameters": {"config": "[1]"}}, "parameters.config"),
        ({"parameters": {"other": 1}}, "parameters.other"),
        ({"parameters": []}, "parameters"),
    ):
        r = await c.post(repository_path("waits", "load"), json=bad)
        assert r.status_code == 400 and r.json()["error"].startswith(field), r.json()
    page = service.metrics.render()[0].decode()
    loads = metric_samples(page, "evenserve_model_loads_total")
    assert loads['evenserve_model_loads_total{model="pair",outcome="failure"}'] == 1.0


async def test_model_control_errors_name_no_absolute_path_of_the_repository(
    explicit: tuple[Worker, httpx.AsyncClient], tmp_path: Path
) -> None:
    """Load errors and the index's reasons name files relative to the repository."""
    _, c = explicit
    broken = tmp_path / "repo" / "broken"
    broken.mkdir()
    (broken / "model.yaml").write_text(yaml.safe_dump({**MODELS["em"], "profile": "gone.yaml"}))
    texts = []
    for name, body, status in (
        ("nope", None, 404),
        ("pair", {"parameters": {"config": {"max_batch_size": 0}}}, 400),
        ("broken", None, 400),
        ("pair", {"parameters": {"config": {"emulated": {"profile": "gone.yaml"}}}}, 400),
    ):
        r = await c.post(repository_path(name, "load"), json=body)
        assert r.status_code == status, r.text
        texts.append(r.json()["error"])
    texts += [str(m.get("reason")) for m in (await c.post(REPOSITORY_INDEX_PATH)).json()]
    for text in texts:
        assert str(tmp_path) not in text and str(tmp_path.resolve()) not in text, text
    assert "no model folder 'nope' in the repository" in texts[0]
    assert texts[1].startswith("pair/model.yaml with the load's config override: max_batch")
    assert "broken/model.yaml: profile: " in texts[2] and "broken/gone.yaml" in texts[2]


async def test_an_override_naming_a_missing_file_or_a_field_without_effect_is_400(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    """On a cpu device: an override's files must be in the model folder; a field this worker
    would ignore is refused, naming it; a refused load of a READY model leaves it serving."""
    service, c = explicit
    cases = [
        ({"emulated": {"profile": "missing.yaml"}},
         "parameters.config.emulated.profile: no file 'missing.yaml' in the model folder 'em'"),
        ({"profile": "missing.yaml"}, "parameters.config.profile: no file 'missing.yaml'"),
        ({"profile": "../pair/profile.yaml"},
         "parameters.config.profile: '../pair/profile.yaml' is not a path inside the model"),
        ({"emulated": {"profile": "/etc/hostname"}},
         "parameters.config.emulated.profile: '/etc/hostname' is not a path inside"),
        ({"emulated": {"profile": "profile.yaml", "profile_name": "resnet50"}},
         "parameters.config.emulated.profile_name: has no effect on device cpu"),
        ({"optimize": {"min_cosine": 0.5}}, "parameters.config.optimize: has no effect"),
        ({"slo_ms": 1e400}, "parameters.config.slo_ms: inf is not a finite number"),
        ({"emulated": {"profile": "profile.yaml", "load_ms": float("nan")}},
         "parameters.config.emulated.load_ms: nan is not a finite number"),
    ]  # fmt: skip
    for override, names in cases:
        body = json.dumps({"parameters": {"config": override}})  # inf and nan as Python writes them
        r = await c.post(repository_path("em", "load"), content=body)
        assert r.status_code == 400 and r.json()["error"].startswith(names), (override, r.text)
        assert service.models.state("em").state == "READY"
    assert (await c.post("/v2/models/em/infer", json=X)).status_code == 200
    good = {"parameters": {"config": {"emulated": {"profile": "profile.yaml", "load_ms": 1}}}}
    assert (await c.post(repository_path("em", "load"), json=good)).status_code == 200


async def test_on_an_emulated_set_device_an_override_of_the_profile_file_is_400(
    tmp_path: Path,
) -> None:
    """On emulated:SET the set gives each model its profile: an override naming a profile
    file (there or not) would be ignored, and is refused; profile_name is taken."""
    repo = write_repo(tmp_path, {"resnet50": MODELS["em"]})
    service = Worker(
        [],
        WorkerOptions(
            device=parse_device("emulated:linear-fast"),
            model_control="explicit",
            repository=repo,
            repository_poll_s=3600.0,
        ),
    )
    service = await _started(service)
    async with _client(service) as c:
        url = repository_path("resnet50", "load")
        for override, names in (
            ({"emulated": {"profile": "missing.yaml"}},
             "parameters.config.emulated.profile: no file 'missing.yaml'"),
            ({"emulated": {"profile": "profile.yaml"}},
             "parameters.config.emulated.profile: has no effect on device emulated:linear-fast"),
            ({"runtime": "torch", "torch": {"file": "profile.yaml"}},
             "parameters.config.torch: has no effect on device emulated:linear-fast"),
        ):  # fmt: skip
            r = await c.post(url, json={"parameters": {"config": override}})
            assert r.status_code == 400 and r.json()["error"].startswith(names), r.text
        assert service.models.state("resnet50").state == "UNAVAILABLE"
        ok = {"parameters": {"config": {"emulated": {"profile_name": "resnet50"}}}}
        assert (await c.post(url, json=ok)).status_code == 200
    await service.stop()


async def test_an_override_that_batching_or_a_variant_would_replace_is_400(
    tmp_path: Path,
) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    (repo / "em" / "other.yaml").write_text(yaml.safe_dump({**PROFILE, "model": "em"}))
    (repo / "em" / "variant.yaml").write_text(
        yaml.safe_dump(
            {"variant": "v", "runtime": "torch", "torch": {"file": "m.pt"}, "profile": "other.yaml"}
        )
    )
    service = _service(repo, None)
    service.options.batching_override = {"policy": "fixed-window", "max_batch_delay_ms": 1}
    service = await _started(service)
    async with _client(service) as c:
        url = repository_path("em", "load")
        for override, names in (
            ({"batching": {"policy": "none"}}, "parameters.config.batching: has no effect"),
            ({"profile": "profile.yaml"},
             "parameters.config.profile: has no effect: the folder's variant.yaml"),
        ):  # fmt: skip
            r = await c.post(url, json={"parameters": {"config": override}})
            assert r.status_code == 400 and r.json()["error"].startswith(names), r.text
        ok = {"parameters": {"config": {"profile": "profile.yaml", "use_variant": False}}}
        assert (await c.post(url, json=ok)).status_code == 200, ok
    await service.stop()


async def test_no_such_folder_is_404_and_a_bad_name_400(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    _, c = explicit
    r = await c.post(repository_path("nope", "load"))
    assert r.status_code == 404 and "no model folder 'nope'" in r.json()["error"]
    r = await c.post(repository_path("_hidden", "load"))
    assert r.status_code == 400
    assert (await c.get(repository_path("em", "load"))).status_code == 405


async def test_unload_under_load_loses_no_request(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    answered: Counter[str] = Counter()
    sent = 0
    stop = asyncio.Event()

    async def client() -> None:
        nonlocal sent
        while not stop.is_set():
            sent += 1
            r = await c.post("/v2/models/em/infer", json=X)
            if r.status_code == 200:
                answered["200"] += 1
            else:
                err = r.json()["error"]
                assert (r.status_code, err) in (
                    (503, "model 'em' is unloading"),
                    (404, f"model 'em' is not served here (models: {', '.join([])})"),
                ), (r.status_code, err)
                answered[f"{r.status_code} {err}"] += 1
            await asyncio.sleep(0)

    clients = [asyncio.ensure_future(client()) for _ in range(8)]
    await _until(lambda: answered["200"] >= 20, "requests served before the unload")
    unload = asyncio.ensure_future(c.post(repository_path("em", "unload")))
    await _until(lambda: service.models.state("em").state == "UNLOADING", "unloading")
    r = await c.post("/v2/models/em/infer", json=X)  # new requests are refused at once
    assert r.status_code == 503 and r.json()["error"] == "model 'em' is unloading"
    # The load report's per-model figures leave it out at once (no router sends it more).
    load = (await c.get(LOAD_PATH)).json()
    assert load["queued_by_model"] == {} and load["max_batch_size_by_model"] == {}
    assert (await unload).status_code == 200
    stop.set()
    await asyncio.gather(*clients)
    assert sent == sum(answered.values())
    assert answered["200"] >= 20
    page = service.metrics.render()[0].decode()
    req = metric_samples(page, "evenserve_worker_requests_total")
    assert req['evenserve_worker_requests_total{model="em",outcome="success"}'] == answered["200"]


async def test_requests_queued_at_the_unload_run_even_if_their_policy_would_wait(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    assert (await c.post(repository_path("waits", "load"))).status_code == 200
    # A static batch of 4 never fills with 2 requests: they wait until the unload flushes.
    waiting = [asyncio.ensure_future(c.post("/v2/models/waits/infer", json=X)) for _ in range(2)]
    queued = service.driver.sched.queued_by_model
    await _until(lambda: queued().get("waits") == 2, "both queued")
    assert not any(w.done() for w in waiting)
    assert (await c.post(repository_path("waits", "unload"))).status_code == 200
    assert [(await w).status_code for w in waiting] == [200, 200]


async def test_past_the_drain_timeout_queued_requests_get_a_clear_503(tmp_path: Path) -> None:
    service = await _started(_service(_repo(tmp_path), ["slow"], drain_timeout_s=0.05))
    async with _client(service) as c:
        calls = [asyncio.ensure_future(c.post("/v2/models/slow/infer", json=X)) for _ in range(3)]
        await _until(lambda: service.driver.sched.in_flight == 1, "one running")
        assert (await c.post(repository_path("slow", "unload"))).status_code == 200
        answers = [await w for w in calls]
    await service.stop()
    assert sorted(r.status_code for r in answers) == [200, 503, 503]
    errors = {r.json()["error"] for r in answers if r.status_code == 503}
    assert errors == {
        "model 'slow' was unloaded before this request could run (it waited past the "
        "unload's drain timeout)"
    }


async def test_while_loading_the_model_is_listed_loading_and_requests_wait_for_it(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    gate = threading.Event()
    load_built = service.control.load_built

    def slow_load(built: Any) -> Any:
        gate.wait(60)
        return load_built(built)

    service.control.load_built = slow_load  # type: ignore[method-assign]
    load = asyncio.ensure_future(c.post(repository_path("pair", "load")))
    await _until(lambda: service.models.state("pair").state == "LOADING", "loading")
    assert _states((await c.post(REPOSITORY_INDEX_PATH)).json())["pair"] == ("LOADING", None)
    infer = asyncio.ensure_future(c.post("/v2/models/pair/infer", json=PAIR))
    await _until(lambda: service.control.loads.waiting("pair") == 1, "the request waits")
    assert (await c.get("/v2/models/pair/ready")).status_code == 503
    report = (await c.get(LOAD_PATH)).json()
    assert "pair" not in report["queued_by_model"] and report["loading_models"] == ["pair"]
    gate.set()
    assert (await load).status_code == 200
    r = await infer
    assert r.status_code == 200 and "x-evenserve-load-wait-ms" in r.headers
    assert (await c.post("/v2/models/pair/infer", json=PAIR)).status_code == 200


async def test_loads_and_unloads_of_one_model_are_serialized(
    explicit: tuple[Worker, httpx.AsyncClient],
) -> None:
    service, c = explicit
    seen: list[str] = []
    orig = service.control.install

    def install(*a: Any) -> None:
        seen.append(service.models.state("pair").state)
        orig(*a)

    service.control.install = install  # type: ignore[method-assign]
    rs = await asyncio.gather(
        c.post(repository_path("pair", "load")),
        c.post(repository_path("pair", "unload")),
        c.post(repository_path("pair", "load")),
    )
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert seen == ["LOADING", "LOADING"]
    assert service.models.state("pair").state == "READY"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("none", "model control is disabled (--model-control none)"),
        (
            "poll",
            "explicit model load is not allowed while the repository is polled "
            "(--model-control poll)",
        ),
    ],
)
async def test_none_and_poll_modes_refuse_explicit_control(
    tmp_path: Path, mode: Mode, message: str
) -> None:
    service = await _started(_service(_repo(tmp_path), ["em"], mode))
    async with _client(service) as c:
        r = await c.post(repository_path("pair", "load"))
        assert r.status_code == 400 and r.json()["error"] == message
        r = await c.post(repository_path("em", "unload"))
        assert r.status_code == 400
        assert r.json()["error"] == message.replace("load", "unload")
        assert (await c.post("/v2/models/em/infer", json=X)).status_code == 200
    await service.stop()


async def test_a_worker_without_models_needs_model_control(tmp_path: Path) -> None:
    from evenserve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="needs at least one model"):
        _service(_repo(tmp_path), None, "none")


async def test_poll_loads_new_folders_reloads_changed_ones_and_unloads_removed(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    shutil.rmtree(repo / "pair")
    shutil.rmtree(repo / "waits")
    shutil.rmtree(repo / "slow")
    service = await _started(_service(repo, ["em"], "poll"))
    assert await service.poller.poll() == []  # nothing changed
    write_repo(tmp_path, {"pair": MODELS["pair"]})
    assert await service.poller.poll() == [("pair", "load")]
    assert service.models.state("pair").state == "READY"
    em_yaml = repo / "em" / "model.yaml"
    st = em_yaml.stat()
    em_yaml.write_text(yaml.safe_dump({**MODELS["em"], "max_batch_size": 8}))
    os.utime(em_yaml, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert await service.poller.poll() == [("em", "reload")]
    assert service.models["em"].entry.config.max_batch_size == 8
    shutil.rmtree(repo / "pair")
    assert await service.poller.poll() == [("pair", "unload")]
    assert service.models.state("pair").reason == "unloaded"
    # A broken folder is tried once, then again only when its model.yaml changes.
    (repo / "bad").mkdir()
    (repo / "bad" / "model.yaml").write_text("runtime: nope\n")
    assert await service.poller.poll() == [("bad", "load failed")]
    assert await service.poller.poll() == []
    assert service.models.state("bad").state == "UNAVAILABLE"
    await service.stop()


# -- over sockets: the real server, HTTP and gRPC ------------------------------------------------
def _wait(cond: Any, what: str) -> None:
    """Wait on this thread for a condition (no duration is asserted)."""
    done = threading.Event()
    for _ in range(60_000):
        if cond():
            return
        done.wait(0.001)
    raise AssertionError(f"never happened: {what}")


def test_unload_under_threaded_load_over_http(tmp_path: Path) -> None:
    service = _service(_repo(tmp_path), ["em", "pair"])
    with BackgroundWorker(service) as w, httpx.Client(base_url=w.url, timeout=60) as c:
        statuses: Counter[tuple[str, int, str]] = Counter()
        lock = threading.Lock()
        sent = [0]
        stop = threading.Event()

        def client(model: str, body: dict[str, Any]) -> None:
            with httpx.Client(base_url=w.url, timeout=60) as cc:
                while not stop.is_set():
                    with lock:
                        sent[0] += 1
                    r = cc.post(f"/v2/models/{model}/infer", json=body)
                    err = "" if r.status_code == 200 else r.json()["error"]
                    key = (model, r.status_code, err)
                    with lock:
                        statuses[key] += 1

        with ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(client, "em", X) for _ in range(3)]
            futs += [pool.submit(client, "pair", PAIR) for _ in range(3)]
            for _ in range(3):
                # Unload while both models are under load: some em answered since the last.
                before = statuses[("em", 200, "")]
                _wait(lambda b=before: statuses[("em", 200, "")] >= b + 10, "em served")
                assert c.post(repository_path("em", "unload")).status_code == 200
                assert c.post(repository_path("em", "load")).status_code == 200
            stop.set()
            for f in futs:
                f.result()
        assert sent[0] == sum(statuses.values())
        allowed = {
            ("pair", 200, ""),  # the other model is never disturbed
            ("em", 200, ""),
            ("em", 503, "model 'em' is unloading"),
            ("em", 503, "model 'em' is loading"),
            ("em", 503, "model 'em' is not loaded (unloaded)"),
            ("em", 404, "model 'em' is not served here (models: pair)"),
        }
        assert set(statuses) <= allowed, statuses
        assert statuses[("em", 200, "")] >= 30 and statuses[("pair", 200, "")] > 0
        index = c.post(REPOSITORY_INDEX_PATH).json()
        assert _states(index)["em"] == ("READY", None)


grpc = pytest.importorskip("grpc")
triton_grpc = pytest.importorskip("tritonclient.grpc")


def test_model_control_over_grpc(tmp_path: Path) -> None:
    from tritonclient.utils import InferenceServerException

    service = _service(_repo(tmp_path), ["em"])
    with BackgroundWorker(service, grpc_port=0) as w:
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{w.grpc_port}")
        try:
            index = client.get_model_repository_index(as_json=True)["models"]
            assert {m["name"]: m.get("state") for m in index} == {
                "em": "READY",
                "pair": "UNAVAILABLE",
                "slow": "UNAVAILABLE",
                "waits": "UNAVAILABLE",
            }
            assert "model_repository" in client.get_server_metadata(as_json=True)["extensions"]
            assert not client.is_model_ready("pair")
            client.load_model("pair", config=json.dumps({"max_batch_size": 4}))
            assert client.is_model_ready("pair")
            cfg = client.get_model_config("pair", as_json=True)["config"]
            assert int(cfg["max_batch_size"]) == 4
            client.unload_model("pair")
            assert not client.is_model_ready("pair")
            states = {
                m["name"]: (m.get("state"), m.get("reason"))
                for m in client.get_model_repository_index(as_json=True)["models"]
            }
            assert states["pair"] == ("UNAVAILABLE", "unloaded")
            ready = client.get_model_repository_index(as_json=True)
            assert [m["name"] for m in ready["models"] if m.get("state") == "READY"] == ["em"]

            def code(fn: Any, *args: Any, **kw: Any) -> tuple[str, str]:
                with pytest.raises(InferenceServerException) as err:
                    fn(*args, **kw)
                return str(err.value.status()), err.value.message()

            status, msg = code(client.load_model, "nope")
            assert status == "StatusCode.NOT_FOUND" and "no model folder 'nope'" in msg
            status, msg = code(client.load_model, "pair", config=json.dumps({"max_batch_size": 0}))
            assert status == "StatusCode.INVALID_ARGUMENT" and "max_batch_size" in msg
            status, msg = code(client.load_model, "pair", config="{not json")
            assert status == "StatusCode.INVALID_ARGUMENT" and "parameters['config']" in msg
            status, msg = code(client.unload_model, "pair")
            assert status == "StatusCode.INVALID_ARGUMENT" and "is not loaded" in msg
            # A name far over grpc's metadata limit is cut in the message (wire.shown).
            long = "m" * 10_000
            for fn in (client.load_model, client.unload_model):
                status, msg = code(fn, long)
                assert status == "StatusCode.INVALID_ARGUMENT", msg
                assert len(msg) < 300 and "(10002 characters)" in msg
            req = triton_grpc.service_pb2.RepositoryModelLoadRequest(model_name="pair")
            req.parameters[long].string_param = "{}"
            with (
                grpc.insecure_channel(f"127.0.0.1:{w.grpc_port}") as channel,
                pytest.raises(grpc.RpcError) as rpc_err,
            ):
                stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
                stub.RepositoryModelLoad(req, timeout=30)
            assert rpc_err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = rpc_err.value.details() or ""
            assert len(details) < 300 and "(10002 characters)" in details
        finally:
            client.close()


def test_grpc_model_control_disabled_in_mode_none(tmp_path: Path) -> None:
    from tritonclient.utils import InferenceServerException

    service = _service(_repo(tmp_path), ["em"], "none")
    with BackgroundWorker(service, grpc_port=0) as w:
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{w.grpc_port}")
        try:
            with pytest.raises(InferenceServerException) as err:
                client.load_model("pair")
            assert str(err.value.status()) == "StatusCode.INVALID_ARGUMENT"
            assert err.value.message() == "model control is disabled (--model-control none)"
        finally:
            client.close()


# -- a Triton model folder (config.pbtxt) under model control -----------------------------------
TS_PBTXT = """
name: "tiny_ts"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
TS_INFER = {
    "inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]
}


def _triton_folder(repo: Path) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    import warnings

    d = repo / "tiny_ts"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(TS_PBTXT)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream; still served
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), str(d / "1" / "model.pt"))
    return d


async def test_a_triton_folder_loads_with_triton_config_json_as_its_override(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    _triton_folder(repo)
    service = await _started(_service(repo, ["em"]))
    async with _client(service) as c:
        assert _states((await c.post(REPOSITORY_INDEX_PATH)).json())["tiny_ts"] == (
            "UNAVAILABLE",
            "not loaded",
        )
        assert (await c.post(repository_path("tiny_ts", "load"))).status_code == 200
        assert (await c.post("/v2/models/tiny_ts/infer", json=TS_INFER)).status_code == 200
        # Triton's load config: a whole model config JSON replacing config.pbtxt.
        config = {
            "name": "tiny_ts",
            "backend": "pytorch",
            "max_batch_size": 2,
            "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [3]}],
            "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [2]}],
        }
        body = {"parameters": {"config": json.dumps(config)}}
        assert (await c.post(repository_path("tiny_ts", "load"), json=body)).status_code == 200
        assert service.models["tiny_ts"].entry.config.max_batch_size == 2
        bad = {"parameters": {"config": json.dumps({"bogus": 1})}}
        r = await c.post(repository_path("tiny_ts", "load"), json=bad)
        assert r.status_code == 400 and "bogus" in r.json()["error"]
        assert (await c.post(repository_path("tiny_ts", "unload"))).status_code == 200
    await service.stop()


async def test_poll_reloads_a_triton_folder_when_its_config_pbtxt_changes(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    d = _triton_folder(repo)
    service = await _started(_service(repo, ["tiny_ts"], "poll"))
    assert await service.poller.poll() == []
    pbtxt = d / "config.pbtxt"
    st = pbtxt.stat()
    pbtxt.write_text(TS_PBTXT.replace("max_batch_size: 4", "max_batch_size: 2"))
    os.utime(pbtxt, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert await service.poller.poll() == [("tiny_ts", "reload")]
    assert service.models["tiny_ts"].entry.config.max_batch_size == 2
    assert await service.poller.poll() == []
    await service.stop()
