"""A model-control load's config override (Triton's ``parameters.config``): read from the
request (a JSON string or an object of model.yaml fields, over HTTP and gRPC alike), and the
files it names checked to be in the model folder before anything loads, and a field that
would have no effect on what this worker serves refused (400 naming it) rather than answered
200 with the field silently ignored."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.validation import non_finite_field
from evenserve.runtime.factory import RUNTIME_PARAMS
from evenserve.worker import triton_config
from evenserve.worker.kserve import ProtocolError
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import MODEL_FILE, VARIANT_FILE, ModelEntry


def load_override(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """A load request's config override: ``parameters.config``, a JSON string (Triton's
    shape) or an object, of model.yaml fields; None when not given. ProtocolError naming the
    field when malformed."""
    if body is None:
        return None
    params = body.get("parameters")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ProtocolError("parameters: expected a JSON object")
    unknown = sorted(k for k in params if k != "config")
    if unknown:
        raise ProtocolError(
            f"parameters.{unknown[0]}: not supported (only parameters.config: model.yaml "
            "fields as JSON)"
        )
    return config_override(params.get("config"), "parameters.config")


def config_override(config: Any, where: str) -> dict[str, Any] | None:
    """The override a load's ``config`` parameter holds (a JSON string or an object)."""
    if config is None:
        return None
    if isinstance(config, str):
        try:
            config = wire.parse_json(config.encode(), where)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
    if not isinstance(config, dict):
        raise ProtocolError(f"{where}: expected a JSON object of model.yaml fields")
    bad = non_finite_field(config, where)
    if bad is not None:  # 1e400 reads as inf: no field means it, and JSON cannot show it
        raise ProtocolError(f"{bad[0]}: {bad[1]} is not a finite number")
    return config


#: The model.yaml fields that name a file (or, the last, a folder) in the model folder.
OVERRIDE_PATHS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("profile",), False),
    (("emulated", "profile"), False),
    (("torch", "file"), False),
    (("onnx", "file"), False),
    (("transformers", "pretrained_dir"), True),
)


def check_override_paths(directory: Path, override: Mapping[str, Any], where: str) -> None:
    """The files a load's config override names (``OVERRIDE_PATHS``) must be in the model
    folder and exist: ConfigError naming the field (``{where}.emulated.profile``) otherwise,
    with the path as the client gave it (never the repository's). A Triton folder's
    override (Triton's config JSON) names none."""
    if triton_config.is_triton_folder(directory, MODEL_FILE):
        return
    inside = directory.resolve()
    for keys, folder in OVERRIDE_PATHS:
        value: Any = override
        for k in keys:
            value = value.get(k) if isinstance(value, Mapping) else None
        if not isinstance(value, str) or not value:
            continue  # absent, or the wrong type: the validation names it
        field_name = f"{where}.{'.'.join(keys)}"
        path = Path(value)
        if path.is_absolute() or not (directory / path).resolve().is_relative_to(inside):
            raise ConfigError(f"{field_name}: {value!r} is not a path inside the model folder")
        full = directory / path
        if not (full.is_dir() if folder else full.is_file()):
            kind = "folder" if folder else "file"
            raise ConfigError(
                f"{field_name}: no {kind} {value!r} in the model folder {directory.name!r}"
            )


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
