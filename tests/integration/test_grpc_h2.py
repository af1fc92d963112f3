"""The project's own gRPC server (``httpio.grpc_h2``) on loopback: grpcio's clients
(grpc.aio, tritonclient.grpc) against it, messages of ResNet-50 size both ways, and what a
client that is not one sends (raw frames): a bad preface, an oversized header list, unknown
and not-served paths, a compressed message, PING, RST_STREAM and a client that goes away
mid-call, the cap on concurrent streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

from evenserve.httpio.grpc_h2 import frames as h2  # noqa: E402
from evenserve.httpio.grpc_h2.call import Call  # noqa: E402
from evenserve.httpio.grpc_h2.server import GrpcH2Server, Limits  # noqa: E402
from evenserve.httpio.grpc_service import unary_handlers  # noqa: E402

ECHO = "/test.Echo/Echo"
HOLD = "/test.Echo/Hold"
BIG = 3 * 224 * 224 * 4  # a ResNet-50 input, FP32


class Held:
    """The calls of ``HOLD``: each waits until released; cancelled ones counted."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.release = asyncio.Event()

    async def __call__(self, raw: bytearray, call: Call) -> bytes:
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return bytes(raw)


async def echo(raw: bytearray, call: Call) -> bytes:
    """The request back; metadata ``x-code`` aborts with that status, ``x-trailer`` is
    sent back as trailing metadata."""
    meta = dict(call.invocation_metadata())
    if "x-trailer" in meta:
        call.set_trailing_metadata((("x-trailer", meta["x-trailer"]),))
    if "x-code" in meta:
        await call.abort(int(meta["x-code"]), "refused: ünïcode % message")
    return bytes(raw)


@contextlib.asynccontextmanager
async def server(**limits: Any) -> AsyncIterator[tuple[GrpcH2Server, Held, int]]:
    held = Held()
    srv = GrpcH2Server(
        {ECHO: echo, HOLD: held},
        Limits(**{"max_message_bytes": 4 * 1024 * 1024, **limits}),
        {"/test.Echo/Stream": "streams are not served"},
    )
    port = await srv.start("127.0.0.1", 0)
    try:
        yield srv, held, port
    finally:
        held.release.set()
        await srv.stop(1.0)


