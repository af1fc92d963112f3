"""Loopback-only targets and the classification of failures."""

from __future__ import annotations

import pytest

from evenserve.loadgen.target import (
    BadResponseError,
    ConnectionLostError,
    ErrorTally,
    TargetError,
    check_url,
    classify_exception,
    classify_status,
    error_lines,
)


def test_loopback_only_unless_allowed() -> None:
    assert check_url("http://127.0.0.1:8000/", False) == "http://127.0.0.1:8000"
    assert check_url("http://localhost:8000", False) == "http://localhost:8000"
    assert check_url("http://[::1]:8000", False) == "http://[::1]:8000"
    with pytest.raises(TargetError, match="not a loopback address"):
        check_url("http://10.0.0.7:8000", False)
    assert check_url("http://10.0.0.7:8000", True) == "http://10.0.0.7:8000"
    with pytest.raises(TargetError, match="expected http://HOST:PORT"):
        check_url("127.0.0.1:8000", False)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(111, "refused"), "connection-refused"),
        (TimeoutError(), "timeout"),
        (ConnectionLostError("gone"), "connection-lost"),
        (ConnectionResetError(), "connection-lost"),
        (BadResponseError("x"), "bad-response"),
        (OSError(113, "no route"), "connect-error"),
        (RuntimeError("?"), "client-error"),
    ],
)
def test_classify_exception(exc: BaseException, kind: str) -> None:
    assert classify_exception(exc) == kind


def test_classify_status_and_summary_lines() -> None:
    assert classify_status(429) == "overloaded"
    assert classify_status(404) == "not-found"
    assert classify_status(500) == "http-500"
    tally = ErrorTally()
    for _ in range(3):
        tally.add("http-500", "m", '{"error": "boom"}')
    tally.add("connection-refused", "n", "refused")
    errors = tally.to_json()
    assert list(errors) == ["http-500", "connection-refused"]
    lines = error_lines(errors, total=8)
    assert lines[0].startswith("http-500: 3 of 8 requests (37.5 %; m 3)")
    assert "the server failed" in lines[0] and "boom" in lines[0]
    assert "nothing listens there" in lines[1]


def test_preflight_passes_a_cold_model_whose_body_is_given() -> None:
    """A placement gateway answers 503 for the metadata of a model not loaded yet: fine when
    its request body is given (no metadata needed), an error when it must be built."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from evenserve.loadgen.target import HEALTH_LIVE_PATH, preflight

    async def run(need: set[str]) -> dict[str, object]:
        async def live(_: web.Request) -> web.Response:
            return web.json_response({})

        async def hot(_: web.Request) -> web.Response:
            return web.json_response({"name": "hot"})

        async def cold(_: web.Request) -> web.Response:
            return web.json_response({"error": "not ready"}, status=503)

        app = web.Application()
        app.router.add_get(HEALTH_LIVE_PATH, live)
        app.router.add_get("/v2/models/hot", hot)
        app.router.add_get("/v2/models/cold", cold)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                return await preflight(session, f"http://127.0.0.1:{port}", ["hot", "cold"], need)
        finally:
            await runner.cleanup()

    assert asyncio.run(run({"hot"})) == {"hot": {"name": "hot"}}
    with pytest.raises(TargetError, match="cold answered 503"):
        asyncio.run(run({"hot", "cold"}))
