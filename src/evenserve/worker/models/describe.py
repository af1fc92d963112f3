"""What a hosted model is said to be: its KServe v2 metadata and Triton's model config JSON
(a Triton repository's model answers with its own config, as Triton clients expect it)."""

from __future__ import annotations

import copy
import json
from typing import Any

from evenserve.policy.registry import spec_label
from evenserve.runtime.device import DeviceTarget
from evenserve.worker.models.registry import HostedModel


def model_config_json(model: HostedModel, device: DeviceTarget, instances: int) -> dict[str, Any]:
    """The model's configuration in the shape of Triton's model config JSON."""
    e = model.entry
    name = model.name
    spec = model.batching_spec
    policy = model.policy
    ours = {
        "evenserve_device": {"string_value": device.name},
        "evenserve_batching": {"string_value": spec_label(spec)},
        "evenserve_runtime": {"string_value": json.dumps(model.description, default=str)},
    }
    if e.notes:
        ours["evenserve_ignored"] = {"string_value": json.dumps(e.notes)}
    if e.triton_config is not None:
        # A Triton repository's model: its own config, as Triton clients expect it.
        triton = copy.deepcopy(e.triton_config)
        triton["name"] = name
        triton["parameters"] = {**triton.get("parameters", {}), **ours}
        return triton
    cfg: dict[str, Any] = {
        "name": name,
        "platform": f"evenserve_{e.config.runtime}",
        "backend": "evenserve",
        "max_batch_size": e.config.max_batch_size,
        **{
            kind: [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.shape} for t in ts]
            for kind, ts in (("input", e.config.inputs), ("output", e.config.outputs))
        },
        "instance_group": [
            {
                "name": name,
                "count": instances,
                "kind": "KIND_GPU" if device.kind == "cuda" else "KIND_CPU",
            }
        ],
        "version_policy": {"specific": {"versions": [e.config.version]}},
        "parameters": ours,
    }
    if policy.max_batch_size > 1:
        delay_ms = spec.get("max_batch_delay_ms", spec.get("max_wait_ms", 0)) or 0
        cfg["dynamic_batching"] = {
            "max_queue_delay_microseconds": int(float(delay_ms) * 1000),
            "preferred_batch_size": [policy.max_batch_size],
        }
    if e.config.slo_ms is not None:
        cfg["parameters"]["evenserve_slo_ms"] = {"string_value": str(e.config.slo_ms)}
    return cfg


def model_metadata_json(model: HostedModel) -> dict[str, Any]:
    """The model's metadata (KServe v2)."""
    e = model.entry
    name = model.name
    triton = e.triton_config or {}
    return {
        "name": name,
        "versions": [e.config.version],
        "platform": triton.get("platform") or f"evenserve_{e.config.runtime}",
        **{
            kind: [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in ts]
            for kind, ts in (("inputs", e.config.inputs), ("outputs", e.config.outputs))
        },
    }
