"""Bad input against a real worker and a real gateway in front of it, in raw bytes.

One `evenserve worker` (emulated models on the CPU device: ``em``, FP32 [4] in, and ``pair``,
two INT64 [-1]) and one `evenserve gateway` routing to it, as subprocesses on loopback. Every
request is written by hand over a socket (asyncio streams), so malformed ones reach the
servers as sent. The contract:

- The matrix: a 5000-digit integer in tensor data or a shape, ``priority`` / ``deadline_ms`` /
  ``timeout`` of 10**400, a 400-digit ``x-evenserve-priority``, JSON nested 5,000-100,000
  deep, a bad ``Inference-Header-Content-Length``: 400 naming the field, from the worker and
  relayed by the gateway. A version ``..`` in any spelling (``%2e%2e``, ``%252e%252e``...):
  404 from both.
- The hardening list (issue 26): a header that never ends is 431 while the client holds
  the connection (not a 408 at the head timeout); HEAD and absolute-form targets are
  answered as GET; ``PUT /admin/params`` with a number that is not finite, an empty body, an
  unknown field or an unknown model is 400 naming the field and makes no version.
- The servers themselves: a 1 MiB header is 431; a 300 MB chunked body is refused with 413
  without the gateway buffering it (its resident memory grows less than 64 MiB); a worker's
  500 leaves the client's connection to the gateway usable (100 times 500 then 200); a
  client that goes away mid-body leaves no traceback; a connection that sends a partial head
  and stalls (or trickles, or sends nothing) is closed; 2,000 idle connections deny nobody
  service and do not get the worker ejected.
- A seeded fuzz of malformed requests against each server: no answer is 5xx, and both
  servers answer a valid request afterwards.

Nothing here asserts how fast anything happens: time limits only guard against hangs and are
generous (a closed connection is waited for up to 30 s); memory is measured, not time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..integration.worker_repo import MODELS, write_repo

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
HOST = "127.0.0.1"
TOKEN = "bad-input-admin-token-0123456789"
#: A batch holding this value fails in the emulated runtime: the worker answers 500.
FAIL_VALUE = -4242.0
WORKER_MAX_BODY = 16 * 1024 * 1024
MIB = 1024 * 1024
#: Hang guards (seconds), far above what a loopback answer needs.
ANSWER_S = 60.0
CLOSE_CAP_S = 30.0
FUZZ_ANSWER_S = 20.0
#: Per server; a longer run: EVENSERVE_FUZZ_CASES=5000 pytest tests/e2e/test_bad_input.py -k fuzz
FUZZ_CASES = int(os.environ.get("EVENSERVE_FUZZ_CASES", "1500"))
HUGE = "9" * 5000  # over Python's 4300-digit limit for int()
HUGE_MARK = "<a 5000-digit integer>"  # in a fuzzed document, replaced by HUGE once dumped

# -- the servers -------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    stderr: Path

    def stderr_text(self, since: int = 0) -> str:
        return self.stderr.read_bytes()[since:].decode(errors="replace")

    def stderr_size(self) -> int:
        return self.stderr.stat().st_size

    def rss_bytes(self, field_name: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field_name} for pid {self.proc.pid}")


@dataclass
class Cluster:
    worker: Server
    gateway: Server

    def of(self, name: str) -> Server:
        return self.worker if name == "worker" else self.gateway


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _spawn(name: str, args: list[str], tmp: Path, env: dict[str, str] | None = None) -> Any:
    err = tmp / f"{name}.stderr"
    with (tmp / f"{name}.stdout").open("wb") as out, err.open("wb") as e:
        proc = subprocess.Popen(
            [*CLI, *args], stdout=out, stderr=e, stdin=subprocess.DEVNULL, env=env
        )
    return proc, err


def _wait_ready(proc: subprocess.Popen[bytes], port: int, err: Path) -> None:
    deadline = time.monotonic() + 120  # a hang guard: a loaded machine starts Python slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited while starting: {err.read_text(errors='replace')}")
        with contextlib.suppress(OSError, AssertionError):
            if asyncio.run(exchange(port, get("/v2/health/ready"), timeout=5)).status == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"not ready: {err.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("bad-input")
    em = {**MODELS["em"], "emulated": {"profile": "profile.yaml", "fail_value": FAIL_VALUE}}
    repo = write_repo(tmp, {"em": em, "pair": MODELS["pair"]})
    port_file = tmp / "worker.port"
    env = {**os.environ, "EVENSERVE_ADMIN_TOKEN": TOKEN}
    wproc, werr = _spawn(
        "worker",
        ["worker", "--repo", str(repo), "--device", "cpu", "--port", "0",
         "--port-file", str(port_file), "--log-level", "warning",
         "--max-body-bytes", str(WORKER_MAX_BODY)],
        tmp,
        env,
    )  # fmt: skip
    procs = [wproc]
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            assert wproc.poll() is None, werr.read_text(errors="replace")
            assert time.monotonic() < deadline, "the worker wrote no port file"
            time.sleep(0.05)
        wport = int(port_file.read_text())
        _wait_ready(wproc, wport, werr)
        gport = _free_port()
        config = {
            "gateway": {
                "host": HOST,
                "port": gport,
                "routing": "round-robin",
                # Probe limits far above a loopback answer: a loaded machine never ejects.
                "signals": {"interval_ms": 200, "timeout_ms": 20000, "stale_after_ms": 120000},
                "health": {"interval_ms": 200, "timeout_ms": 20000},
                # The body limit below the 64 MiB default: the 300 MB test shows the gateway
                # refuses at its limit, without reading what is beyond it.
                "forward": {
                    "connect_timeout_ms": 20000,
                    "request_timeout_s": 120,
                    "max_body_mb": 16,
                },
                "overload": {"enabled": False},
            },
            "backends": [{"name": "w0", "url": f"http://{HOST}:{wport}", "models": ["em", "pair"]}],
        }
        (tmp / "cluster.yaml").write_text(yaml.safe_dump(config))
        gproc, gerr = _spawn(
            "gateway",
            ["gateway", "--config", str(tmp / "cluster.yaml"), "--log-level", "warning"],
            tmp,
            env,
        )
        procs.append(gproc)
        _wait_ready(gproc, gport, gerr)
        yield Cluster(Server("worker", wproc, wport, werr), Server("gateway", gproc, gport, gerr))
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


# -- raw HTTP/1.1 ------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        return self.body.decode(errors="replace")


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[str, str]] | None = None,
    *,
    content_length: bool = True,
) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    head += [f"{k}: {v}" for k, v in headers or []]
    if content_length and (body or method in ("POST", "PUT")):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str) -> bytes:
    return request("GET", path)


def infer(model: str, doc: Any, headers: list[tuple[str, str]] | None = None) -> bytes:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    hs = [("Content-Type", "application/json"), *(headers or [])]
    return request("POST", f"/v2/models/{model}/infer", body, hs)


async def read_reply(reader: asyncio.StreamReader, method: bytes = b"POST") -> Reply | None:
    """One final response (1xx ones are skipped); None when the server closed before one."""
    while True:
        reply = await _read_one(reader, method)
        if reply is None or not 100 <= reply.status < 200:
            return reply


async def _read_one(reader: asyncio.StreamReader, method: bytes) -> Reply | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise AssertionError(f"truncated response head: {exc.partial[:200]!r}") from None
    except ConnectionError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
        return Reply(status, headers, b"")
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(p[:-2] for p in parts)
    else:
        body = await reader.read()
    return Reply(status, headers, body)


async def exchange(port: int, raw: bytes, timeout: float = ANSWER_S) -> Reply:
    """Send ``raw`` on a new connection and read the answer."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(raw)
        await writer.drain()
        reply = await asyncio.wait_for(read_reply(reader, raw.split(b" ", 1)[0]), timeout)
        assert reply is not None, f"closed without an answer to {raw[:120]!r}"
        return reply
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def em_body(value: float = 1.0, **params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]
    }
    if params:
        doc["parameters"] = params
    return doc


