"""Request bodies: random tensors built from a model's KServe v2 metadata, or a given file.

From metadata (``GET /v2/models/{model}``), each input becomes a random tensor of its declared
datatype and shape: a leading ``-1`` (the batch dimension) becomes 1, any other ``-1`` becomes
``var_dim`` (default 1). Two encodings (``encoding``):
- ``binary`` (the default): the binary tensor extension (a JSON header, then the raw
  little-endian bytes; ``Inference-Header-Content-Length`` gives the header's length), asking
  for binary outputs, so neither side spends its time formatting floats as text;
- ``json``: the whole request as JSON, each tensor's ``data`` a flat list of numbers written
  as tritonclient writes them with binary data off (and curl and requests users do): a
  ResNet-50 image [1, 3, 224, 224] FP32 is about 3 MB of text. Outputs come back as JSON.
A few different random bodies are made per model up front and sent in turn: the generator
spends no time on random numbers while it runs.

A payload file holds one KServe v2 JSON inference request (``{"inputs": [...]}``) and is sent
as is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.core.tensors import DATATYPES
from evenserve.core.wire import HEADER_LENGTH_HEADER

HEADER_LENGTH = HEADER_LENGTH_HEADER


#: Distinct random bodies made per model.
VARIANTS = 4


@dataclass
class Payload:
    """What to POST for one model: body variants and their headers."""

    model: str
    bodies: list[bytes]
    headers: dict[str, str]
    #: For a binary body: the JSON header (before per-request parameters are added).
    header_json: dict[str, Any] | None = None
    raw_tensors: list[bytes] = field(default_factory=list)
    #: For a JSON body made here: each body's members after ``{``, so that per-request
    #: parameters go in front of them without reading 3 MB of JSON again.
    json_members: list[bytes] = field(default_factory=list)
    _next: int = 0

    def body(self) -> bytes:
        b = self.bodies[self._next % len(self.bodies)]
        self._next += 1
        return b

    def with_parameters(self, params: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
        """A body that also carries request ``parameters`` (priority, timeout)."""
        i = self._next % len(self.bodies)
        self._next += 1
        if self.json_members:
            members = self.json_members[i]
            return b'{"parameters": ' + json.dumps(dict(params)).encode() + b", " + members, dict(
                self.headers
            )
        if self.header_json is None:
            obj = json.loads(self.bodies[i])
            obj["parameters"] = {**(obj.get("parameters") or {}), **params}
            return json.dumps(obj).encode(), dict(self.headers)
        head = dict(self.header_json)
        head["parameters"] = {**head.get("parameters", {}), **params}
        hj = json.dumps(head).encode()
        headers = dict(self.headers)
        headers[HEADER_LENGTH] = str(len(hj))
        return hj + self.raw_tensors[i], headers


def concrete_shape(shape: list[int], var_dim: int) -> list[int]:
    """Metadata shape -> the shape of one request: leading -1 -> 1, other -1 -> var_dim."""
    out = []
    for i, d in enumerate(shape):
        if d == -1:
            out.append(1 if i == 0 else var_dim)
        elif d < 0:
            raise ValueError(f"dimension {d} is not -1 or >= 0")
        else:
            out.append(d)
    return out


def random_tensor(dtype: np.dtype[Any], shape: list[int], rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.random(size=shape, dtype=np.float64).astype(dtype)


#: The encodings a payload made from metadata may have (module docstring).
ENCODINGS = ("binary", "json")


def payload_from_metadata(
    model: str,
    metadata: Mapping[str, Any],
    *,
    var_dim: int = 1,
    seed: int = 0,
    encoding: str = "binary",
) -> Payload:
    """Bodies with random inputs of the shapes/dtypes ``metadata`` declares, binary-extension
    or JSON (``encoding``, see the module docstring)."""
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding: {encoding!r} is not one of {', '.join(ENCODINGS)}")
    where = f"model {model!r} metadata"
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ConfigError(f"{where}: no inputs declared (give a payload file with --payload)")
    rng = np.random.default_rng(seed)
    specs = []
    for k, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise ConfigError(f"{where}: inputs[{k}]: expected an object")
        name, dt, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: inputs[{k}].name: missing")
        if not isinstance(dt, str) or dt.upper() not in DATATYPES:
            raise ConfigError(
                f"{where}: inputs[{k}].datatype: {dt!r} cannot be made up at random "
                "(give a payload file with --payload)"
            )
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise ConfigError(f"{where}: inputs[{k}].shape: expected a list of integers")
        try:
            dims = concrete_shape(shape, var_dim)
        except ValueError as exc:
            raise ConfigError(f"{where}: inputs[{k}].shape: {exc}") from None
        specs.append((name, dt.upper(), dims))
    if encoding == "json":
        return _json_payload(model, specs, rng)
    header_inputs = []
    for name, dt, dims in specs:
        nbytes = int(np.prod(dims, dtype=np.int64)) * DATATYPES[dt].itemsize
        header_inputs.append(
            {
                "name": name,
                "shape": dims,
                "datatype": dt,
                "parameters": {"binary_data_size": nbytes},
            }
        )
    head: dict[str, Any] = {"inputs": header_inputs, "parameters": {"binary_data_output": True}}
    hj = json.dumps(head).encode()
    raws = []
    for _ in range(VARIANTS):
        raw = b"".join(
            random_tensor(DATATYPES[dt].newbyteorder("<"), dims, rng).tobytes()
            for _, dt, dims in specs
        )
        raws.append(raw)
    return Payload(
        model=model,
        bodies=[hj + r for r in raws],
        headers={"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(hj))},
        header_json=head,
        raw_tensors=raws,
    )


def _json_payload(
    model: str, specs: list[tuple[str, str, list[int]]], rng: np.random.Generator
) -> Payload:
    """JSON bodies: each tensor's data a flat list (tritonclient's shape with binary off)."""
    members = []
    for _ in range(VARIANTS):
        inputs = [
            {
                "name": name,
                "shape": dims,
                "datatype": dt,
                "data": random_tensor(DATATYPES[dt], dims, rng).reshape(-1).tolist(),
            }
            for name, dt, dims in specs
        ]
        members.append(json.dumps({"inputs": inputs}).encode()[1:])
    return Payload(
        model=model,
        bodies=[b"{" + m for m in members],
        headers={"Content-Type": "application/json"},
        json_members=members,
    )


def payload_from_file(model: str, path: Path) -> Payload:
    """A KServe v2 JSON inference request read from ``path``, sent as is."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"--payload {model}={path}: file not found") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--payload {model}={path}: not valid JSON: {exc.msg}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("inputs"), list):
        raise ConfigError(
            f"--payload {model}={path}: expected a KServe v2 request object with 'inputs'"
        )
    return Payload(
        model=model,
        bodies=[json.dumps(obj).encode()],
        headers={"Content-Type": "application/json"},
    )
