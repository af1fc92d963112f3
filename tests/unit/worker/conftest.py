"""Fixtures of the worker's unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from evenserve.worker.app import Worker


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Worker]:
    """The services ``evenserve worker`` would serve (the server is not run)."""
    out: list[Worker] = []

    class _Server:
        def run(self) -> None:
            return None

    def make_server(service: Worker, sock: Any, **kw: Any) -> _Server:
        out.append(service)
        sock.close()
        return _Server()

    monkeypatch.setattr("evenserve.worker.server.make_server", make_server)
    return out