def pair_body(ids: str = "[1, 2, 3]", shape: str = "[1, 3]") -> bytes:
    return (
        '{"inputs": ['
        f'{{"name": "ids", "datatype": "INT64", "shape": {shape}, "data": {ids}}}, '
        '{"name": "mask", "datatype": "INT64", "shape": [1, 3], "data": [1, 1, 1]}]}'
    ).encode()


def em_raw(params: str) -> bytes:
    """An em request whose ``parameters`` are given as JSON text (numbers json cannot dump)."""
    return json.dumps(em_body())[:-1].encode() + b', "parameters": ' + params.encode() + b"}"


def nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    return (opener * depth + closer * depth).encode()


# -- the matrix: items of the wire contract, against both servers -----------------------------

BIN_HEAD = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                 "parameters": {"binary_data_size": 16}}]}
).encode()  # fmt: skip
BIN_BODY = BIN_HEAD + struct.pack("<4f", 1, 2, 3, 4)


def post(path: str) -> bytes:
    """A valid em request sent to ``path``."""
    return request(
        "POST", path, json.dumps(em_body()).encode(), [("Content-Type", "application/json")]
    )


def _binary(length: str) -> bytes:
    hs = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", length)]
    return request("POST", "/v2/models/em/infer", BIN_BODY, hs)


