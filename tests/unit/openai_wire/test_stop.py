"""Stop strings on streamed text: the same answer however the text is split into steps."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.worker.openai import StopMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    sent = [m.feed(p) for p in pieces]
    if not m.stopped:
        sent.append(m.flush())
    return sent, m.stopped


def test_no_stops_passes_text_through() -> None:
    assert run([], ["a", "", "b"]) == (["a", "", "b", ""], False)


def test_a_stop_within_one_step() -> None:
    assert run(["END"], ["abcENDdef"]) == (["abc"], True)


def test_a_stop_across_steps_is_held_then_cut() -> None:
    m = StopMatcher(["\n\n"])
    assert m.feed("one\n") == "one"
    assert m.feed("\ntwo") == ""
    assert m.stopped
    assert m.feed("more") == ""
    assert m.flush() == ""


def test_a_prefix_that_does_not_complete_is_released() -> None:
    m = StopMatcher(["abc"])
    assert m.feed("xab") == "x"
    assert m.feed("d") == "abd"
    assert m.feed("ab") == ""
    assert m.flush() == "ab"
    assert not m.stopped


def test_the_stop_that_ends_first_wins() -> None:
    assert run(["world", "lo"], ["hello world"]) == (["hel"], True)
    # "\naa" begins first, but "a" is complete first: streamed, nothing else is knowable
    assert run(["a", "\naa"], ["\naa"]) == (["\n"], True)
    assert run(["a", "\naa"], ["\na", "a"]) == (["\n", ""], True)
    # two that end together: the longer
    assert run(["b", "ab"], ["xab"]) == (["x"], True)


def test_the_longest_possible_prefix_is_held() -> None:
    m = StopMatcher(["aab"])
    assert m.feed("aa") == ""
    assert m.feed("a") == "a"
    assert m.feed("b") == ""
    assert m.stopped


def test_an_empty_stop_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopMatcher([""])


def expected(text: str, stops: list[str]) -> tuple[str, bool]:
    """The whole text's answer: cut where the stop string that ends first begins."""
    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return (text[: min(ends)[1]], True) if ends else (text, False)


@given(
    text=st.text(alphabet="ab\n", max_size=40),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_any_split_gives_the_whole_texts_answer(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)] or [""]
    sent, stopped = run(stops, pieces)
    assert ("".join(sent), stopped) == expected(text, stops)
