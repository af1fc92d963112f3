"""What an unload calls to give memory back, on any platform."""

from __future__ import annotations

import sys

import pytest

from evenserve.runtime.torch_common import release_cuda_cache
from evenserve.worker.models.loading import trim_memory
from evenserve.worker.models.registry import ModelState


def test_trim_memory_is_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(trim_memory(), bool)  # glibc: malloc_trim ran; elsewhere False
    monkeypatch.setattr(sys, "platform", "darwin")
    assert trim_memory() is False


def test_no_cuda_cache_to_release_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert release_cuda_cache() is False


def test_a_states_json_omits_what_does_not_apply() -> None:
    assert ModelState("READY", version="1").json("m") == {
        "name": "m",
        "version": "1",
        "state": "READY",
    }
    assert ModelState("UNAVAILABLE", "not loaded").json("m") == {
        "name": "m",
        "state": "UNAVAILABLE",
        "reason": "not loaded",
    }
