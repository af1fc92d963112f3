"""core.wire's readers of untrusted input: model routes, JSON bodies, classes and deadlines."""

from __future__ import annotations

import json
import string
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evenserve.core import wire
from evenserve.core.wire import (
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MODEL_SUFFIXES,
    ModelPath,
    OversizedNumber,
    is_safe_name,
    json_depth,
    parse_deadline_ms,
    parse_json,
    parse_priority,
    split_model_path,
)

NAME_ALPHABET = string.ascii_letters + string.digits + "_.-"
safe_names = st.text(NAME_ALPHABET, min_size=1, max_size=MAX_NAME_LENGTH).filter(
    lambda s: s not in (".", "..")
)
suffixes = st.sampled_from(MODEL_SUFFIXES)


# -- split_model_path --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/v2/models/em", ("em", None, "")),
        ("/v2/models/em/infer", ("em", None, "infer")),
        ("/v2/models/em/ready", ("em", None, "ready")),
        ("/v2/models/em/config", ("em", None, "config")),
        ("/v2/models/em/stats", ("em", None, "stats")),
        ("/v2/models/em/versions/1", ("em", "1", "")),
        ("/v2/models/em/versions/1/infer", ("em", "1", "infer")),
        ("/v2/models/bert-base/versions/v1.2_3/ready", ("bert-base", "v1.2_3", "ready")),
        ("/v2/models/em/infer?x=1", ("em", None, "infer")),
        ("/v2/models/%65m/infer", ("em", None, "infer")),  # decoded once: "e"
        ("/v2/models/versions/infer", ("versions", None, "infer")),  # a model named so
        ("/v2/models/stats", ("stats", None, "")),  # MODEL_STATS_PATH: matched before
        ("/v2/models/...", ("...", None, "")),  # three dots are a name, not a directory
    ],
)
def test_model_routes_split(path: str, want: tuple[str, str | None, str]) -> None:
    assert split_model_path(path) == ModelPath(*want)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/em/versions/../infer",
        "/v2/models/em/versions/./infer",
        "/v2/models/em/versions/%2e%2e/infer",
        "/v2/models/em/versions/%2E%2E/infer",
        "/v2/models/em/versions/.%2e/infer",
        "/v2/models/em/versions/%252e%252e/infer",  # double-encoded: "%2e%2e" after one decode
        "/v2/models/../infer",
        "/v2/models/%2e%2e/infer",
        "/v2/models/em%2F..%2Fx/infer",  # an encoded slash never makes a segment
        "/v2/models/em%2finfer",
        "/v2/models/em/versions/1%2F..%2F2/infer",
        "/v2/models/em/versions//infer",
        "/v2/models/em/versions",
        "/v2/models/em/versions/1/infer/more",
        "/v2/models/em/",
        "/v2/models/",
        "/v2/models//infer",
        "/v2/models/em/INFER",
        "/v2/models/em/%69nfer",  # the suffix is matched as sent
        "/v2/models/em/versions/1/bogus",
        "/v2/models/em/explain",
        "/v2/models/e m/infer",
        "/v2/models/e%20m/infer",
        "/v2/models/%ff/infer",  # not UTF-8
        "/v2/models/%c3%a9/infer",  # UTF-8, but no name character
        "/v2/models/em%00/infer",
        "/v2/models/" + "a" * (MAX_NAME_LENGTH + 1),
        "/v2/models/em/versions/" + "1" * (MAX_NAME_LENGTH + 1),
        "/v2/models/" + "%61" * (MAX_NAME_LENGTH + 1),
        "/v2/health/ready",
        "/v2/modelsx/em",
        "/v2/model/em/infer",
        "",
        "em/infer",
    ],
)
def test_unsafe_or_foreign_paths_are_none(path: str) -> None:
    assert split_model_path(path) is None


@given(safe_names, st.none() | safe_names, suffixes)
def test_canonical_paths_round_trip(model: str, version: str | None, suffix: str) -> None:
    mp = ModelPath(model, version, suffix)
    assert split_model_path(mp.path()) == mp