MATRIX: list[tuple[str, bytes, int, str | None]] = [
    # (case, request, status, text the error names)
    ("valid", infer("em", em_body()), 200, None),
    ("valid-version", post("/v2/models/em/versions/1/infer"), 200, None),
    ("valid-binary", _binary(str(len(BIN_HEAD))), 200, None),
    ("int64-data-5000-digits", infer("pair", pair_body(ids=f"[1, 2, {HUGE}]")), 400, "'ids'"),
    ("shape-dim-5000-digits", infer("pair", pair_body(shape=f"[1, {HUGE}]")), 400, "'ids'"),
    ("batch-dim-5000-digits", infer("pair", pair_body(shape=f"[{HUGE}, 3]")), 400, "'ids'"),
    (
        "priority-1e400",
        infer("em", em_raw('{"priority": 1' + "0" * 400 + "}")),
        400,
        "parameters.priority",
    ),
    (
        "priority-5000-digits",
        infer("em", em_raw(f'{{"priority": {HUGE}}}')),
        400,
        "parameters.priority",
    ),
    (
        "deadline-1e400",
        infer("em", em_raw('{"deadline_ms": 1' + "0" * 400 + "}")),
        400,
        "parameters.deadline_ms",
    ),
    (
        "timeout-1e400",
        infer("em", em_raw('{"timeout": 1' + "0" * 400 + "}")),
        400,
        "parameters.timeout",
    ),
    (
        "priority-header-400-digits",
        infer("em", em_body(), [("x-evenserve-priority", "9" * 400)]),
        400,
        "x-evenserve-priority",
    ),
    (
        "deadline-header-400-digits",
        infer("em", em_body(), [("x-evenserve-deadline-ms", "9" * 400)]),
        400,
        "x-evenserve-deadline-ms",
    ),
    ("nested-5000", infer("em", nested(5_000)), 400, "body: JSON nested too deep"),
    ("nested-100000", infer("em", nested(100_000)), 400, "body: JSON nested too deep"),
    (
        "nested-objects-5000",
        infer("em", b'{"a":' * 5_000 + b"1" + b"}" * 5_000),
        400,
        "body: JSON nested too deep",
    ),
    (
        "nested-in-data-100000",
        infer(
            "em",
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": '
            + nested(100_000)
            + b"}]}",
        ),
        400,
        "body: JSON nested too deep",
    ),
    ("header-length-5000-digits", _binary(HUGE), 400, "Inference-Header-Content-Length"),
    ("header-length-negative", _binary("-5"), 400, "Inference-Header-Content-Length"),
    (
        "header-length-over-body",
        _binary(str(len(BIN_BODY) + 1)),
        400,
        "Inference-Header-Content-Length",
    ),
    ("header-length-short", _binary(str(len(BIN_HEAD) - 3)), 400, "JSON"),
    ("version-dotdot", post("/v2/models/em/versions/../infer"), 404, None),
    ("version-%2e%2e", post("/v2/models/em/versions/%2e%2e/infer"), 404, None),
    ("version-%2E%2E", post("/v2/models/em/versions/%2E%2E/infer"), 404, None),
    ("version-.%2e", post("/v2/models/em/versions/.%2e/infer"), 404, None),
    ("version-%252e%252e", post("/v2/models/em/versions/%252e%252e/infer"), 404, None),
    ("version-dotdot-metadata", get("/v2/models/em/versions/.."), 404, None),
    ("version-%2e%2e-ready", get("/v2/models/em/versions/%2e%2e/ready"), 404, None),
    ("version-dot", post("/v2/models/em/versions/./infer"), 404, None),
    ("model-dotdot-slash", post("/v2/models/..%2fem/infer"), 404, None),
]


@pytest.mark.parametrize("server", ["worker", "gateway"])
@pytest.mark.parametrize(("case", "raw", "status", "names"), MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(
    cluster: Cluster, server: str, case: str, raw: bytes, status: int, names: str | None
) -> None:
    reply = run(exchange(cluster.of(server).port, raw))
    assert reply.status == status, f"{case}: {reply.status} {reply.text()[:300]}"
    if names is not None:
        assert names in reply.text(), reply.text()[:300]


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (nested(100_000), "body: JSON nested too deep"),
        (b'{"policy": "queue-aware", "queue_weight": ' + HUGE.encode() + b"}", "queue_weight"),
        (
            b'{"policy": "queue-aware", "queue_weight": 1e400}',
            "routing.queue_weight: inf is not a finite number",
        ),
        (b"\xff{", "body: not valid JSON"),
    ],
)
def test_admin_routing_bodies_are_read_as_untrusted(
    cluster: Cluster, body: bytes, names: str
) -> None:
    auth = [("Authorization", f"Bearer {TOKEN}")]
    reply = run(exchange(cluster.gateway.port, request("PUT", "/admin/routing", body, auth)))
    assert reply.status == 400 and names in reply.text(), reply


