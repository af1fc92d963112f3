"""A Triton-style model folder: ``config.pbtxt`` + ``<version>/model.onnx`` or ``model.pt``.

``config.pbtxt`` is parsed with Triton's own schema (``tritonclient.grpc.model_config_pb2``,
the ``grpc`` extra) and mapped to the document ``model.yaml`` would hold; the repository
validates that as usual. What is mapped:

- ``name`` (default: the folder; must match it); ``platform`` / ``backend``:
  ``onnxruntime_onnx`` / ``onnxruntime`` → the onnx runtime, ``pytorch_libtorch`` /
  ``pytorch`` → the torch runtime (TorchScript); ``default_model_filename`` (``model.onnx``,
  ``model.pt``)
- ``max_batch_size`` (>= 1; 0, "no batching dimension", is refused: evenserve requests carry
  a leading batch dimension); ``input`` / ``output``: ``name``, ``data_type`` (``TYPE_FP32`` →
  FP32, ...), ``dims`` (-1 variable)
- ``dynamic_batching`` → fixed-window batching: ``max_queue_delay_microseconds`` →
  ``max_batch_delay_ms``; ``preferred_batch_size`` → the largest caps batches (evenserve has no
  preferred-size policy; the others are noted as ignored). No ``dynamic_batching`` → the
  ``none`` policy (one request per execution, Triton's default scheduler).
  ``default_priority_level`` of ``priority_levels`` → the model's class (level 1 → 10, online;
  the last level → 0, offline; levels between, evenly between). ``default_queue_policy``:
  ``default_timeout_microseconds`` with ``REJECT`` → ``deadline_ms``; ``max_queue_size`` →
  ``max_queue_size``.
- ``version_policy`` (``latest`` / ``all`` / ``specific``): one version is served, the highest
  the policy allows whose numeric folder holds the model file.

Everything else that is set is ignored with a note (``notes``), which the worker logs at
start and serves in the model's config JSON (``parameters.evenserve_ignored``). The model's
config JSON is the original Triton config (``triton_json``), so Triton clients see it as is.
A load-time ``override`` is Triton's model config JSON and replaces ``config.pbtxt`` entirely.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.tensors import DATATYPES

TRITON_FILE = "config.pbtxt"
GRPC_EXTRA = "pip install 'evenserve[grpc]'"

#: platform / backend → (our runtime, default model file name)
PLATFORMS: Mapping[str, tuple[str, str]] = {
    "onnxruntime_onnx": ("onnx", "model.onnx"),
    "pytorch_libtorch": ("torch", "model.pt"),
}
BACKENDS: Mapping[str, str] = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch"}

#: Top-level fields the mapping reads; any other field that is set is noted as ignored.
MAPPED = {
    "name",
    "platform",
    "backend",
    "default_model_filename",
    "max_batch_size",
    "input",
    "output",
    "dynamic_batching",
    "version_policy",
    "instance_group",
}
#: Why some ignored fields are ignored (the rest: "not supported by evenserve").
WHY: Mapping[str, str] = {
    "sequence_batching": "stateful sequence batching is not supported; requests are "
    "batched independently",
    "ensemble_scheduling": "ensembles are not supported",
    "model_warmup": "evenserve warms every runtime up with synthetic inputs of its own",
    "optimization": "execution accelerators and graph settings are not applied",
    "response_cache": "responses are not cached",
    "parameters": "backend parameters are not passed to the runtime",
}
_INT64 = {3, 4, 6, 16, 18}  # FieldDescriptor TYPE_INT64, UINT64, FIXED64, SFIXED64, SINT64


@dataclass
class TritonModel:
    """A config.pbtxt mapped: the model.yaml-shaped document and what was left out."""

    raw: dict[str, Any]
    notes: list[str]
    triton_json: dict[str, Any]
    source: Path
    version: str


def proto_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(model_config_pb2, text_format, json_format), or a ConfigError naming the extra."""
    try:
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise ConfigError(
            f"{TRITON_FILE} needs Triton's model config schema (tritonclient and protobuf); "
            f"install the optional extra: {GRPC_EXTRA} ({exc})"
        ) from None
    return model_config_pb2, text_format, json_format


