"""The memory account: weights being loaded count as used from the start of their load, and
what a load may still take leaves out the batches' working memory."""

from __future__ import annotations

from evenserve.sched.memory import MemoryAccount


def test_loading_weights_count_as_used_and_reduce_what_a_load_may_take() -> None:
    m = MemoryAccount(weights_bytes=100.0, total_bytes=1000.0)
    m.batches_bytes = 50.0
    assert m.used_total() == (150.0, 1000.0) and m.unreserved_bytes() == 900.0
    m.loading_bytes = 300.0
    assert m.used_total() == (450.0, 1000.0)
    assert m.free_bytes() == 550.0 and m.unreserved_bytes() == 600.0


def test_a_measured_device_or_one_without_a_total_has_nothing_to_check() -> None:
    assert MemoryAccount(0.0, None).unreserved_bytes() is None
    m = MemoryAccount(0.0, 1000.0)
    m.measured = (10.0, 1000.0)
    assert m.unreserved_bytes() is None
