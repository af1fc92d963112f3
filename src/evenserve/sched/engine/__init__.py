"""LLM engines on a device: KV blocks with a prefix cache, sequences and steps (sans I/O)."""

from evenserve.sched.engine.blocks import KvBlocks, prompt_hashes
from evenserve.sched.engine.engine import (
    MODES,
    TOO_LONG,
    Engine,
    EngineCounters,
    EngineSetup,
    GenSpec,
    Mode,
    Part,
    Seq,
    Step,
    TokenEvent,
)

__all__ = [
    "MODES",
    "TOO_LONG",
    "Engine",
    "EngineCounters",
    "EngineSetup",
    "GenSpec",
    "KvBlocks",
    "Mode",
    "Part",
    "Seq",
    "Step",
    "TokenEvent",
    "prompt_hashes",
]
