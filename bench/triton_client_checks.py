"""NVIDIA's own clients (tritonclient.http and tritonclient.grpc) against an evenserve worker
and through the evenserve gateway: every check a Triton user makes, and every error case.

    .venv/bin/python bench/triton_client_checks.py [--json out/triton-checks.json]

It starts two emulated workers (``evenserve worker`` with HTTP and gRPC; the first with
``--model-control explicit``) and a gateway in front of both (HTTP and gRPC), all on free
loopback ports, then runs the same checks over the four (target, protocol) pairs:

- health (live, ready), server and model metadata, model config, model ready;
- inference: JSON tensors and binary tensors (HTTP), typed ``contents`` and
  ``raw_input_contents`` (gRPC), checked for the output's name, type and shape;
- statistics (the success count grows by the requests just sent);
- repository index, load and unload (a worker: the model leaves and comes back in the index;
  the gateway: the model unloaded on a worker stops being routed there, loaded it is routed
  again, no config change);
- errors: unknown model, wrong shape, wrong datatype, missing input, malformed request,
  queue full, deadline: the status (HTTP code or gRPC code) and the message, which must name
  the field.

Every check prints PASS or FAIL with what was seen; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from rich.console import Console
from rich.table import Table
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
REPO = ROOT / "examples" / "models" / "emulated"
PROFILES = ROOT / "profiles" / "a10-trt-fp16"
RESNET = "resnet50"
BERT = "bert-base"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Check:
    target: str
    proto: str
    name: str
    ok: bool
    seen: str


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen([*EVENSERVE, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        )

    def stop(self) -> list[int | None]:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=40))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(None)
        return codes


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not get ready in {timeout_s:.0f} s")


# -- models and inputs -----------------------------------------------------------------------
NP = {
    "FP32": np.float32,
    "FP64": np.float64,
    "INT64": np.int64,
    "INT32": np.int32,
    "FP16": np.float16,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}
OTHER_TYPE = {"FP32": "FP64", "FP64": "FP32", "INT64": "FP32", "INT32": "FP32"}


@dataclass
class Model:
    """What the checks need of a model, read from its metadata."""

    name: str
    inputs: list[tuple[str, str, list[int]]]  # name, datatype, dims without the batch
    output: str
    max_batch_size: int

    @classmethod
    def read(cls, http_url: str, name: str) -> Model:
        c = httpclient.InferenceServerClient(url=http_url)
        meta, cfg = c.get_model_metadata(name), c.get_model_config(name)
        c.close()
        dims = [[1 if d == -1 else d for d in t["shape"][1:]] for t in meta["inputs"]]
        return cls(
            name,
            [(t["name"], t["datatype"], d) for t, d in zip(meta["inputs"], dims, strict=True)],
            meta["outputs"][0]["name"],
            int(cfg["max_batch_size"]),
        )

    def arrays(self, n: int = 1) -> list[tuple[str, np.ndarray]]:
        rng = np.random.default_rng(0)
        out = []
        for name, dt, dims in self.inputs:
            a = rng.random((n, *dims)) if dt.startswith("FP") else rng.integers(0, 2, (n, *dims))
            out.append((name, a.astype(NP[dt])))
        return out


def dtype_name(a: np.ndarray) -> str:
    return next(k for k, v in NP.items() if np.dtype(v) == a.dtype)


def http_inputs(arrays: list[tuple[str, np.ndarray]], binary: bool) -> list[Any]:
    out = []
    for name, a in arrays:
        x = httpclient.InferInput(name, list(a.shape), dtype_name(a))
        x.set_data_from_numpy(a, binary_data=binary)
        out.append(x)
    return out


def grpc_inputs(arrays: list[tuple[str, np.ndarray]]) -> list[Any]:
    out = []
    for name, a in arrays:
        x = grpcclient.InferInput(name, list(a.shape), dtype_name(a))
        x.set_data_from_numpy(a)
        out.append(x)
    return out


def wrong_shape(m: Model) -> list[tuple[str, np.ndarray]]:
    (name, a), *rest = m.arrays()
    return [(name, np.zeros((*a.shape[:-1], a.shape[-1] + 1), a.dtype)), *rest]


def wrong_type(m: Model) -> list[tuple[str, np.ndarray]]:
    (name, a), *rest = m.arrays()
    return [(name, a.astype(NP[OTHER_TYPE[dtype_name(a)]])), *rest]


def missing_input(m: Model) -> tuple[list[tuple[str, np.ndarray]], str]:
    """The inputs less the last one (a one-input model: under another name) and the name
    the error must give."""
    arrays = m.arrays()
    if len(arrays) > 1:
        return arrays[:-1], arrays[-1][0]
    return [("not_an_input", arrays[0][1])], arrays[0][0]


def typed_request(m: Model) -> Any:
    """A ModelInferRequest with typed ``contents`` (not raw bytes)."""
    req = service_pb2.ModelInferRequest(model_name=m.name)
    for name, a in m.arrays():
        t = req.inputs.add()
        t.name, t.datatype = name, dtype_name(a)
        t.shape.extend(a.shape)
        field = {
            "FP32": "fp32_contents",
            "FP64": "fp64_contents",
            "INT64": "int64_contents",
            "INT32": "int_contents",
            "BOOL": "bool_contents",
        }[t.datatype]
        getattr(t.contents, field).extend(a.ravel().tolist())
    return req


def short_raw_request(m: Model) -> Any:
    """Raw contents too short for the first input's shape."""
    req = service_pb2.ModelInferRequest(model_name=m.name)
    for i, (name, a) in enumerate(m.arrays()):
        t = req.inputs.add()
        t.name, t.datatype = name, dtype_name(a)
        t.shape.extend(a.shape)
        req.raw_input_contents.append(a.tobytes()[: 3 if i == 0 else None])
    return req