def is_triton_folder(directory: Path, model_file: str) -> bool:
    """Whether ``directory`` is a Triton model folder (config.pbtxt and no ``model_file``);
    both present is an error naming both."""
    pbtxt = directory / TRITON_FILE
    if not pbtxt.is_file():
        return False
    if (directory / model_file).exists():
        raise ConfigError(
            f"{directory}: holds both {model_file} and {TRITON_FILE}; keep one "
            f"({directory / model_file}, {pbtxt})"
        )
    return True


def parse_pbtxt(path: Path) -> Any:
    """``path`` parsed as a Triton ModelConfig; errors name the file and the line."""
    pb2, text_format, _ = proto_modules()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    config = pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        message = str(exc)
        if line is not None:
            message = message.split(" : ", 1)[-1]
            raise ConfigError(f"{path}: line {line}, column {col}: {message}") from exc
        raise ConfigError(f"{path}: {message}") from exc
    return config


def parse_override(override: Mapping[str, Any], where: str) -> Any:
    """A Triton model config JSON (a load-time override) as a ModelConfig."""
    pb2, _, json_format = proto_modules()
    config = pb2.ModelConfig()
    try:
        json_format.ParseDict(dict(override), config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{where}: not a Triton model config: {exc}") from exc
    return config


def config_json(config: Any) -> dict[str, Any]:
    """The config as Triton's JSON (snake_case, enum names, 64-bit integers as numbers)."""
    _, _, json_format = proto_modules()
    out: dict[str, Any] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    _numbers(config, out)
    return out


def _numbers(message: Any, out: dict[str, Any]) -> None:
    """protobuf's JSON writes 64-bit integers as strings; Triton's writes numbers."""
    for fd, value in message.ListFields():
        key = fd.name
        if key not in out:
            continue
        if fd.type in _INT64:
            v = out[key]
            out[key] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif fd.message_type is not None:
            if fd.message_type.GetOptions().map_entry:
                vfd = fd.message_type.fields_by_name["value"]
                if vfd.message_type is not None:
                    for k, sub in value.items():
                        _numbers(sub, out[key][str(k)])
            elif isinstance(out[key], list):
                for sub, sub_out in zip(value, out[key], strict=True):
                    _numbers(sub, sub_out)
            else:
                _numbers(value, out[key])


def read_triton(directory: Path, override: Mapping[str, Any] | None = None) -> TritonModel:
    """``directory/config.pbtxt`` (or ``override``, which replaces it) mapped."""
    source = directory / TRITON_FILE
    if override is not None:
        return map_config(
            parse_override(override, f"{directory}: override"),
            directory,
            source,
            f"{directory}: override",
        )
    return map_config(parse_pbtxt(source), directory, source, str(source))


def map_config(config: Any, directory: Path, source: Path, where: str) -> TritonModel:
    """A parsed ModelConfig → the model.yaml document, the version served and the notes."""
    pb2, _, _ = proto_modules()
    notes: list[str] = []
    name = config.name or directory.name
    if name != directory.name:
        raise ConfigError(f"{where}: name: {name!r} differs from its folder {directory.name!r}")
    platform = _platform(config, where)
    runtime, default_file = PLATFORMS[platform]
    filename = config.default_model_filename or default_file
    if config.max_batch_size < 1:
        raise ConfigError(
            f"{where}: max_batch_size: {config.max_batch_size} (no batching dimension) is not "
            "supported: evenserve requests carry a leading batch dimension; set max_batch_size "
            ">= 1 and give dims without it"
        )
    version, folder = _version(config, directory, filename, where, notes)
    raw: dict[str, Any] = {
        "name": name,
        "version": version,
        "runtime": runtime,
        "max_batch_size": config.max_batch_size,
        "inputs": _tensors(config.input, "input", pb2, where, notes),
        "outputs": _tensors(config.output, "output", pb2, where, notes),
    }
    file = f"{folder}/{filename}"
    raw[runtime] = {"file": file, "format": "torchscript"} if runtime == "torch" else {"file": file}
    if config.HasField("dynamic_batching"):
        _dynamic_batching(config.dynamic_batching, config.max_batch_size, pb2, raw, where, notes)
    else:
        raw["batching"] = {"policy": "none"}
    for i, group in enumerate(config.instance_group):
        kind = pb2.ModelInstanceGroup.Kind.Name(group.kind)
        notes.append(
            f"instance_group[{i}]: count {group.count or 1}, {kind}: evenserve loads one copy "
            "per worker and device; how many batches run at once is the worker's --instances "
            "(per device, shared by its models)"
        )
    for fd, _value in config.ListFields():
        if fd.name not in MAPPED:
            why = WHY.get(fd.name, "not supported by evenserve")
            notes.append(f"{fd.name}: ignored ({why})")
    return TritonModel(raw, notes, config_json(config), source, version)


def _platform(config: Any, where: str) -> str:
    platform, backend = config.platform, config.backend
    known = ", ".join([*PLATFORMS, *BACKENDS])
    if backend and backend not in BACKENDS:
        raise ConfigError(f"{where}: backend: {backend!r} is not supported (supported: {known})")
    if platform and platform not in PLATFORMS:
        raise ConfigError(f"{where}: platform: {platform!r} is not supported (supported: {known})")
    if backend and platform and BACKENDS[backend] != platform:
        raise ConfigError(f"{where}: platform {platform!r} and backend {backend!r} disagree")
    if not (platform or backend):
        raise ConfigError(f"{where}: platform, backend: give one (supported: {known})")
    return platform or BACKENDS[backend]


def _tensors(
    tensors: Any, kind: str, pb2: ModuleType, where: str, notes: list[str]
) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tensors):
        at = f"{kind}[{i}]"
        if not t.name:
            raise ConfigError(f"{where}: {at}.name: required")
        type_name = pb2.DataType.Name(t.data_type)
        datatype = "BYTES" if type_name == "TYPE_STRING" else type_name.removeprefix("TYPE_")
        if datatype not in DATATYPES:
            raise ConfigError(
                f"{where}: {at}.data_type: {type_name} is not supported (supported: "
                f"{', '.join('TYPE_' + d for d in DATATYPES)})"
            )
        for d in t.dims:
            if d != -1 and d < 1:
                raise ConfigError(f"{where}: {at}.dims: {d}: must be -1 (variable) or >= 1")
        for fd, _value in t.ListFields():
            if fd.name not in ("name", "data_type", "dims"):
                notes.append(f"{at}.{fd.name}: ignored ({t.name!r}; not supported by evenserve)")
        out.append({"name": t.name, "datatype": datatype, "shape": [int(d) for d in t.dims]})
    if not out:
        raise ConfigError(f"{where}: {kind}: at least one {kind} is required")
    return out