async def test_grpc_aio_client_large_messages_both_ways_status_and_trailers() -> None:
    async with (
        server() as (_srv, _held, port),
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        ) as channel,
    ):
        call = channel.unary_unary(ECHO)
        payload = np.random.default_rng(0).bytes(BIG)
        for _ in range(3):  # windows are given back: more than one window's worth
            got = await call(payload, timeout=30)
            assert got == payload
        answers = await asyncio.gather(*(call(bytes([i]) * 1000, timeout=30) for i in range(40)))
        assert [a[:1] for a in answers] == [bytes([i]) for i in range(40)]
        ok = call(b"x", metadata=(("x-trailer", "t1"),), timeout=30)
        assert await ok == b"x"
        assert ("x-trailer", "t1") in tuple(await ok.trailing_metadata())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"x", metadata=(("x-code", "5"), ("x-trailer", "t2")), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "refused: ünïcode % message"
        assert ("x-trailer", "t2") in tuple(err.value.trailing_metadata())
        for path, code in (
            ("/no.Such/Method", grpc.StatusCode.UNIMPLEMENTED),
            ("/test.Echo/Stream", grpc.StatusCode.UNIMPLEMENTED),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary(path)(b"x", timeout=30)
            assert err.value.code() == code
        stream = channel.stream_stream("/test.Echo/Stream")()
        assert await stream.code() == grpc.StatusCode.UNIMPLEMENTED  # without ending its side
        assert "streams are not served" in (await stream.details() or "")


async def test_message_over_the_limit_and_metadata_over_the_limit() -> None:
    limits = {"max_message_bytes": 1000, "max_header_list_bytes": 2048}
    async with (
        server(**limits) as (_s, _h, port),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = channel.unary_unary(ECHO)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(bytes(BIG), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"x", metadata=(("x-big", "v" * 4000),), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await call(b"after", timeout=30) == b"after"


async def test_tritonclient_through_the_gateway_service_table() -> None:
    """tritonclient.grpc (the sync client users run) against the service as the gateway
    serves it: served RPCs answer, an unparsable request is INVALID_ARGUMENT, a not-served
    one UNIMPLEMENTED naming itself."""
    tc = pytest.importorskip("tritonclient.grpc")

    async def live(request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def infer(raw: bytearray, context: Any) -> bytes:
        req = service_pb2.ModelInferRequest.FromString(raw)
        resp = service_pb2.ModelInferResponse(model_name=req.model_name, id=req.id)
        resp.outputs.add(name="y", datatype="FP32", shape=list(req.inputs[0].shape))
        resp.raw_output_contents.append(req.raw_input_contents[0])
        return bytes(resp.SerializeToString())

    handlers, refused = unary_handlers({"ServerLive": live, "ModelInfer": infer}, ("ModelInfer",))
    srv = GrpcH2Server(handlers, Limits(), refused)
    port = await srv.start("127.0.0.1", 0)
    try:

        def use() -> None:
            client = tc.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                assert client.is_server_live()
                x = np.random.default_rng(1).random((1, 3, 224, 224), dtype=np.float32)
                inp = tc.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                got = client.infer("m", [inp], request_id="r1")
                assert got.get_response().id == "r1"
                np.testing.assert_array_equal(got.as_numpy("y"), x)
                with pytest.raises(tc.InferenceServerException) as err:
                    client.get_inference_statistics("m")
                assert err.value.status() == "StatusCode.UNIMPLEMENTED"
                assert "is not implemented by this server" in err.value.message()
            finally:
                client.close()

        await asyncio.to_thread(use)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(
                    b"\xff\xff\xff", timeout=30
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await srv.stop(1.0)


# -- a raw client -----------------------------------------------------------------------------
class Raw:
    """HTTP/2 frames over a plain connection: what a client other than grpcio may send."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def open(cls, port: int, preface: bytes = h2.PREFACE) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        writer.write(preface)
        return raw

    def send(self, ftype: int, flags: int, sid: int, payload: bytes = b"") -> None:
        self.writer.write(h2.frame_head(len(payload), ftype, flags, sid) + payload)

    def headers(self, sid: int, path: str = ECHO, end: bool = False, **extra: str) -> None:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "x"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra.items(),
        ]
        block = self.encoder.encode(fields)
        self.send(h2.HEADERS, h2.END_HEADERS | (h2.END_STREAM if end else 0), sid, block)

    def message(self, sid: int, body: bytes, compressed: int = 0) -> None:
        data = bytes((compressed,)) + len(body).to_bytes(4, "big") + body
        self.send(h2.DATA, h2.END_STREAM, sid, data)

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(9), 10)
        length = int.from_bytes(head[:3], "big")
        payload = await asyncio.wait_for(self.reader.readexactly(length), 10)
        return head[3], head[4], int.from_bytes(head[5:9], "big"), payload

    async def until(self, ftype: int, sid: int | None = None) -> tuple[int, bytes]:
        """The next frame of ``ftype`` (on ``sid``): its flags and payload; header blocks
        on the way decoded (the decoder keeps step)."""
        while True:
            kind, flags, got_sid, payload = await self.frame()
            if kind == h2.HEADERS:
                fields = dict(self.decoder.decode(payload))
                if ftype == h2.HEADERS and (sid is None or got_sid == sid):
                    return flags, repr(fields).encode()
                continue
            if kind == ftype and (sid is None or got_sid == sid):
                return flags, payload

    async def status(self, sid: int) -> dict[str, str]:
        """The trailers (or trailers-only answer) of stream ``sid``."""
        while True:
            kind, flags, got_sid, payload = await self.frame()
            if kind == h2.HEADERS:
                fields = dict(self.decoder.decode(payload))
                if got_sid == sid and flags & h2.END_STREAM:
                    return fields

    async def closed(self) -> bool:
        try:
            while await asyncio.wait_for(self.reader.read(65536), 10):
                pass
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


async def test_garbage_preface_is_refused_with_goaway() -> None:
    async with server() as (_srv, _held, port):
        raw = await Raw.open(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _flags, payload = await raw.until(h2.GOAWAY)
        assert int.from_bytes(payload[4:8], "big") == h2.PROTOCOL_ERROR
        assert await raw.closed()
        raw.close()


async def test_raw_frames_ping_status_bad_requests_and_limits() -> None:
    async with server(max_concurrent_streams=2, max_header_list_bytes=1024) as (srv, held, port):
        raw = await Raw.open(port)
        raw.send(h2.SETTINGS, 0, 0)
        raw.send(h2.PING, 0, 0, b"12345678")
        flags, payload = await raw.until(h2.PING)
        assert flags & h2.ACK and payload == b"12345678"
        raw.headers(1)
        raw.message(1, b"hello")
        assert (await raw.status(1))["grpc-status"] == "0"
        raw.headers(3, path="/no.Such/Method", end=True)
        assert (await raw.status(3))["grpc-status"] == "12"  # UNIMPLEMENTED
        raw.headers(5)
        raw.message(5, b"zzz", compressed=1)
        assert (await raw.status(5))["grpc-status"] == "12"
        raw.headers(7)
        raw.send(h2.DATA, h2.END_STREAM, 7, b"\x00\x00\x00\x00\x09abc")  # cut short
        assert (await raw.status(7))["grpc-status"] == "13"  # INTERNAL
        raw.headers(9, **{"x-big": "v" * 1500})  # decoded list over the limit
        raw.message(9, b"x")
        assert (await raw.status(9))["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
        # Two held calls fill the cap; a third stream is refused, the connection lives on.
        for sid in (11, 13):
            raw.headers(sid, path=HOLD)
            raw.message(sid, b"h")
        raw.headers(15, path=HOLD)
        _flags, payload = await raw.until(h2.RST_STREAM, 15)
        assert int.from_bytes(payload, "big") == h2.REFUSED_STREAM
        # RST_STREAM cancels a held call; the slot is free again.
        raw.send(h2.RST_STREAM, 0, 11, h2.CANCEL.to_bytes(4, "big"))
        raw.headers(17)
        raw.message(17, b"again")
        assert (await raw.status(17))["grpc-status"] == "0"
        assert held.cancelled == 1
        # A client that goes away mid-call: its call is cancelled, nothing is kept.
        raw.close()
        for _ in range(200):
            if held.cancelled == 2 and not srv.connections:
                break
            await asyncio.sleep(0.01)
        assert held.cancelled == 2 and not srv.connections


@pytest.mark.parametrize(
    "frames, code",
    [
        ([(h2.DATA, 0, 0, b"x")], h2.PROTOCOL_ERROR),  # DATA on stream 0
        ([(h2.DATA, 0, 1, b"x")], h2.PROTOCOL_ERROR),  # DATA on a stream never opened
        ([(h2.PING, 0, 0, b"123")], h2.FRAME_SIZE_ERROR),
        ([(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00\x00\x00\x02")], h2.PROTOCOL_ERROR),
        ([(h2.CONTINUATION, h2.END_HEADERS, 1, b"")], h2.PROTOCOL_ERROR),
        ([(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff\xff")], h2.COMPRESSION_ERROR),
        ([(h2.WINDOW_UPDATE, 0, 0, (h2.MAX_WINDOW).to_bytes(4, "big"))], h2.FLOW_CONTROL_ERROR),
        ([(h2.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01")], h2.PROTOCOL_ERROR),  # frame 1 B
        ([(h2.DATA, 0, 1, bytes(20000))], h2.FRAME_SIZE_ERROR),  # over MAX_FRAME_SIZE
    ],
)
async def test_connection_errors_answer_goaway(
    frames: list[tuple[int, int, int, bytes]], code: int
) -> None:
    async with server(max_frame_bytes=16384) as (_srv, _held, port):
        raw = await Raw.open(port)
        for frame in frames:
            raw.send(*frame)
        _flags, payload = await raw.until(h2.GOAWAY)
        assert int.from_bytes(payload[4:8], "big") == code
        assert await raw.closed()
        raw.close()


async def test_window_is_honoured_for_a_large_answer() -> None:
    """A client that gives a small window gets the answer as its WINDOW_UPDATEs allow."""
    async with server() as (_srv, _held, port):
        raw = await Raw.open(port)
        window = h2.S_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + (1000).to_bytes(4, "big")
        raw.send(h2.SETTINGS, 0, 0, window)
        body = bytes(range(256)) * 300  # 76.8 kB: over the connection's 65535 too
        raw.headers(1)
        raw.message(1, body)
        got = bytearray()
        while len(got) < len(body) + 5:
            kind, _flags, _sid, payload = await raw.frame()
            if kind == h2.HEADERS:
                raw.decoder.decode(payload)
            if kind != h2.DATA:
                continue
            assert len(payload) <= 1000
            got += payload
            raw.send(h2.WINDOW_UPDATE, 0, 1, len(payload).to_bytes(4, "big"))
            raw.send(h2.WINDOW_UPDATE, 0, 0, len(payload).to_bytes(4, "big"))
        assert bytes(got[5:]) == body
        assert (await raw.status(1))["grpc-status"] == "0"
        raw.close()