def err_of(fn: Callable[[], Any]) -> tuple[str, str]:
    """(status, message) of a call expected to fail; ("ok", "") when it succeeded."""
    try:
        fn()
    except InferenceServerException as exc:
        return str(exc.status() or ""), exc.message() or str(exc)
    except grpc.RpcError as exc:
        return str(exc.code().name), str(exc.details())
    return "ok", ""


# -- the checks ----------------------------------------------------------------------------
class Runner:
    def __init__(self) -> None:
        self.checks: list[Check] = []

    def check(self, target: str, proto: str, name: str, ok: bool, seen: Any) -> None:
        self.checks.append(Check(target, proto, name, bool(ok), str(seen)[:160]))

    def error_case(
        self,
        target: str,
        proto: str,
        name: str,
        fn: Callable[[], Any],
        statuses: tuple[str, ...],
        must_name: str | None,
    ) -> None:
        status, msg = err_of(fn)
        ok = any(s in status for s in statuses) and (
            must_name is None or must_name.lower() in msg.lower()
        )
        self.check(target, proto, f"error: {name}", ok, f"{status} {msg}")


def common(m: Model, cfg: dict[str, Any]) -> tuple[bool, Any]:
    dims = [[int(d) for d in t["dims"]] for t in cfg["input"]]
    ok = int(cfg.get("max_batch_size", 0)) == m.max_batch_size and dims == [
        d for _, _, d in m.inputs
    ]
    return ok, {k: cfg.get(k) for k in ("max_batch_size", "input", "dynamic_batching")}


def http_checks(r: Runner, target: str, url: str, m: Model) -> None:
    c = httpclient.InferenceServerClient(url=url, concurrency=8)
    P = "http"
    r.check(target, P, "server live", c.is_server_live(), c.is_server_live())
    r.check(target, P, "server ready", c.is_server_ready(), c.is_server_ready())
    meta = c.get_server_metadata()
    r.check(target, P, "server metadata", "name" in meta and "version" in meta, meta)
    r.check(target, P, "model ready", c.is_model_ready(m.name), c.is_model_ready(m.name))
    mm = c.get_model_metadata(m.name)
    r.check(
        target,
        P,
        "model metadata",
        [i["name"] for i in mm["inputs"]] == [i[0] for i in m.inputs],
        mm["inputs"],
    )
    r.check(target, P, "model config", *common(m, c.get_model_config(m.name)))
    before = stats_success(c.get_inference_statistics(m.name))
    out = httpclient.InferRequestedOutput(m.output, binary_data=False)
    res = c.infer(m.name, http_inputs(m.arrays(), binary=False), outputs=[out])
    shape = res.as_numpy(m.output).shape
    r.check(target, P, "infer JSON tensors", shape[0] == 1, f"{m.output} {shape}")
    out_b = httpclient.InferRequestedOutput(m.output, binary_data=True)
    res = c.infer(m.name, http_inputs(m.arrays(2), binary=True), outputs=[out_b])
    shape = res.as_numpy(m.output).shape
    r.check(target, P, "infer binary tensors", shape[0] == 2, f"{m.output} {shape}")
    after = stats_success(c.get_inference_statistics(m.name))
    r.check(
        target,
        P,
        "statistics count the requests",
        after - before == 2,
        f"success {before} -> {after}",
    )
    idx = c.get_model_repository_index()
    r.check(target, P, "repository index", any(e["name"] == m.name for e in idx), idx)
    first = m.inputs[0][0]
    arrays, missing = missing_input(m)
    r.error_case(
        target,
        P,
        "unknown model",
        lambda: c.infer("no-such-model", http_inputs(m.arrays(), True)),
        ("404",),
        "no-such-model",
    )
    r.error_case(
        target,
        P,
        "wrong shape",
        lambda: c.infer(m.name, http_inputs(wrong_shape(m), True)),
        ("400",),
        first,
    )
    r.error_case(
        target,
        P,
        "wrong datatype",
        lambda: c.infer(m.name, http_inputs(wrong_type(m), True)),
        ("400",),
        first,
    )
    r.error_case(
        target,
        P,
        "missing input",
        lambda: c.infer(m.name, http_inputs(arrays, True)),
        ("400",),
        missing,
    )
    r.error_case(
        target,
        P,
        "deadline (timeout 1 us)",
        lambda: c.infer(m.name, http_inputs(m.arrays(), True), timeout=1),
        ("504",),
        "deadline",
    )
    raw = httpx.post(
        f"http://{url}/v2/models/{m.name}/infer",
        content=b'{"inputs": [',
        headers={"content-type": "application/json"},
    )
    r.check(
        target,
        P,
        "error: malformed request",
        raw.status_code == 400 and "json" in raw.text.lower(),
        f"{raw.status_code} {raw.text[:120]}",
    )
    c.close()