def _dynamic_batching(
    db: Any, max_batch: int, pb2: ModuleType, raw: dict[str, Any], where: str, notes: list[str]
) -> None:
    spec: dict[str, Any] = {
        "policy": "fixed-window",
        "max_batch_delay_ms": db.max_queue_delay_microseconds / 1000.0,
    }
    preferred = sorted(set(db.preferred_batch_size))
    for p in preferred:
        if not 1 <= p <= max_batch:
            raise ConfigError(
                f"{where}: dynamic_batching.preferred_batch_size: {p} is outside "
                f"1..max_batch_size ({max_batch})"
            )
    if preferred:
        spec["max_batch_size"] = preferred[-1]
        if len(preferred) > 1:
            notes.append(
                f"dynamic_batching.preferred_batch_size: {preferred}: evenserve has no "
                f"preferred-size batching; the largest ({preferred[-1]}) caps batches, "
                f"{', '.join(map(str, preferred[:-1]))} ignored"
            )
    raw["batching"] = spec
    if db.priority_levels:
        levels, default = int(db.priority_levels), int(db.default_priority_level)
        if not 1 <= default <= levels:
            raise ConfigError(
                f"{where}: dynamic_batching.default_priority_level: {default} is outside "
                f"1..priority_levels ({levels})"
            )
        value = 10 if levels == 1 else round(10 * (levels - default) / (levels - 1))
        raw["priority"] = {10: "online", 0: "offline"}.get(value, value)
        notes.append(
            f"dynamic_batching.priority_levels: {levels}: the model's class is "
            f"{raw['priority']} (from default_priority_level {default}); a request's own "
            "priority follows evenserve's scale (higher is more urgent; online 10, offline 0), "
            "not Triton's (1 is the highest)"
        )
    if db.HasField("default_queue_policy"):
        _queue_policy(db.default_queue_policy, pb2, raw, notes)
    for fd, _value in db.ListFields():
        if fd.name in ("preserve_ordering", "priority_queue_policy"):
            notes.append(f"dynamic_batching.{fd.name}: ignored (not supported by evenserve)")


