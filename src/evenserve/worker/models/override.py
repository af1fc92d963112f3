"""What a load's config override may not change on this worker.

A load request may carry model.yaml fields (KServe's ``parameters.config``); a field that
would have no effect on what the worker serves is refused (400 naming it) rather than
answered 200 with the field silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evenserve.runtime.factory import RUNTIME_PARAMS
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import VARIANT_FILE, ModelEntry

#: How a load request's config override is named in errors (KServe's ``parameters.config``).
OVERRIDE_WHERE = "parameters.config"


def ignored_override(
    entry: ModelEntry, override: Mapping[str, Any], options: WorkerOptions
) -> str | None:
    """Why a field of a load's config override would have no effect on what this worker
    serves (the field named, as ``parameters.config.emulated.profile``), else None: such
    a load is refused rather than answered 200 with the field silently ignored."""
    if entry.triton_config is not None:
        return None  # Triton's config JSON: what evenserve ignores is in its notes
    w = OVERRIDE_WHERE
    dev = options.device
    on_set = dev.kind == "emulated"
    runtime = entry.config.runtime
    if "optimize" in override:
        return f"{w}.optimize: has no effect on a load (evenserve optimize reads model.yaml)"
    if "batching" in override and options.batching_override is not None:
        return f"{w}.batching: has no effect: this worker's --batching batches every model"
    for key in ("runtime", "profile", *(k for k in RUNTIME_PARAMS if k != "emulated")):
        if key in override and override[key] != getattr(entry.config, key):
            return (
                f"{w}.{key}: has no effect: the folder's {VARIANT_FILE} (evenserve optimize) "
                "sets it; add use_variant: false to serve model.yaml's"
            )
    emulated = override.get("emulated")
    if emulated is not None:
        if not on_set and runtime != "emulated":
            return (
                f"{w}.emulated: has no effect: the model runs on runtime {runtime} on "
                f"device {dev.name}"
            )
        if on_set and "profile" in emulated:
            return (
                f"{w}.emulated.profile: has no effect on device {dev.name}: its profile set "
                "gives each model its profile (emulated.profile_name picks one)"
            )
        if not on_set and "profile_name" in emulated:
            return (
                f"{w}.emulated.profile_name: has no effect on device {dev.name}: it picks a "
                "profile of an emulated:PROFILE_SET device (here emulated.profile does)"
            )
    if on_set:
        for key in RUNTIME_PARAMS:
            if key != "emulated" and key in override:
                return (
                    f"{w}.{key}: has no effect on device {dev.name}: every model runs "
                    "emulated there"
                )
    return None
