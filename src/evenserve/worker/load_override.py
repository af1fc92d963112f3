"""A model-control load's config override (Triton's ``parameters.config``): read from the
request (a JSON string or an object of model.yaml fields, over HTTP and gRPC alike), and the
files it names checked to be in the model folder before anything loads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.validation import non_finite_field
from evenserve.worker import triton_config
from evenserve.worker.kserve import ProtocolError
from evenserve.worker.repository import MODEL_FILE


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