@given(safe_names, st.none() | safe_names, suffixes, st.data())
def test_percent_encoded_names_decode_once(
    model: str, version: str | None, suffix: str, data: st.DataObject
) -> None:
    def encode(name: str) -> str:
        mask = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
        return "".join(f"%{ord(c):02X}" if m else c for c, m in zip(name, mask, strict=True))

    path = "/v2/models/" + encode(model)
    if version is not None:
        path += "/versions/" + encode(version)
    if suffix:
        path += "/" + suffix
    assert split_model_path(path) == ModelPath(model, version, suffix)


@given(safe_names, suffixes, st.integers(min_value=0))
def test_a_double_encoded_character_is_never_decoded_twice(
    model: str, suffix: str, at: int
) -> None:
    i = at % len(model)
    twice = model[:i] + quote(f"%{ord(model[i]):02X}") + model[i + 1 :]
    assert split_model_path("/v2/models/" + twice + ("/" + suffix if suffix else "")) is None


@given(st.text(max_size=300))
def test_any_path_splits_into_safe_names_or_none(tail: str) -> None:
    for path in (tail, "/v2/models/" + tail):
        mp = split_model_path(path)
        if mp is None:
            continue
        assert is_safe_name(mp.model) and "/" not in mp.model
        assert mp.version is None or is_safe_name(mp.version)
        assert mp.suffix in MODEL_SUFFIXES
        assert mp.model not in (".", "..") and mp.version not in (".", "..")
        assert ".." not in mp.path().split("/")


@given(st.text(st.sampled_from("./%2eE5Cc"), max_size=12), suffixes)
def test_dot_segments_in_any_spelling_never_pass(version: str, suffix: str) -> None:
    mp = split_model_path(f"/v2/models/em/versions/{version}" + ("/" + suffix if suffix else ""))
    if mp is not None:
        assert mp.version not in (".", "..") and is_safe_name(mp.version or "")


def test_safe_names() -> None:
    assert is_safe_name("resnet50") and is_safe_name("a.b-c_D9") and is_safe_name("...")
    for bad in ("", ".", "..", "a/b", "a b", "é", "a%2e", "x" * (MAX_NAME_LENGTH + 1)):
        assert not is_safe_name(bad), bad


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


@given(
    st.recursive(
        st.none() | st.integers() | st.text(alphabet="[]{}ab ,:"),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text("xy[{", max_size=2), c),
    )
)
def test_the_vector_depth_scan_skips_brackets_in_strings(doc: object) -> None:
    """Strings without escapes (the vector scan): their brackets never count, and the figure
    is the one the regular-expression scan gives."""
    text = json.dumps(doc).encode()
    assert b"\\" not in text
    assert json_depth(text) == wire._json_depth_escaped(text)


def test_the_depth_scan_crosses_chunks() -> None:
    body = b'{"s": "' + b"[" * (wire._DEPTH_CHUNK + 5) + b'", "a": [[[1]]]}'
    assert json_depth(body) == 4 and parse_json(body)["a"] == [[[1]]]
    deep = b"[" * (wire._DEPTH_CHUNK + 3) + b"]" * (wire._DEPTH_CHUNK + 3)
    assert json_depth(deep) == wire._DEPTH_CHUNK + 3


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


@pytest.mark.parametrize(
    ("text", "long"),
    [
        (b"[12345678901234567890]", True),  # beyond 2**64 - 1 for orjson? 20 digits: asked
        (b"[-1234567890123456789]", True),
        (b"1234567890123456789", True),  # at the start of the text
        (b'{"a":1234567890123456789012}', True),
        (b'["x 12345678901234567890"]', True),  # errs towards True: a string after a space
        (b"[123456789012345678]", False),  # 18 digits: exact in orjson
        (b"[0.00020164294983260334]", False),  # a fraction of 20 digits is a float
        (b"[1.5E+1234567890123456789]", False),  # an exponent
        (b'["12345678901234567890"]', False),  # a string of digits
    ],
)
def test_long_integers_are_told_from_long_fractions(text: bytes, long: bool) -> None:
    assert wire.has_long_integer(text) is long


def test_long_integers_stay_exact_and_long_fractions_parse() -> None:
    assert parse_json(b"[123456789012345678901234, 0.00020164294983260334]") == [
        123456789012345678901234,
        0.00020164294983260334,
    ]
    assert parse_json(b"[18446744073709551616]", exact_integers=False) == [2.0**64]