def grpc_checks(r: Runner, target: str, url: str, m: Model) -> None:
    c = grpcclient.InferenceServerClient(url=url)
    P = "grpc"
    r.check(target, P, "server live", c.is_server_live(), c.is_server_live())
    r.check(target, P, "server ready", c.is_server_ready(), c.is_server_ready())
    meta = c.get_server_metadata(as_json=True)
    r.check(target, P, "server metadata", "name" in meta, meta)
    r.check(target, P, "model ready", c.is_model_ready(m.name), c.is_model_ready(m.name))
    mm = c.get_model_metadata(m.name, as_json=True)
    r.check(
        target,
        P,
        "model metadata",
        [i["name"] for i in mm["inputs"]] == [i[0] for i in m.inputs],
        mm["inputs"],
    )
    r.check(
        target, P, "model config", *common(m, c.get_model_config(m.name, as_json=True)["config"])
    )
    before = stats_success(c.get_inference_statistics(m.name, as_json=True))
    res = c.infer(m.name, grpc_inputs(m.arrays(2)))
    shape = res.as_numpy(m.output).shape
    r.check(target, P, "infer raw_input_contents", shape[0] == 2, f"{m.output} {shape}")
    with grpc.insecure_channel(url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        reply = stub.ModelInfer(typed_request(m), timeout=10)
        shape = list(reply.outputs[0].shape)
        raw_out = len(reply.raw_output_contents[0]) if reply.raw_output_contents else 0
        r.check(
            target,
            P,
            "infer typed contents",
            shape[0] == 1 and raw_out > 0,
            f"shape {shape}, raw_output_contents {raw_out} bytes",
        )
        r.error_case(
            target,
            P,
            "malformed request (raw bytes short)",
            lambda: stub.ModelInfer(short_raw_request(m), timeout=10),
            ("INVALID_ARGUMENT",),
            m.inputs[0][0],
        )
    after = stats_success(c.get_inference_statistics(m.name, as_json=True))
    r.check(
        target,
        P,
        "statistics count the requests",
        after - before == 2,
        f"success {before} -> {after}",
    )
    idx = c.get_model_repository_index(as_json=True).get("models", [])
    r.check(target, P, "repository index", any(e["name"] == m.name for e in idx), idx)
    first = m.inputs[0][0]
    arrays, missing = missing_input(m)
    r.error_case(
        target,
        P,
        "unknown model",
        lambda: c.infer("no-such-model", grpc_inputs(m.arrays())),
        ("NOT_FOUND",),
        "no-such-model",
    )
    r.error_case(
        target,
        P,
        "wrong shape",
        lambda: c.infer(m.name, grpc_inputs(wrong_shape(m))),
        ("INVALID_ARGUMENT",),
        first,
    )
    r.error_case(
        target,
        P,
        "wrong datatype",
        lambda: c.infer(m.name, grpc_inputs(wrong_type(m))),
        ("INVALID_ARGUMENT",),
        first,
    )
    r.error_case(
        target,
        P,
        "missing input",
        lambda: c.infer(m.name, grpc_inputs(arrays)),
        ("INVALID_ARGUMENT",),
        missing,
    )
    r.error_case(
        target,
        P,
        "deadline (timeout 1 us)",
        lambda: c.infer(m.name, grpc_inputs(m.arrays()), timeout=1),
        ("DEADLINE_EXCEEDED",),
        "deadline",
    )
    c.close()


def stats_success(doc: dict[str, Any]) -> int:
    stats = doc["model_stats"][0]["inference_stats"]["success"]
    return int(stats.get("count", 0))


def queue_full(r: Runner, target: str, http_url: str, grpc_url: str, m: Model) -> None:
    """Flood ``m`` (hosted on one worker, queue bound 4) until it refuses."""

    def one_http(_: int) -> tuple[str, str]:
        c = httpclient.InferenceServerClient(url=http_url)
        try:
            return err_of(lambda: c.infer(m.name, http_inputs(m.arrays(), True)))
        finally:
            c.close()

    def one_grpc(_: int) -> tuple[str, str]:
        c = grpcclient.InferenceServerClient(url=grpc_url)
        try:
            return err_of(lambda: c.infer(m.name, grpc_inputs(m.arrays())))
        finally:
            c.close()

    for proto, fn, code in (("http", one_http, "429"), ("grpc", one_grpc, "RESOURCE_EXHAUSTED")):
        with ThreadPoolExecutor(64) as pool:
            got = list(pool.map(fn, range(256)))
        refused = [g for g in got if code in g[0]]
        other = {g[0] for g in got if g[0] != "ok" and code not in g[0]}
        seen = f"{len(got) - len(refused)} ok, {len(refused)} {code}; e.g. " + (
            refused[0][1] if refused else "-"
        )
        ok = bool(refused) and not other and "queue" in refused[0][1].lower()
        r.check(
            target, proto, "error: queue full", ok, seen + (f" other: {other}" if other else "")
        )


def model_control(r: Runner, worker: dict[str, str], gateway: dict[str, str], m: Model) -> None:
    """Unload ``m`` on the worker (its only host), then load it back: over HTTP, then gRPC;
    the gateway follows each change from the worker's index, without a config change."""
    wh = httpclient.InferenceServerClient(url=worker["http"])
    wg = grpcclient.InferenceServerClient(url=worker["grpc"])
    gh = httpclient.InferenceServerClient(url=gateway["http"])

    def via_gateway() -> tuple[str, str]:
        return err_of(lambda: gh.infer(m.name, http_inputs(m.arrays(), True)))

    def state(index: list[dict[str, Any]]) -> str:
        return next((e.get("state", "?") for e in index if e["name"] == m.name), "absent")

    for proto, unload, load, index in (
        ("http", wh.unload_model, wh.load_model, wh.get_model_repository_index),
        (
            "grpc",
            wg.unload_model,
            wg.load_model,
            lambda: wg.get_model_repository_index(as_json=True).get("models", []),
        ),
    ):
        unload(m.name)
        st = state(index())
        r.check("worker", proto, "repository unload", st == "UNAVAILABLE", f"state {st}")
        r.check(
            "worker",
            proto,
            "model ready after unload is false",
            not wh.is_model_ready(m.name),
            wh.is_model_ready(m.name),
        )
        seen = wait_for(lambda: via_gateway()[0] != "ok", 5.0)
        status, msg = via_gateway()
        r.check(
            "gateway",
            proto,
            "unloaded model no longer routed",
            seen and status in ("404", "503"),
            f"{status} {msg}",
        )
        load(m.name)
        st = state(index())
        r.check("worker", proto, "repository load", st == "READY", f"state {st}")
        seen = wait_for(lambda: via_gateway()[0] == "ok", 5.0)
        r.check("gateway", proto, "loaded model routed again", seen, via_gateway())
    r.error_case(
        "worker",
        "http",
        "unload of an unknown model",
        lambda: wh.unload_model("no-such-model"),
        ("400", "404"),
        "no-such-model",
    )
    r.error_case(
        "worker",
        "grpc",
        "load of an unknown model",
        lambda: wg.load_model("no-such-model"),
        ("NOT_FOUND", "INVALID"),
        "no-such-model",
    )
    for c in (wh, wg, gh):
        c.close()


def wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def addresses() -> dict[str, str]:
    return {"http": f"127.0.0.1:{free_port()}", "grpc": f"127.0.0.1:{free_port()}"}


def worker_args(addr: dict[str, str], repo: Path, device: str, *more: str) -> list[str]:
    return [
        "worker",
        "--repo",
        str(repo),
        "--device",
        device,
        "--port",
        addr["http"].split(":")[1],
        "--grpc-port",
        addr["grpc"].split(":")[1],
        *more,
    ]


def start_gateway(
    procs: Procs, tmp: Path, name: str, workers: list[dict[str, str]]
) -> dict[str, str]:
    """A gateway in front of ``workers``; the backends name no models (learned from their
    index)."""
    gw = addresses()
    cluster = {
        "gateway": {
            "host": "127.0.0.1",
            "port": int(gw["http"].split(":")[1]),
            "grpc_port": int(gw["grpc"].split(":")[1]),
            "routing": "least-connections",
        },
        "backends": [
            {"name": f"w{i}", "url": f"http://{w['http']}", "grpc_url": w["grpc"]}
            for i, w in enumerate(workers)
        ],
    }
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(cluster))
    procs.start(name, ["gateway", "--config", str(cfg)])
    wait_ready(gw["http"])
    return gw