def _queue_policy(qp: Any, pb2: ModuleType, raw: dict[str, Any], notes: list[str]) -> None:
    at = "dynamic_batching.default_queue_policy"
    action = pb2.ModelQueuePolicy.TimeoutAction.Name(qp.timeout_action)
    if qp.default_timeout_microseconds:
        if action == "REJECT":
            raw["deadline_ms"] = qp.default_timeout_microseconds / 1000.0
        else:
            notes.append(
                f"{at}.default_timeout_microseconds: ignored (timeout_action {action}: "
                "evenserve refuses late requests, it does not delay them)"
            )
    if qp.max_queue_size:
        raw["max_queue_size"] = int(qp.max_queue_size)
    if not qp.allow_timeout_override and qp.default_timeout_microseconds:
        notes.append(
            f"{at}.allow_timeout_override: false is not enforced (evenserve honours a "
            "request's own deadline or timeout parameter)"
        )


def _version(
    config: Any, directory: Path, filename: str, where: str, notes: list[str]
) -> tuple[str, str]:
    """(version, its folder): the highest version the policy allows whose folder holds the
    model file (Triton reads a numeric folder name as an integer: ``01`` is version 1)."""
    folder_of = {
        int(p.name): p.name for p in sorted(directory.iterdir()) if p.is_dir() and p.name.isdigit()
    }
    folders = sorted(folder_of, reverse=True)
    with_file = [v for v in folders if (directory / folder_of[v] / filename).is_file()]
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if which == "all":
        allowed = folders
        label = "all"
    elif which == "specific":
        allowed = sorted({int(v) for v in policy.specific.versions}, reverse=True)
        label = f"specific {allowed}"
    else:
        n = max(1, policy.latest.num_versions) if which == "latest" else 1
        allowed = folders[:n]
        label = f"latest {n}"
    chosen = [v for v in allowed if v in with_file]
    if not chosen:
        raise ConfigError(
            f"{where}: version_policy ({label}): no version folder it allows holds {filename} "
            f"(version folders: {', '.join(map(str, sorted(folders))) or 'none'}; with "
            f"{filename}: {', '.join(map(str, sorted(with_file))) or 'none'})"
        )
    others = [v for v in allowed if v != chosen[0]]
    if others:
        notes.append(
            f"version_policy ({label}): evenserve serves one version, {chosen[0]}; "
            f"{', '.join(map(str, sorted(others)))} not served"
        )
    return str(chosen[0]), folder_of[chosen[0]]