# -- the servers' own limits -------------------------------------------------------------------


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_a_one_mib_header_is_431(cluster: Cluster, server: str) -> None:
    raw = infer("em", em_body(), [("x-big", "a" * MIB)])

    async def go() -> Reply | None:
        reader, writer = await asyncio.open_connection(HOST, cluster.of(server).port)
        try:
            with contextlib.suppress(ConnectionError):
                writer.write(raw)
                await writer.drain()
            return await asyncio.wait_for(read_reply(reader), ANSWER_S)
        finally:
            writer.close()

    reply = run(go())
    assert reply is not None and reply.status == 431, reply


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_a_header_that_never_ends_is_431_while_the_client_holds_on(
    cluster: Cluster, server: str
) -> None:
    """The head passes the 64 KiB limit by one byte and nothing more comes: the answer is
    431 (before, the server read on until its 10 s head timeout and answered 408)."""
    start = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: "
    head = start + b"a" * (64 * 1024 + 1 - len(start))

    async def go() -> Reply | None:
        reader, writer = await asyncio.open_connection(HOST, cluster.of(server).port)
        try:
            writer.write(head)
            await writer.drain()
            return await asyncio.wait_for(read_reply(reader, b"GET"), ANSWER_S)
        finally:
            writer.close()

    reply = run(go())
    assert reply is not None and reply.status == 431, reply
    assert "over the limit of 65536 bytes" in reply.text()


GET_PATHS = ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/em", "/v2/models/em/ready")


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_head_and_absolute_form_targets_are_answered_as_get(cluster: Cluster, server: str) -> None:
    port = cluster.of(server).port
    for path in GET_PATHS:
        got = run(exchange(port, get(path)))
        head = run(exchange(port, request("HEAD", path)))
        assert (path, got.status, head.status) == (path, 200, 200), (got, head)
        assert head.body == b"" and head.headers["content-length"] == str(len(got.body))
        absolute = run(exchange(port, get(f"http://{HOST}:{port}{path}")))
        assert (path, absolute.status) == (path, 200) and absolute.body == got.body
    reply = run(exchange(port, post(f"http://{HOST}:{port}/v2/models/em/infer")))
    assert reply.status == 200, reply
    # OPTIONS * and CONNECT (authority form): answered, not a 500; the server goes on.
    assert run(exchange(port, request("OPTIONS", "*"))).status in (400, 404, 405)
    assert run(exchange(port, request("CONNECT", f"{HOST}:{port}"))).status == 501
    assert run(exchange(port, get("/v2/health/live"))).status == 200


#: ``PUT /admin/params`` bodies of the hardening list, and what the 400 names.
BAD_PARAMS: list[tuple[str, bytes, str]] = [
    (
        "weight-1e400",
        b'{"params": {"routing": {"policy": "queue-aware", "queue_weight": 1e400}}}',
        "params.routing.queue_weight: inf is not a finite number",
    ),
    (
        "delay-1e400",
        b'{"params": {"batching_per_model": {"em": {"policy": "fixed-window", '
        b'"max_batch_delay_ms": 1e400}}}}',
        "params.batching_per_model.em.max_batch_delay_ms: inf is not a finite number",
    ),
    ("headroom-NaN", b'{"params": {"class_headroom": NaN}}', "params.class_headroom: nan"),
    ("headroom-Infinity", b'{"params": {"class_headroom": Infinity}}', "params.class_headroom"),
    ("empty-body", b"", "body: empty"),
    ("empty-object", b"{}", "params: required"),
    ("empty-params", b'{"params": {}}', "params: empty, nothing to change"),
    ("unknown-field", b'{"parms": {"class_headroom": 0.5}}', "parms: unknown field"),
    ("unknown-param", b'{"params": {"headroom": 0.5}}', "params.headroom: unknown parameter"),
    (
        "unknown-model",
        b'{"params": {"batching_per_model": {"nope": {"policy": "none"}}}}',
        "params.batching_per_model.nope:",
    ),
]


def _params_version(port: int) -> tuple[int, int]:
    auth = [("Authorization", f"Bearer {TOKEN}")]
    doc = json.loads(run(exchange(port, request("GET", "/admin/params", headers=auth))).body)
    return doc["version"], len(doc["history"])


