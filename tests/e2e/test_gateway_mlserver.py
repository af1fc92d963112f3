"""The gateway in front of real MLServer instances (servers we did not write).

Two MLServer 1.7.1 processes on loopback serve a tiny model built here (tests/fixtures/
mlserver/doubler: doubles its FP32 input). The gateway has no load signals from them
(``signals: {source: none}``): it routes on readiness polling plus its own in-flight counts.
Over gRPC the gateway relays ModelInfer to MLServer's gRPC endpoint (``grpc_forward:
grpc``): MLServer's HTTP API has no binary tensor extension, so the default translation to
HTTP does not work with it (it answers 500, which the client gets as INTERNAL).
Needs the separate environment made by scripts/setup_mlserver_env.sh (MLServer pins its own
dependencies; its 1.7.1 workers crash with uvloop >= 0.22, so that env pins uvloop 0.21.0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from tests.integration.fake_v2 import serving

ROOT = Path(__file__).resolve().parents[2]
MLSERVER = ROOT / ".venv-mlserver" / "bin" / "mlserver"
MODEL = ROOT / "tests" / "fixtures" / "mlserver" / "doubler"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not MLSERVER.exists(),
        reason=f"MLServer env absent ({MLSERVER}); create it with scripts/setup_mlserver_env.sh",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlserver exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/v2/models/doubler/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"mlserver not ready after {timeout_s} s: {log.read_text()[-2000:]}")


#: Each MLServer's gRPC address (host:port), by its HTTP URL.
GRPC_OF: dict[str, str] = {}


@pytest.fixture(scope="module")
def mlservers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    logs: list[Path] = []
    files: list[Any] = []
    try:
        for i in range(2):
            d = tmp_path_factory.mktemp(f"mlserver{i}")
            shutil.copytree(MODEL, d / "doubler")
            http, grpc, metrics = free_port(), free_port(), free_port()
            (d / "settings.json").write_text(
                json.dumps(
                    {
                        "host": "127.0.0.1",
                        "http_port": http,
                        "grpc_port": grpc,
                        "metrics_port": metrics,
                        "server_name": f"mlserver{i}",
                    }
                )
            )
            log = d / "mlserver.log"
            logs.append(log)
            files.append(log.open("wb"))
            procs.append(
                subprocess.Popen(
                    [str(MLSERVER), "start", str(d)],
                    cwd=d,
                    stdout=files[-1],
                    stderr=subprocess.STDOUT,
                )
            )
            urls.append(f"http://127.0.0.1:{http}")
            GRPC_OF[urls[-1]] = f"127.0.0.1:{grpc}"
        for url, p, log in zip(urls, procs, logs, strict=True):
            wait_ready(url, p, log, timeout_s=120)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in files:
            f.close()


def infer_body(x: float) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [x] * 4}]}


@pytest.mark.parametrize("routing", ["round-robin", "queue-aware"])
async def test_gateway_routes_to_mlserver_on_fallback_signals(
    mlservers: list[str], routing: str
) -> None:
    raw = {
        # Readiness polled at the default period, with a time limit no loaded machine's
        # MLServer needs: a probe that times out ejects the backend and moves the counts.
        "gateway": {
            "routing": routing,
            "admin": {"token": "mlserver-test-token"},
            "health": {"timeout_ms": 10_000},
        },
        "backends": [
            {"name": f"mls{i}", "url": u, "models": ["doubler"], "signals": {"source": "none"}}
            for i, u in enumerate(mlservers)
        ],
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with (
        serving(g) as served,
        httpx.AsyncClient(base_url=served.url, timeout=60) as client,
    ):
        assert (await client.get("/v2/health/ready")).status_code == 200
        meta = await client.get("/v2/models/doubler")
        assert meta.status_code == 200 and meta.json()["name"] == "doubler"

        async def one(i: int) -> httpx.Response:
            return await client.post("/v2/models/doubler/infer", json=infer_body(float(i)))

        # sequential, then bursts of 8 concurrent requests
        rs = [await one(i) for i in range(10)]
        for k in range(3):
            rs += await asyncio.gather(*(one(100 * k + j) for j in range(8)))
        assert [r.status_code for r in rs] == [200] * len(rs)
        for r in rs:
            x = json.loads(r.request.content)["inputs"][0]["data"][0]
            assert r.json()["outputs"][0]["data"] == [2 * x] * 4
        seen = Counter(r.headers["x-evenserve-backend"] for r in rs)
        assert set(seen) == {"mls0", "mls1"}
        if routing == "round-robin":
            assert seen["mls0"] == seen["mls1"] == len(rs) // 2
        view = (
            await client.get(
                "/admin/backends", headers={"authorization": "Bearer mlserver-test-token"}
            )
        ).json()
        for b in view["backends"]:
            assert b["healthy"] and b["signal_source"] == "none"
            assert b["signals"]["fresh"] is False  # fallback: in-flight counts, not "idle"
        print(f"\n{routing}: {len(rs)} requests, all 200, backends {dict(seen)}")


async def test_grpc_through_the_gateway_is_relayed_to_mlservers_grpc_endpoint(
    mlservers: list[str],
) -> None:
    grpc = pytest.importorskip("grpc")
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
    import numpy as np

    def backends(forward: str | None) -> list[dict[str, Any]]:
        out = []
        for i, u in enumerate(mlservers):
            b = {"name": f"mls{i}", "url": u, "grpc_url": GRPC_OF[u], "models": ["doubler"],
                 "signals": {"source": "none"}}  # fmt: skip
            if forward is not None:
                b["grpc_forward"] = forward
            out.append(b)
        return out

    for forward in ("grpc", None):
        raw = {
            "gateway": {"routing": "round-robin", "grpc_port": 0,
                        "admin": {"token": "mlserver-test-token"},
                        "health": {"timeout_ms": 10_000}},
            "backends": backends(forward),
        }  # fmt: skip
        g = Gateway(parse_cluster(raw, Path(".")))
        async with serving(g):
            addr = f"127.0.0.1:{g.grpc.port}"
            async with grpc.aio.insecure_channel(addr) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                x = np.arange(4, dtype=np.float32).reshape(1, 4)
                req = service_pb2.ModelInferRequest(model_name="doubler")
                req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
                req.raw_input_contents.append(x.tobytes())
                if forward == "grpc":
                    seen: Counter[str] = Counter()
                    for _ in range(4):
                        call = stub.ModelInfer(req, timeout=60)
                        resp = await call
                        (raw_out,) = resp.raw_output_contents
                        assert np.array_equal(np.frombuffer(raw_out, np.float32), 2 * x[0])
                        seen[dict(await call.trailing_metadata())["x-evenserve-backend"]] += 1
                    assert seen == {"mls0": 2, "mls1": 2}
                else:  # the default, http: MLServer cannot read the binary extension
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.ModelInfer(req, timeout=60)
                    assert err.value.code() == grpc.StatusCode.INTERNAL
                    assert "HTTP status 500" in (err.value.details() or "")
