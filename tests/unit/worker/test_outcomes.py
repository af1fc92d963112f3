"""The outcome table both worker fronts answer from (``core.wire``): every refusal's HTTP
status, gRPC code and outcome label, and what each front makes of a refused answer."""

from __future__ import annotations

import json

import pytest

from evenserve.core import wire
from evenserve.worker.dataplane import Answer
from evenserve.worker.http_api import _failure as http_failure

grpc = pytest.importorskip("grpc")

from evenserve.worker.grpc_api import _failure as grpc_failure  # noqa: E402

#: What the fronts answered for each refusal before they shared the table.
REFUSALS = {
    wire.QUEUE_FULL: (429, "RESOURCE_EXHAUSTED", "rejected_queue_full"),
    wire.SHED: (429, "RESOURCE_EXHAUSTED", "shed"),
    wire.DEADLINE_INFEASIBLE: (504, "DEADLINE_EXCEEDED", "deadline_infeasible"),
    wire.DEADLINE_EXPIRED: (504, "DEADLINE_EXCEEDED", "deadline_expired"),
    wire.LOAD_TIMEOUT: (503, "UNAVAILABLE", "unavailable"),
}


def test_every_refusal_has_its_status_code_and_label() -> None:
    assert set(wire.REFUSAL_OUTCOMES) == set(wire.REFUSAL_REASONS) == set(REFUSALS)
    for reason, (status, code, label) in REFUSALS.items():
        o = wire.REFUSAL_OUTCOMES[reason]
        assert (o.http_status, o.grpc_code, o.label) == (status, code, label)
        assert wire.REFUSAL_STATUS[reason] == status


def test_every_outcome_names_a_grpc_status_code() -> None:
    outcomes = [
        wire.ANSWERED,
        wire.BAD_REQUEST,
        wire.TOO_LARGE,
        wire.UNSUPPORTED_ENCODING,
        wire.MODEL_NOT_FOUND,
        wire.UNAVAILABLE,
        wire.FAILED,
        *wire.REFUSAL_OUTCOMES.values(),
        *wire.PROTOCOL_OUTCOMES.values(),
    ]
    for o in outcomes:
        assert grpc.StatusCode[o.grpc_code].name == o.grpc_code
    assert {s: o.label for s, o in wire.PROTOCOL_OUTCOMES.items()} == {
        400: "bad_request",
        413: "too_large",
        415: "bad_request",
    }


@pytest.mark.parametrize("reason", list(REFUSALS))
def test_both_fronts_answer_a_refusal_from_the_table(reason: str) -> None:
    status, code, _ = REFUSALS[reason]
    retry = 2.2 if status == 429 else None
    answer: Answer[object] = Answer(
        wire.REFUSAL_OUTCOMES[reason],
        message=f"{reason}: model 'm': why",
        reason=reason,
        retry_after_s=retry,
    )
    response = http_failure(answer)
    assert response.status == status
    headers = response.headers or {}
    assert headers[wire.REASON_HEADER] == reason
    assert headers.get("Retry-After") == (None if retry is None else "3")
    assert json.loads(response.body) == {"error": answer.message}
    err = grpc_failure(answer)
    assert err.code == grpc.StatusCode[code] and err.message == answer.message
    meta = dict(err.metadata)
    assert meta[wire.REASON_HEADER] == reason
    assert meta.get("retry-after") == (None if retry is None else "3")