@pytest.mark.parametrize("server", ["worker", "gateway"])
@pytest.mark.parametrize(("case", "body", "names"), BAD_PARAMS, ids=[b[0] for b in BAD_PARAMS])
def test_bad_admin_params_are_400_naming_the_field_and_make_no_version(
    cluster: Cluster, server: str, case: str, body: bytes, names: str
) -> None:
    port = cluster.of(server).port
    before = _params_version(port)
    hs = [("Authorization", f"Bearer {TOKEN}"), ("Content-Type", "application/json")]
    reply = run(exchange(port, request("PUT", "/admin/params", body, hs)))
    assert reply.status == 400 and names in reply.text(), (case, reply)
    assert _params_version(port) == before


def _sample_rss(server: Server, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError, AssertionError):
            peak[0] = max(peak[0], server.rss_bytes())
        stop.wait(0.02)


def test_a_300_mb_chunked_body_is_refused_without_buffering(cluster: Cluster) -> None:
    gw = cluster.gateway
    rss_before, hwm_before = gw.rss_bytes(), gw.rss_bytes("VmHWM")
    peak = [rss_before]
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(gw, stop, peak), daemon=True)
    sampler.start()
    chunk = b"%x\r\n" % MIB + b"7" * MIB + b"\r\n"

    async def go() -> tuple[Reply | None, int]:
        reader, writer = await asyncio.open_connection(HOST, gw.port)
        head = (
            "POST /v2/models/em/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        answer = asyncio.ensure_future(read_reply(reader))
        sent = 0
        try:
            writer.write(head.encode())
            while sent < 300 * MIB and not answer.done():
                writer.write(chunk)
                await writer.drain()
                sent += MIB
                await asyncio.sleep(0.002)  # slowly: the server has time to answer early
            if not answer.done():
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except ConnectionError:
            pass  # refused and closed while we sent: the answer tells
        try:
            return await asyncio.wait_for(answer, ANSWER_S), sent
        finally:
            writer.close()

    try:
        reply, sent = run(go())
    finally:
        stop.set()
        sampler.join()
    hwm_after = gw.rss_bytes("VmHWM")
    grown = max(peak[0], hwm_after if hwm_after > hwm_before else 0) - rss_before
    assert reply is not None and reply.status == 413, (reply, sent)
    assert grown < 64 * MIB, f"the gateway grew {grown / MIB:.0f} MiB ({sent / MIB:.0f} MiB sent)"
    assert run(exchange(gw.port, infer("em", em_body()))).status == 200


def test_a_worker_500_leaves_the_client_connection_usable(cluster: Cluster) -> None:
    async def go() -> Counter[str]:
        seen: Counter[str] = Counter()
        reader, writer = await asyncio.open_connection(HOST, cluster.gateway.port)
        try:
            for _ in range(100):
                for kind, value in (("failing", FAIL_VALUE), ("valid", 1.0)):
                    writer.write(infer("em", em_body(value)))
                    await writer.drain()
                    reply = await asyncio.wait_for(read_reply(reader), ANSWER_S)
                    seen[f"{kind} {None if reply is None else reply.status}"] += 1
                    if reply is None:
                        return seen
        finally:
            writer.close()
        return seen

    seen = run(go())
    assert seen == Counter({"failing 500": 100, "valid 200": 100}), seen


def _linger_abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), as a client that crashed does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_a_client_gone_mid_body_leaves_no_traceback(cluster: Cluster, server: str) -> None:
    srv = cluster.of(server)
    offset = srv.stderr_size()
    body = json.dumps(em_body()).encode()

    async def once(pattern: str) -> None:
        _, writer = await asyncio.open_connection(HOST, srv.port)
        if pattern.startswith("length"):
            writer.write(
                b"POST /v2/models/em/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + body[:20]
            )
        elif pattern.startswith("chunked"):
            writer.write(
                b"POST /v2/models/em/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/json\r\n\r\n" + b"%x\r\n" % 10 + body[:10] + b"\r\n"
            )
        else:  # the whole request, gone before the answer
            writer.write(infer("em", em_body()))
        await writer.drain()
        await asyncio.sleep(0.05)  # the server reads what came
        if pattern.endswith("reset"):
            _linger_abort(writer)
        else:
            writer.close()

    async def go() -> None:
        for _ in range(5):
            for p in ("length-fin", "length-reset", "chunked-fin", "chunked-reset", "whole-fin"):
                await once(p)
        assert (await exchange(srv.port, infer("em", em_body()))).status == 200
        await asyncio.sleep(1.0)  # let anything the disconnects logged reach the file

    run(go())
    assert srv.proc.poll() is None
    logged = srv.stderr_text(offset)
    assert "Traceback" not in logged, logged[-3000:]


