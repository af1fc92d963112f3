"""core.wire's readers of untrusted input: JSON bodies, classes and deadlines."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.core import wire
from evenserve.core.wire import (
    MAX_JSON_DEPTH,
    OversizedNumber,
    json_depth,
    parse_deadline_ms,
    parse_json,
    parse_priority,
)


# -- JSON bodies -------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 100_000])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_json_is_refused_before_parsing(opener: str, depth: int) -> None:
    with pytest.raises(ValueError, match=r"^body: JSON nested too deep \(over 64 levels\)$"):
        parse_json((opener * depth).encode())


def test_json_at_the_depth_limit_parses() -> None:
    doc = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json.dumps(parse_json(doc.encode()), separators=(",", ":")) == doc


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 1000, "t": 'q\\"[[[' * 100, "u": ["{" * 500]})
    assert json_depth(text.encode()) == 2
    assert parse_json(text.encode())["s"] == "[" * 1000


def test_utf16_bodies_are_scanned_after_recoding() -> None:
    assert parse_json(json.dumps({"a": [1]}).encode("utf-16")) == {"a": [1]}
    with pytest.raises(ValueError, match="nested too deep"):
        parse_json(("[" * 1000).encode("utf-16"))


@given(st.recursive(st.none() | st.integers() | st.text(), lambda c: st.lists(c, max_size=3)))
def test_depth_matches_the_document(doc: object) -> None:
    def depth(x: object) -> int:
        return 1 + max(map(depth, x), default=0) if isinstance(x, list) else 0

    assert json_depth(json.dumps(doc).encode()) == depth(doc)


def test_huge_integers_become_oversized_numbers() -> None:
    doc = parse_json(b'{"a": ' + b"9" * 5000 + b', "b": -' + b"1" * 41 + b', "c": 12}')
    assert isinstance(doc["a"], OversizedNumber) and doc["a"].digits == 5000
    assert isinstance(doc["b"], OversizedNumber) and doc["b"].digits == 41
    assert doc["c"] == 12 and repr(doc["a"]) == "<an integer of 5000 digits>"
    assert parse_json(b"[" + b"1" * 40 + b"]") == [int("1" * 40)]


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe\xfd", b"[1,]", b"nul", b"\x00" * 9])
def test_invalid_json_names_the_body(body: bytes) -> None:
    with pytest.raises(ValueError, match=r"^body: not valid JSON"):
        parse_json(body)


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_value_error(body: bytes) -> None:
    try:
        parse_json(body)
    except ValueError as exc:
        assert str(exc).startswith("body: ")


# -- classes and deadlines ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [10**400, -(10**400), 2**31, -(2**31) - 1, "9" * 400, "9" * 5000, OversizedNumber(401)],
)
def test_out_of_range_priorities_name_the_field(value: object) -> None:
    with pytest.raises(ValueError, match=r"^parameters\.priority: must be an integer") as err:
        parse_priority(value, "parameters.priority")
    assert len(str(err.value)) < 200  # the value is shown cut short


def test_priorities_in_range() -> None:
    assert parse_priority(2**31 - 1, "p") == 2**31 - 1
    assert parse_priority(str(-(2**31)), "p") == -(2**31)
    assert parse_priority(" online ", "p") == wire.ONLINE


@pytest.mark.parametrize(
    "value", [10**400, -(10**400), "1" * 5000, "1e400", float("inf"), OversizedNumber(5000)]
)
def test_deadlines_that_overflow_name_the_field(value: object) -> None:
    with pytest.raises(ValueError, match=r"^parameters\.deadline_ms: must be a number") as err:
        parse_deadline_ms(value, "parameters.deadline_ms")
    assert len(str(err.value)) < 200


def test_shown_cuts_long_values() -> None:
    assert wire.shown("ab") == "'ab'"
    assert wire.shown("x" * 1000).endswith("... (1002 characters)")
