"""A model's batching setup: the batch-cap rule both drivers apply (the worker when it loads a
model or swaps its policy, the simulator when it sets a model up on a device).

The rule. A model may declare the largest batch it takes (``max_batch_size``: model.yaml's,
a scenario model's). A policy spec that has a ``max_batch_size`` parameter and does not set
it gets the model's; a policy whose batch size is over the model's is refused (ConfigError
naming ``where``). A model that declares none (a scenario model without one) leaves the
policy its own default and bounds nothing.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

from evenserve.core.errors import ConfigError
from evenserve.policy.batching import BATCHING, BatchingPolicy
from evenserve.policy.registry import split_spec


class Batching(NamedTuple):
    """A model's batching: the spec as it runs (the cap filled in) and its policy."""

    spec: Any
    policy: BatchingPolicy


def batching_setup(
    spec: Any, max_batch_size: int | None, where: str, rng: random.Random | None = None
) -> Batching:
    """``spec`` under a model whose largest batch is ``max_batch_size`` (None: no cap of
    its own); ``where`` names the spec in errors (``arms.a.batching``, ``m/model.yaml:
    batching``), ``rng`` seeds a randomized policy."""
    if max_batch_size is not None:
        name, raw = split_spec(spec, where)
        entry = BATCHING.entry(name, f"{where}.policy")
        if "max_batch_size" in entry.params_model.model_fields and "max_batch_size" not in raw:
            raw["max_batch_size"] = max_batch_size
        spec = {"policy": name, **raw}
    policy = BATCHING.build(spec, rng, where=where)
    if max_batch_size is not None and policy.max_batch_size > max_batch_size:
        raise ConfigError(
            f"{where}.max_batch_size: the policy's batch size ({policy.max_batch_size}) "
            f"exceeds the model's max_batch_size ({max_batch_size})"
        )
    return Batching(spec, policy)