async def _closed_within(port: int, pattern: str, cap_s: float) -> bool:
    """Whether the server closes a connection that never completes its head."""
    reader, writer = await asyncio.open_connection(HOST, port)
    partial = b"POST /v2/models/em/infer HTTP/1.1\r\nHost: x\r\nx-slow: "
    trickle: asyncio.Future[None] | None = None
    if pattern != "silent":
        writer.write(partial)
        await writer.drain()
    if pattern == "trickle":  # one byte a second, the head never ends

        async def drip() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    await asyncio.sleep(1.0)
                    writer.write(b"a")
                    await writer.drain()

        trickle = asyncio.ensure_future(drip())
    try:
        await asyncio.wait_for(reader.read(), cap_s)  # until EOF (an answer may come first)
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    finally:
        if trickle is not None:
            trickle.cancel()
        writer.close()


def test_stalled_heads_are_closed(cluster: Cluster) -> None:
    """A partial head that stalls, trickles one byte a second, or never starts: each server
    closes it (a header timeout); waited for up to 30 s, all at once."""
    cases = [(s, p) for s in ("worker", "gateway") for p in ("stall", "trickle", "silent")]

    async def go() -> list[bool]:
        return list(
            await asyncio.gather(
                *(_closed_within(cluster.of(s).port, p, CLOSE_CAP_S) for s, p in cases)
            )
        )

    closed = dict(zip([f"{s} {p}" for s, p in cases], run(go()), strict=True))
    assert all(closed.values()), closed
    for s in ("worker", "gateway"):
        assert run(exchange(cluster.of(s).port, infer("em", em_body()))).status == 200


def _admin_backends(port: int) -> dict[str, Any]:
    raw = request("GET", "/admin/backends", headers=[("Authorization", f"Bearer {TOKEN}")])
    reply = run(exchange(port, raw))
    assert reply.status == 200, reply
    doc: dict[str, Any] = json.loads(reply.body)
    return doc


def test_a_connection_flood_denies_no_one_and_ejects_nothing(cluster: Cluster) -> None:
    gw = cluster.gateway
    before = {b["name"]: b["ejections"] for b in _admin_backends(gw.port)["backends"]}

    async def go() -> tuple[int, Reply]:
        held: list[asyncio.StreamWriter] = []
        try:
            for _ in range(20):  # 2,000 in waves of 100, so the accept queue keeps up
                opened = await asyncio.gather(
                    *(asyncio.open_connection(HOST, gw.port) for _ in range(100)),
                    return_exceptions=True,
                )
                held += [o[1] for o in opened if isinstance(o, tuple)]
            # While all of them are held, a client with a request is served.
            reply = await exchange(gw.port, infer("em", em_body()))
            return len(held), reply
        finally:
            for w in held:
                w.close()

    opened, reply = run(go())
    assert reply.status == 200, (opened, reply)
    after = _admin_backends(gw.port)["backends"]
    assert [(b["name"], b["healthy"], b["ejections"]) for b in after] == [
        (name, True, n) for name, n in before.items()
    ], after
    assert run(exchange(gw.port, infer("em", em_body()))).status == 200


# -- the fuzz ----------------------------------------------------------------------------------

