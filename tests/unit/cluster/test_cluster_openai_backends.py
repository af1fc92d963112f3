"""The cluster file's ``kind: openai`` backends and ``gateway.llm_routing`` / ``gateway.llm``:
what a bare entry means, and every error naming its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core.errors import ConfigError

URL = "http://127.0.0.1:8200"


def parse(gateway: dict[str, Any] | None = None, **backend: Any) -> Any:
    raw: dict[str, Any] = {"backends": [{"name": "v0", "url": URL, **backend}]}
    if gateway is not None:
        raw["gateway"] = gateway
    return parse_cluster(raw, Path("."))


def test_a_bare_openai_entry_reads_its_metrics_through_the_llm_mapping() -> None:
    c = parse(kind="openai")
    b = c.config.backends[0]
    assert (b.kind, b.engine, b.signals.source, b.models) == ("openai", "auto", "llm", None)
    g = c.config.gateway
    assert g.llm_routing == "predicted-ttft"
    assert (g.llm.chars_per_token, g.llm.prefix_block_tokens) == (4.0, 16)


def test_openai_entry_options() -> None:
    b = parse(kind="openai", engine="sglang", signals={"interval_ms": 1000}).config.backends[0]
    assert (b.engine, b.signals.source, b.signals.interval_ms) == ("sglang", "llm", 1000)
    b = parse(kind="openai", signals={"source": "none"}).config.backends[0]
    assert b.signals.source == "none"
    assert parse().config.backends[0].kind == "kserve"


def test_llm_routing_takes_any_registered_policy_with_params() -> None:
    g = parse({"llm_routing": {"policy": "kv-load"}}, kind="openai").config.gateway
    assert g.llm_routing == {"policy": "kv-load"}
    g = parse(
        {"llm_routing": {"policy": "predicted-ttft", "refuse_over": 2.0}}, kind="openai"
    ).config.gateway
    assert g.llm_routing["refuse_over"] == 2.0


@pytest.mark.parametrize(
    ("gateway", "backend", "says"),
    [
        ({}, {"kind": "vllm"}, "backends.0.kind"),
        ({}, {"kind": "openai", "engine": "ollama"}, "backends.0.engine"),
        ({}, {"kind": "openai", "signals": {"source": "evenserve"}}, "signals.source"),
        ({}, {"kind": "openai", "signals": {"source": "prometheus"}}, "signals.source"),
        ({}, {"signals": {"source": "llm"}}, "signals.source: llm is for kind: openai"),
        ({}, {"engine": "vllm"}, "engine: only meaningful with kind: openai"),
        ({}, {"kv_tokens": 160000}, "kv_tokens: only meaningful with kind: openai"),
        ({}, {"kind": "openai", "kv_tokens": 0}, "backends.0.kv_tokens"),
        ({}, {"kind": "openai", "grpc_url": "127.0.0.1:9"}, "grpc_url"),
        ({"llm_routing": "fastest"}, {}, "gateway.llm_routing: unknown llm-routing policy"),
        (
            {"llm_routing": {"policy": "predicted-ttft", "refuse_over": -1}},
            {},
            "gateway.llm_routing.refuse_over",
        ),
        ({"llm_routing": {"refuse_over": 1}}, {}, "gateway.llm_routing.policy"),
        ({"llm": {"chars_per_token": 0}}, {}, "gateway.llm.chars_per_token"),
        ({"llm": {"prefix_block_tokens": 0}}, {}, "gateway.llm.prefix_block_tokens"),
        ({"llm": {"ttft_ms": -5}}, {}, "gateway.llm.ttft_ms"),
        ({"llm": {"chars": 4}}, {}, "gateway.llm.chars"),
    ],
)
def test_errors_name_the_field(gateway: dict[str, Any], backend: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(gateway, **backend)
    assert says in str(err.value)


def test_the_example_cluster_file() -> None:
    from evenserve.cluster.file import load_cluster

    c = load_cluster(Path(__file__).resolve().parents[3] / "examples" / "cluster-openai.yaml")
    assert [(b.name, b.kind, b.engine, b.signals.source) for b in c.config.backends] == [
        ("vllm0", "openai", "auto", "llm"),
        ("vllm1", "openai", "vllm", "llm"),
    ]
    assert c.config.gateway.llm_routing == "predicted-ttft"
