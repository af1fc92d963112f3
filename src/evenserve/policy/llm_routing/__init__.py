"""LLM routing policies; importing this package registers every built-in one."""

from evenserve.policy.llm_routing import baselines, predicted  # noqa: F401  (registers)
from evenserve.policy.llm_routing.base import (
    LLM_ROUTING,
    EngineSample,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
    LlmRoutingPolicy,
)
from evenserve.policy.llm_routing.prefix_index import PrefixIndex
from evenserve.policy.llm_routing.router import LlmRouter

__all__ = [
    "LLM_ROUTING",
    "EngineSample",
    "EngineView",
    "LlmDecision",
    "LlmRequestInfo",
    "LlmRouter",
    "LlmRoutingPolicy",
    "PrefixIndex",
]
