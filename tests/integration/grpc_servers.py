"""Which listener serves the gateway's gRPC port in a test module that imports ``grpc_server``
(an autouse fixture: each of its tests runs against both, ``h2`` and ``grpcio``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

#: The listener of the test running now (read when the test builds its cluster file).
SERVER = ["h2"]


@pytest.fixture(autouse=True, params=["h2", "grpcio"])
def grpc_server(request: pytest.FixtureRequest) -> Iterator[str]:
    SERVER[0] = request.param
    yield request.param
    SERVER[0] = "h2"
