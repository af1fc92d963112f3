"""The gateway's gRPC front's pure rules: the deadline it forwards, what counts as refused."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")
pytest.importorskip("tritonclient.grpc")

from evenserve.gateway.grpc_front import deadline_ms, forward_metadata


@pytest.mark.parametrize(
    ("header", "remaining_s", "want"),
    [
        (None, None, None),  # no deadline at all
        ("250", None, "250"),  # the client's header alone
        (None, 1.5, "1500.000"),  # the gRPC deadline alone
        ("250", 1.5, "250"),  # the header is sooner
        ("5000", 1.5, "1500.000"),  # the gRPC deadline is sooner
        ("soon", 1.5, "soon"),  # not a number: the worker refuses it
        (None, 10.0 * 365 * 86400, None),  # grpcio's "no deadline"
        (None, -0.5, "0.001"),  # already past: the smallest deadline, refused downstream
    ],
)
def test_deadline_is_the_sooner_of_header_and_grpc_deadline(
    header: str | None, remaining_s: float | None, want: str | None
) -> None:
    assert deadline_ms(header, remaining_s) == want


def test_forward_metadata_keeps_the_class_and_adds_the_deadline() -> None:
    meta = {"x-evenserve-priority": "high", "other": "x"}
    assert forward_metadata(meta, 2.0) == (
        ("x-evenserve-priority", "high"),
        ("x-evenserve-deadline-ms", "2000.000"),
    )
    assert forward_metadata({}, None) == ()
