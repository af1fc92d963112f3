"""Batch formation under closed-loop clients, decided on a FakeClock.

The shipped emulated BERT-base (``examples/models/emulated/bert-base``: fixed-window, at most 8
per batch, 5 ms window) on the published A10 TensorRT profile, driven by N closed-loop
clients with no think time: each sends its next request the moment its answer arrives. What
batches the driver forms is a decision, the same on any machine, so it is checked here
exactly. The batch sizes that real concurrent HTTP clients achieve against a live worker
depend on how much concurrency the machine sustains: that is a measurement, printed by
``bench/worker_batching.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.core.profile import load_profile
from evenserve.worker.batch import PendingRequest

from .fakes import Harness, make_driver

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "examples" / "models" / "emulated" / "bert-base"
PROFILE = load_profile(ROOT / "profiles" / "a10-trt-fp16" / "bert-base.yaml")
REQUESTS_PER_CLIENT = 12


def bert_driver() -> Harness:
    cfg: dict[str, Any] = yaml.safe_load((MODEL_DIR / "model.yaml").read_text())
    return make_driver(
        {"bert-base": cfg["batching"]},
        {"bert-base": PROFILE},
        max_batch_size=cfg["max_batch_size"],
    )


def closed_loop(h: Harness, clients: int, per_client: int) -> dict[int, list[Any]]:
    """Each client sends ``per_client`` requests one after another, the next one at the
    (fake) moment the previous answer arrives; returns every client's answers in order."""
    answers: dict[int, list[Any]] = {c: [] for c in range(clients)}
    sent = dict.fromkeys(range(clients), 0)
    waiting: dict[int, PendingRequest] = {}

    def send(c: int) -> None:
        waiting[c] = h.driver.submit("bert-base", (c, sent[c]))
        sent[c] += 1

    for c in range(clients):
        send(c)
    while waiting:
        t = h.timer.next_time()
        assert t < math.inf, f"stalled with {len(waiting)} requests unanswered"
        h.timer.advance_to(t)
        for c, r in list(waiting.items()):
            fut = r.future
            assert fut is not None
            if fut.done():
                answers[c].append(fut.result())
                del waiting[c]
                if sent[c] < per_client:
                    send(c)
    return answers


def check_answers(answers: dict[int, list[Any]], per_client: int) -> None:
    # Every request answered exactly once, with its own payload, in the order it was sent.
    assert answers == {c: [(c, k) for k in range(per_client)] for c in answers}


async def test_32_clients_keep_every_batch_full_and_the_device_busy() -> None:
    h = bert_driver()
    answers = closed_loop(h, 32, REQUESTS_PER_CLIENT)
    check_answers(answers, REQUESTS_PER_CLIENT)
    total = 32 * REQUESTS_PER_CLIENT
    # 32 waiting clients are 4 full batches: each batch goes at once at max_batch_size, and
    # the next one starts the moment the device frees up (its 8 are already queued).
    assert [n for _, _, n in h.rec.started] == [8] * (total // 8)
    full = PROFILE.latency_s(8)
    assert [t for t, _, _ in h.rec.started] == pytest.approx([k * full for k in range(total // 8)])
    assert h.rec.dropped == []
    assert h.driver.idle
    assert h.driver.sched.busy.total_s(h.clock.now()) == pytest.approx(total // 8 * full)


async def test_4_clients_wait_out_the_window_every_time() -> None:
    h = bert_driver()
    answers = closed_loop(h, 4, REQUESTS_PER_CLIENT)
    check_answers(answers, REQUESTS_PER_CLIENT)
    # Fewer clients than a full batch: all 4 requests wait the 5 ms window, go as one batch
    # of 4, and the clients' next requests start the next window when their answers arrive.
    window, run4 = 0.005, PROFILE.latency_s(4)
    assert [n for _, _, n in h.rec.started] == [4] * REQUESTS_PER_CLIENT
    assert [t for t, _, _ in h.rec.started] == pytest.approx(
        [window + k * (window + run4) for k in range(REQUESTS_PER_CLIENT)]
    )


@pytest.mark.parametrize("clients", [1, 3, 8, 12, 20, 32, 50])
async def test_any_number_of_clients_every_request_once_batches_within_bounds(
    clients: int,
) -> None:
    h = bert_driver()
    answers = closed_loop(h, clients, REQUESTS_PER_CLIENT)
    check_answers(answers, REQUESTS_PER_CLIENT)
    sizes = [n for _, _, n in h.rec.started]
    assert sum(sizes) == clients * REQUESTS_PER_CLIENT
    assert max(sizes) <= 8  # the model's batching max_batch_size
    assert [n for _, _, n in h.rec.finished] == sizes
    # A batch smaller than the clients allow only goes once its window has run out: with 8
    # or more clients, every batch but those at the tail (clients finishing) is full.
    if clients >= 8:
        steady = sizes[: (clients * REQUESTS_PER_CLIENT - clients) // 8]
        assert set(steady) == {8}, sizes
