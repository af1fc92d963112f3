from __future__ import annotations

import math

from evenserve.experiment.herding import herding, window_shares

HOSTS = {"m": ["a", "b"], "solo": ["a"]}


def test_a_window_share_is_the_busiest_backend_over_its_fair_part() -> None:
    # window 0: a 3, b 1 (share 3 / 2); window 1: a 2, b 2 (1.0); window 2: too few sends.
    t = [0.01, 0.02, 0.03, 0.04, 0.11, 0.12, 0.13, 0.14, 0.21]
    b = ["a", "a", "a", "b", "a", "b", "a", "b", "a"]
    shares = window_shares(t, b, ["m"] * 9, HOSTS, window_s=0.1, min_sends=2)
    assert shares == [1.5, 1.0]
    h = herding(shares)
    assert h.windows == 2 and h.peak == 1.5 and h.mean == 1.25


def test_one_host_models_unanswered_and_warm_up_sends_are_left_out() -> None:
    t = [0.0, 0.01, 0.02, 0.45, 0.46]
    shares = window_shares(
        t,
        ["a", "a", "", "a", "b"],
        ["solo", "solo", "m", "m", "m"],
        HOSTS,
        since_s=0.4,
        min_sends=1,
    )
    assert shares == [1.0]
    assert math.isnan(herding([]).peak)
