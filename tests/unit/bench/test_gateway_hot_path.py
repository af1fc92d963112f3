"""bench/gateway_hot_path.py drives the gateway's real request path through stub transports:
every request it feeds is answered once, relayed as the backend's bytes."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.bench.bench_module import load


@pytest.mark.parametrize(("backends", "routing"), [(1, "queue-aware"), (4, "least-expected-work")])
def test_every_request_fed_is_answered(backends: int, routing: str) -> None:
    mod = load("gateway_hot_path")
    seconds = asyncio.run(mod.measure(50, 1, backends, routing))  # SystemExit if one is lost
    assert seconds > 0.0


def test_the_answer_relayed_is_the_backends() -> None:
    mod = load("gateway_hot_path")
    written: list[bytes] = []
    real = mod.StubTransport.write

    def spy(self: object, data: bytes) -> None:
        written.append(bytes(data))
        real(self, data)

    mp = pytest.MonkeyPatch()
    mp.setattr(mod.StubTransport, "write", spy)
    try:
        asyncio.run(mod.measure(1, 1, 1, "queue-aware"))
    finally:
        mp.undo()
    answers = [w for w in written if w.startswith(b"HTTP/1.1 200")]
    assert answers and all(w.endswith(mod.ANSWER_BODY) for w in answers)
    assert all(b"x-evenserve-backend: b0\r\n" in w for w in answers)
    forwarded = [w for w in written if w.startswith(b"POST /v2/models/zero/infer")]
    assert forwarded and all(w.endswith(mod.BODY) for w in forwarded)
