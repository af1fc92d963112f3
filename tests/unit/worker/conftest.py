"""Fixtures of the worker's unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from evenserve.worker.service import WorkerService


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[WorkerService]:
    """The services ``evenserve worker`` would serve (the server is not run)."""
    out: list[WorkerService] = []

    class _Server:
        def run(self) -> None:
            return None

    def make_server(service: WorkerService, sock: Any, **kw: Any) -> _Server:
        out.append(service)
        sock.close()
        return _Server()

    monkeypatch.setattr("evenserve.worker.server.make_server", make_server)
    return out