def emulated_phase(r: Runner, tmp: Path) -> list[int | None]:
    """Two emulated workers (the first with explicit model control; BERT only there) and a
    gateway: every check, queue full and model control."""
    procs = Procs(tmp)
    workers = [addresses(), addresses()]
    device = f"emulated:{PROFILES}"
    procs.start(
        "worker0",
        worker_args(
            workers[0],
            REPO,
            device,
            "--max-queue-per-model",
            "4",
            "--model-control",
            "explicit",
            "--load-model",
            RESNET,
            "--load-model",
            BERT,
        ),
    )
    procs.start("worker1", worker_args(workers[1], REPO, device, "--models", RESNET))
    try:
        for w in workers:
            wait_ready(w["http"])
        gw = start_gateway(procs, tmp, "gateway", workers)
        wait_for(
            lambda: httpx.get(f"http://{gw['http']}/v2/models/{BERT}/ready").status_code == 200, 10
        )
        resnet, bert = Model.read(workers[0]["http"], RESNET), Model.read(workers[0]["http"], BERT)
        for target, addr in (("worker", workers[0]), ("gateway", gw)):
            http_checks(r, target, addr["http"], bert)
            grpc_checks(r, target, addr["grpc"], resnet)
            queue_full(r, target, addr["http"], addr["grpc"], bert)
        model_control(r, workers[0], gw, bert)
    finally:
        codes = procs.stop()
    return codes


