"""The simulation freezes what existed before its event loop out of the cyclic collector's
sight while the loop runs, and thaws it after (``sim.cluster.setup_out_of_collectors_sight``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from evenserve.sim import cluster
from evenserve.sim.cluster import setup_out_of_collectors_sight, simulate
from evenserve.sim.loader import load_scenario
from tests.unit.sim.scenarios import toy_scenario, write_scenario


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    """Each test starts with nothing frozen, whatever ran before it in this process (a
    serving process's ``tune_gc`` freezes what it allocated at startup, and an in-process
    gateway or worker of another test does that here), and leaves it as it found it."""
    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    if was_frozen:
        gc.freeze()


def test_setup_is_frozen_during_the_run_and_thawed_after() -> None:
    assert gc.get_freeze_count() == 0
    with setup_out_of_collectors_sight():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_thawed_after_a_failing_run() -> None:
    try:
        with setup_out_of_collectors_sight():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_own_objects_is_left_frozen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Counted by the calls, not by gc.get_freeze_count(): a frozen object that something
    # else in the process frees meanwhile (a finished thread's, say) lowers the count.
    calls: list[str] = []
    gc.freeze()
    try:
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        with setup_out_of_collectors_sight():
            pass
        assert calls == []
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_the_simulation_runs_its_loop_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real = cluster.EventLoop.run

    def run(self: cluster.EventLoop, until_s: float) -> None:
        seen.append(gc.get_freeze_count())
        real(self, until_s)

    monkeypatch.setattr(cluster.EventLoop, "run", run)
    ld = load_scenario(write_scenario(tmp_path, toy_scenario(tmp_path)))
    rec = simulate(ld, next(iter(ld.scenario.arms)))
    assert len(seen) == 1 and seen[0] > 0  # frozen while the loop ran
    assert gc.get_freeze_count() == 0  # and thawed after
    assert rec.requests.model  # it did run