PATHS = [
    "/v2/models/em/infer", "/v2/models/pair/infer", "/v2/models/em/versions/1/infer",
    "/v2/models/em", "/v2/models/em/ready", "/v2/models/em/config", "/v2/models/em/stats",
    "/v2/health/ready", "/v2/health/live", "/v2", "/v2/repository/index", "/metrics",
    "/v2/evenserve/load", "/v2/models/stats", "/admin/backends", "/admin/routing",
]  # fmt: skip
JUNK_SEGMENTS = [
    "..", ".", "%2e%2e", "%252e%252e", "%2f", "%00", "%ff", "%", "%zz", "", "versions",
    "infer", "é", "a b", "~", "*", "em;x", "em?x=1", "em#f", "x" * 300, "%c0%ae%c0%ae",
]  # fmt: skip
METHODS = ["POST"] * 8 + ["GET"] * 3 + [
    "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "FOO", "post", "G\x00T", "", "X" * 70,
]  # fmt: skip
VALUES: list[Any] = [0, 1, -1, 1.5, 1e308, -1e-308, "a", None, True, [], {}, 2**63, -(2**64)]


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 6 else 3)
    if kind == 0:
        return rng.choice(VALUES)
    if kind == 1:
        return rng.choice(["x", "ids", "mask", "FP32", "INT64", "BYTES", "", "\u0000", "é"])
    if kind == 2:
        return rng.choice([rng.randint(-(2**70), 2**70), 10**400, 2**63, HUGE_MARK])
    if kind == 3:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = ["name", "datatype", "shape", "data", "parameters", "inputs", "outputs", "id",
            "binary_data_size", "priority", "deadline_ms", "timeout", "binary_data_output",
            "binary_data", "classification", "sequence_id"]  # fmt: skip
    return {rng.choice(keys): _json_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def _tensor(rng: random.Random, name: str, dtype: str, dims: int) -> dict[str, Any]:
    shape = [rng.choice([1, 1, 2, 0, -1, 17])] + [rng.choice([4, 3, 1, 0, 5]) for _ in range(dims)]
    n = 1
    for d in shape:
        n *= max(d, 0)
    t: dict[str, Any] = {"name": name, "datatype": dtype, "shape": shape}
    if rng.random() < 0.8:
        t["data"] = [rng.choice([0, 1, 2.5, -3, 7]) for _ in range(min(n, 64))]
    else:
        t["parameters"] = {"binary_data_size": rng.choice([0, 16, 24, n * 4, -1])}
    if rng.random() < 0.15:
        t[rng.choice(["datatype", "shape", "data", "name"])] = _json_value(rng)
    return t


def _body(rng: random.Random, model: str) -> tuple[bytes, str | None]:
    """(body, Inference-Header-Content-Length or None)."""
    if model == "pair":
        doc: Any = {"inputs": [_tensor(rng, "ids", "INT64", 1), _tensor(rng, "mask", "INT64", 1)]}
    else:
        doc = {"inputs": [_tensor(rng, "x", "FP32", 1)]}
    if rng.random() < 0.3:
        doc["parameters"] = {
            rng.choice(["priority", "deadline_ms", "timeout", "binary_data_output", "x"]): (
                _json_value(rng)
            )
        }
    if rng.random() < 0.2:
        doc["outputs"] = [{"name": rng.choice(["y", "logits", "z"]),
                           "parameters": {"binary_data": rng.choice([True, 1, None])}}]  # fmt: skip
    if rng.random() < 0.1:
        doc = _json_value(rng)
    body = json.dumps(doc).encode().replace(f'"{HUGE_MARK}"'.encode(), HUGE.encode())
    roll = rng.random()
    if roll < 0.15:  # truncated
        body = body[: rng.randrange(len(body) + 1)]
    elif roll < 0.3:  # bytes flipped
        b = bytearray(body)
        for _ in range(rng.randrange(1, 6)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        body = bytes(b)
    elif roll < 0.35:
        body = rng.randbytes(rng.randrange(200))
    elif roll < 0.4:
        body = b"[" * rng.choice([10, 65, 3000]) + body
    hl = None
    if rng.random() < 0.25:  # the binary extension: JSON, then raw tensor bytes
        tail = rng.randbytes(rng.choice([0, 4, 16, 24, 100]))
        hl = rng.choice(
            [str(len(body)), str(len(body) + 1), "0", "-1", "abc", "9" * 30, "",
             str(len(body) - 2), " 5", "1_0", str(len(body) + len(tail))]
        )  # fmt: skip
        body += tail
    return body, hl


def _path(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(PATHS[:3])
    if roll < 0.75:
        return rng.choice(PATHS)
    parts = ["v2", "models", rng.choice(["em", "pair", "nope", *JUNK_SEGMENTS])]
    if rng.random() < 0.5:
        parts += ["versions", rng.choice(["1", "2", *JUNK_SEGMENTS])]
    parts.append(rng.choice(["infer", "ready", "config", "stats", "", *JUNK_SEGMENTS]))
    path = "/" + "/".join(parts)
    if rng.random() < 0.1:
        path = rng.choice(["*", "", "http://h/v2/models/em/infer", "//v2//models", "v2/models/em"])
    return path


def fuzz_case(rng: random.Random) -> tuple[bytes, bool]:
    """(raw request, complete): an incomplete one is half-closed after sending, so the server
    sees its end (else it would rightly wait for the rest)."""
    method = rng.choice(METHODS)
    path = _path(rng)
    model = "pair" if "pair" in path else "em"
    version = rng.choice(["HTTP/1.1"] * 12 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", "", "HTTP/9"])
    body, hl = (
        _body(rng, model)
        if method in ("POST", "PUT", "post") or rng.random() < 0.1
        else (b"", None)
    )
    headers: list[bytes] = []
    if rng.random() < 0.95:
        headers.append(b"Host: 127.0.0.1")
    if rng.random() < 0.8:
        ct = rng.choice(["application/json", "application/octet-stream", "text/plain", "", "x"])
        headers.append(f"Content-Type: {ct}".encode())
    if hl is not None:
        headers.append(f"Inference-Header-Content-Length: {hl}".encode())
    for _ in range(rng.choice([0, 0, 1, 2, 5])):
        headers.append(
            rng.choice(
                [
                    b"x-evenserve-priority: " + rng.choice(
                        [b"online", b"offline", b"7", b"-3", b"9" * 500, b"1e3", b"\xff", b""]),
                    b"x-evenserve-deadline-ms: " + rng.choice(
                        [b"100", b"0", b"-1", b"nan", b"inf", b"1e400", b"9" * 500, b"x"]),
                    b"Content-Encoding: " + rng.choice([b"gzip", b"deflate", b"br", b"identity"]),
                    b"x-junk: " + rng.randbytes(rng.randrange(1, 40)).replace(b"\r", b"")
                    .replace(b"\n", b""),
                    rng.randbytes(rng.randrange(1, 20)).replace(b"\r", b"").replace(b"\n", b""),
                    b"NoColonHere",
                    b" leading-space: x",
                    b"x-long: " + b"v" * rng.choice([100, 4000]),
                    b"Connection: " + rng.choice([b"close", b"keep-alive", b"upgrade", b"\x00"]),
                    b"Expect: 100-continue",
                    b"Authorization: Bearer " + rng.choice([b"wrong", TOKEN.encode(), b""]),
                ]
            )
        )  # fmt: skip
    complete = True
    framing = rng.random()
    if framing < 0.6:
        headers.append(b"Content-Length: %d" % len(body))
    elif framing < 0.7:
        pass  # no length: the body, if any, reads as a next request
    elif framing < 0.75:
        headers.append(b"Content-Length: %d" % max(0, len(body) - rng.randrange(1, 10)))
    elif framing < 0.82:
        headers.append(b"Content-Length: %d" % (len(body) + rng.randrange(1, 1000)))
        complete = False
    elif framing < 0.9:
        headers.append(
            b"Content-Length: "
            + rng.choice([b"-1", b"abc", b"1e3", b" 12", b"+5", b"9" * 30, b"", b"0x10", b"5, 6"])
        )
        complete = False
    else:
        headers.append(b"Transfer-Encoding: chunked")
        chunks = b""
        rest = body
        while rest:
            n = min(rng.randrange(1, 64), len(rest))
            chunks += b"%x\r\n" % n + rest[:n] + b"\r\n"
            rest = rest[n:]
        if rng.random() < 0.7:
            body = chunks + b"0\r\n\r\n"
        else:
            body = chunks + rng.choice([b"zz\r\n", b"5\r\nab", b"", b"-1\r\n"])
            complete = False
    if rng.random() < 0.05:
        headers.append(b"Content-Length: 3")  # a second, conflicting length
        complete = False
    line = f"{method} {path} {version}".encode("utf-8", errors="replace")
    if rng.random() < 0.03:
        line = rng.randbytes(rng.randrange(1, 60)).replace(b"\n", b"")
        complete = False
    return line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body, complete


@dataclass
class FuzzTally:
    statuses: Counter[int | str] = field(default_factory=Counter)
    five_hundreds: list[tuple[int, bytes, str]] = field(default_factory=list)


async def _fuzz_one(port: int, raw: bytes, complete: bool, tally: FuzzTally) -> None:
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as exc:
        tally.statuses[f"connect {type(exc).__name__}"] += 1
        return
    try:
        try:
            writer.write(raw)
            await writer.drain()
            if not complete:
                writer.write_eof()
        except ConnectionError:
            pass
        try:
            reply = await asyncio.wait_for(read_reply(reader, raw.split(b" ", 1)[0]), FUZZ_ANSWER_S)
        except TimeoutError:
            tally.statuses["no answer in time"] += 1
            return
        except (AssertionError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
            tally.statuses[f"unreadable {type(exc).__name__}"] += 1
            return
        if reply is None:
            tally.statuses["closed"] += 1
            return
        tally.statuses[reply.status] += 1
        if reply.status >= 500:
            tally.five_hundreds.append((reply.status, raw[:300], reply.text()[:300]))
    finally:
        writer.close()


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_fuzz_never_answers_5xx(cluster: Cluster, server: str) -> None:
    srv = cluster.of(server)
    rng = random.Random(f"bad-input:{server}")
    cases = [fuzz_case(rng) for _ in range(FUZZ_CASES)]
    tally = FuzzTally()

    async def go() -> None:
        gate = asyncio.Semaphore(8)

        async def one(raw: bytes, complete: bool) -> None:
            async with gate:
                await _fuzz_one(srv.port, raw, complete, tally)

        await asyncio.gather(*(one(raw, c) for raw, c in cases))

    run(go())
    print(f"{server} fuzz: {sorted(tally.statuses.items(), key=str)}")
    assert srv.proc.poll() is None, srv.stderr_text()[-3000:]
    assert run(exchange(srv.port, infer("em", em_body()))).status == 200
    assert not tally.five_hundreds, (
        f"{len(tally.five_hundreds)} answers >= 500, e.g. {tally.five_hundreds[:5]}"
    )