def triton_phase(r: Runner, tmp: Path, repo: Path) -> list[int | None]:
    """A Triton-style repository (config.pbtxt, ONNX) on a CPU worker and a gateway."""
    procs = Procs(tmp)
    w = addresses()
    procs.start("triton-worker", worker_args(w, repo, "cpu"))
    try:
        wait_ready(w["http"], 120)
        gw = start_gateway(procs, tmp, "triton-gateway", [w])
        names = [e["name"] for e in httpx.post(f"http://{w['http']}/v2/repository/index").json()]
        for name in names:
            ready = f"http://{gw['http']}/v2/models/{name}/ready"
            wait_for(lambda u=ready: httpx.get(u).status_code == 200, 10)
            m = Model.read(w["http"], name)
            for target, addr in (("triton-repo worker", w), ("triton-repo gateway", gw)):
                http_checks(r, target, addr["http"], m)
                grpc_checks(r, target, addr["grpc"], m)
    finally:
        codes = procs.stop()
    return codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the checks here")
    ap.add_argument(
        "--triton-repo",
        type=Path,
        default=ROOT / "examples" / "triton-repo",
        help="a Triton-style repository to check too (its model files must exist: "
        "scripts/make_triton_example.py writes the example's)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evenserve-checks-"))
    r = Runner()
    codes = emulated_phase(r, tmp)
    if args.triton_repo:
        codes += triton_phase(r, tmp, args.triton_repo)
    show(r.checks, codes, tmp)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([c.__dict__ for c in r.checks], indent=2) + "\n")
    sys.exit(0 if all(c.ok for c in r.checks) and all(c == 0 for c in codes) else 1)


def show(checks: list[Check], codes: list[int | None], tmp: Path) -> None:
    console = Console(width=200)
    table = Table(title="tritonclient checks")
    for col in ("target", "proto", "check", "result", "seen"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.target, c.proto, c.name, "PASS" if c.ok else "FAIL", c.seen)
    console.print(table)
    failed = sum(not c.ok for c in checks)
    console.print(
        f"{len(checks) - failed}/{len(checks)} passed; process exit codes {codes}; logs in {tmp}"
    )


if __name__ == "__main__":
    main()
