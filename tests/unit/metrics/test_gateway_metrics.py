"""The gateway's metric labels are bounded by the cluster file, never by what clients send."""

from __future__ import annotations

from evenserve.metrics.gateway import GatewayMetrics, model_label
from evenserve.metrics.names import GATEWAY_REQUESTS, UNKNOWN_MODEL_LABEL

SERVED = ("resnet50", "bert-base")


def _metrics(models: bool = True) -> GatewayMetrics:
    return GatewayMetrics(lambda: iter(()), (lambda: SERVED) if models else None)


def _series(m: GatewayMetrics, name: str) -> list[str]:
    return [line for line in m.render().decode().splitlines() if line.startswith(name + "{")]


def test_model_label() -> None:
    assert model_label("resnet50", SERVED) == "resnet50"
    assert model_label("nope", SERVED) == UNKNOWN_MODEL_LABEL
    assert model_label("", SERVED) == UNKNOWN_MODEL_LABEL


def test_twenty_thousand_unknown_models_make_one_series() -> None:
    m = _metrics()
    size_before = len(m.render())
    for i in range(20_000):
        m.observe_request(None, f"model-{i}", "unknown_model", 0.001)
    m.observe_request("gpu0", "resnet50", "ok", 0.002)
    requests = _series(m, GATEWAY_REQUESTS + "_total")
    assert requests == [
        f'{GATEWAY_REQUESTS}_total{{backend="none",model="{UNKNOWN_MODEL_LABEL}",'
        'outcome="unknown_model"} 20000.0',
        f'{GATEWAY_REQUESTS}_total{{backend="gpu0",model="resnet50",outcome="ok"}} 1.0',
    ]
    assert len(m.render()) < size_before + 20_000  # two models' series, not 20,001
    assert "model-1" not in m.render().decode()


def test_the_outcome_alone_tells_an_unknown_model() -> None:
    m = _metrics(models=False)
    m.observe_request(None, "nope", "unknown_model", 0.001)
    m.observe_request("gpu0", "anything-served", "ok", 0.001)
    text = m.render().decode()
    assert f'model="{UNKNOWN_MODEL_LABEL}"' in text and 'model="nope"' not in text
    assert 'model="anything-served"' in text


def test_a_served_model_is_never_relabelled_whatever_the_outcome() -> None:
    m = _metrics()
    for outcome in ("ok", "client_error", "unavailable", "timeout", "overloaded"):
        m.observe_request("gpu0", "bert-base", outcome, 0.001)
    m.observe_request(None, "not-served", "unavailable", 0.001)  # known only by the list
    assert all('model="bert-base"' in s for s in _series(m, GATEWAY_REQUESTS + "_total")[:5])
    assert 'model="not-served"' not in m.render().decode()
