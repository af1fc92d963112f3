"""KServe v2 inference protocol: request parsing and validation (the response's encoding is
``kserve_encode``).

Pure functions over bytes, so every bad-input case is unit-testable without a server. A
request is JSON, optionally followed by raw tensor bytes (the binary tensor data extension):
then the ``Inference-Header-Content-Length`` header gives the JSON's length and each binary
input carries ``parameters.binary_data_size``; binary inputs' bytes follow the JSON in the
order the inputs are listed. Tensors are row-major, little-endian.

Validation names the input: missing, unexpected, wrong datatype, wrong shape, data of the
wrong size or type. Every error is a ProtocolError with an HTTP status (400 here).

Request parameters understood: ``binary_data_output`` (bool), ``priority`` (an integer on
evenserve's scale, higher served first, or a class name: ``online`` = 10, ``offline`` = 0),
``deadline_ms`` (the request's deadline: it must finish within this many milliseconds of
arriving, or it is not run), ``timeout`` (microseconds, as tritonclient sends it: also a
deadline; with both, the earlier one holds). The same class and deadline may come as the
headers ``x-evenserve-priority`` and ``x-evenserve-deadline-ms`` (parameters win over
headers; ``request_class`` combines them). Other parameters are ignored, as Triton does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from evenserve.core import wire
from evenserve.core.errors import EvenserveError
from evenserve.runtime.base import Array, TensorSpec

HEADER_LENGTH = wire.HEADER_LENGTH_HEADER
T = TypeVar("T")
#: The numpy kinds of JSON data a datatype of each kind takes (an integer fits a float...).
JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
#: The largest tensor dimension a request may give.
MAX_DIMENSION = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")


class ProtocolError(EvenserveError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelSignature:
    """What the codec needs to know about a model."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int


@dataclass
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, Array]
    items: int
    outputs: list[RequestedOutput]
    priority: int | None = None
    #: The request must finish within this many seconds of arriving (None: none given).
    deadline_in_s: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_array(name: str, spec: TensorSpec, data: Any, shape: list[int]) -> Array:
    """Convert JSON ``data`` (flat or nested) to an array of ``shape`` and ``spec``'s dtype."""
    if not isinstance(data, list):
        raise ProtocolError(f"input {name!r}: data must be a list")
    try:
        raw = np.array(data)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"input {name!r}: data is not a regular array: {exc}") from None
    want = spec.dtype
    if raw.dtype.kind == "O" and want.kind in "iu" and all(map(_is_int, raw.flat)):
        # Integers numpy holds in no integer type: beyond 64 bits.
        raise ProtocolError(f"input {name!r}: a value is out of range for {spec.datatype}")
    if raw.size and raw.dtype.kind not in JSON_KINDS.get(want.kind, ""):
        raise ProtocolError(
            f"input {name!r}: data of type {raw.dtype} does not fit datatype {spec.datatype}"
        )
    expected = math.prod(shape)
    if raw.size != expected:
        raise ProtocolError(
            f"input {name!r}: data holds {raw.size} elements, shape {shape} needs {expected}"
        )
    if want.kind in "iu" and raw.size:
        info = np.iinfo(want)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            raise ProtocolError(f"input {name!r}: a value is out of range for {spec.datatype}")
    return raw.astype(want).reshape(shape)


def _check_shape(name: str, spec: TensorSpec, shape: Any, max_batch_size: int) -> list[int]:
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise ProtocolError(f"input {name!r}: shape must be a list of integers")
    want = list(spec.shape)
    if len(shape) != len(want) + 1:
        raise ProtocolError(
            f"input {name!r}: shape {wire.shown(shape)} has {len(shape)} dimensions, expected "
            f"{len(want) + 1} ([batch, {', '.join(str(d) for d in want)}])"
            if want
            else f"input {name!r}: shape {shape} must be [batch]"
        )
    if not 1 <= shape[0] <= max_batch_size:
        raise ProtocolError(
            f"input {name!r}: batch dimension {shape[0]} must be in 1..{max_batch_size} "
            "(max_batch_size)"
        )
    for i, (got, exp) in enumerate(zip(shape[1:], want, strict=True), start=1):
        if got > MAX_DIMENSION:
            raise ProtocolError(f"input {name!r}: dimension {i} of shape is over {MAX_DIMENSION}")
        if got < 1 or (exp != -1 and got != exp):
            raise ProtocolError(
                f"input {name!r}: shape {shape} does not match [-1, "
                f"{', '.join(str(d) for d in want)}] at dimension {i}"
            )
    return list(shape)


def input_spec(
    sig: ModelSignature, specs: Mapping[str, TensorSpec], name: str, seen: Mapping[str, object]
) -> TensorSpec:
    """The declared input ``name`` of a request (JSON or gRPC); ProtocolError naming it when
    the model has no such input or the request gives it twice (``seen``: inputs so far)."""
    spec = specs.get(name)
    if spec is None:
        raise ProtocolError(
            f"input {wire.shown(name)}: unexpected; model {sig.name!r} takes "
            f"{', '.join(repr(s.name) for s in sig.inputs)}"
        )
    if name in seen:
        raise ProtocolError(f"input {name!r}: given twice")
    return spec


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header's value (None when absent): decimal
    digits only; ProtocolError (400) naming the header otherwise."""
    if value is None:
        return None
    text = value.strip()
    if _DIGITS.fullmatch(text) is None:
        raise ProtocolError(f"{HEADER_LENGTH}: not a byte count: {wire.shown(value)}")
    return int(text)


def parse_infer_request(
    body: bytes, header_length: int | None, sig: ModelSignature
) -> InferRequest:
    """Parse and validate a v2 infer request for model ``sig``; ProtocolError on bad input.

    The JSON is read by ``wire.parse_json``: nesting over ``wire.MAX_JSON_DEPTH`` is refused
    before parsing (``body: JSON nested too deep``), an integer too long for any field is
    refused by the field that holds it.

    Integers stay exact without a scan of every valid body: the JSON is first read by orjson
    as it is (an integer beyond 64 bits may come back as a float). A float where an integer
    belongs fails validation, and only then, if the text holds such an integer
    (``wire.has_long_integer``), is it read again exactly and validated again; that second
    answer stands. Where a float is accepted (FP tensors, ``deadline_ms``) orjson's value
    is the one exact reading would give, and ignored fields are not read."""
    if header_length is not None:
        if header_length < 1 or header_length > len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH}: {header_length} is not within the body's {len(body)} bytes"
            )
        head, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        head, binary = body, memoryview(b"")
    try:
        return _validated(_decoded(head, exact=False), binary, sig)
    except ProtocolError:
        if not wire.has_long_integer(head):
            raise
    return _validated(_decoded(head, exact=True), binary, sig)


def _decoded(head: bytes, exact: bool) -> Any:
    try:
        return wire.parse_json(head, "body", exact_integers=exact)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def _validated(req: Any, binary: memoryview, sig: ModelSignature) -> InferRequest:
    """A decoded request body checked against ``sig`` (see ``parse_infer_request``)."""
    if not isinstance(req, dict):
        raise ProtocolError("request body must be a JSON object")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError("id: must be a string")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("parameters: must be an object")
    if params.get("sequence_id") not in (None, 0, ""):
        raise ProtocolError("parameters.sequence_id: sequence batching is not supported")
    raw_inputs = req.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("inputs: required, a non-empty list")
    specs = {s.name: s for s in sig.inputs}
    arrays: dict[str, Array] = {}
    offset = 0
    items: int | None = None
    for i, t in enumerate(raw_inputs):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ProtocolError(f"inputs[{i}]: must be an object with a name")
        name = t["name"]
        spec = input_spec(sig, specs, name, arrays)
        dt = t.get("datatype")
        if dt != spec.datatype:
            raise ProtocolError(
                f"input {name!r}: datatype {wire.shown(dt)}, model {sig.name!r} expects "
                f"{spec.datatype}"
            )
        shape = _check_shape(name, spec, t.get("shape"), sig.max_batch_size)
        if items is None:
            items = shape[0]
        elif shape[0] != items:
            raise ProtocolError(
                f"input {name!r}: batch dimension {shape[0]} differs from the other inputs' {items}"
            )
        tparams = t.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise ProtocolError(f"input {name!r}: parameters must be an object")
        size = tparams.get("binary_data_size")
        if size is not None:
            if "data" in t:
                raise ProtocolError(f"input {name!r}: both data and binary_data_size given")
            if not _is_int(size) or size < 0:
                raise ProtocolError(f"input {name!r}: binary_data_size must be an integer >= 0")
            expected = math.prod(shape) * spec.dtype.itemsize
            if size != expected:
                raise ProtocolError(
                    f"input {name!r}: binary_data_size {size} but shape {shape} of "
                    f"{spec.datatype} needs {expected} bytes"
                )
            if offset + size > len(binary):
                raise ProtocolError(
                    f"input {name!r}: binary data ends after {len(binary) - offset} of its "
                    f"{size} bytes (check {HEADER_LENGTH})"
                )
            arr = np.frombuffer(binary[offset : offset + size], dtype=spec.dtype.newbyteorder("<"))
            arrays[name] = arr.astype(spec.dtype, copy=False).reshape(shape)
            offset += size
        else:
            if "data" not in t:
                raise ProtocolError(f"input {name!r}: no data and no binary_data_size")
            arrays[name] = _json_array(name, spec, t["data"], shape)
    if offset != len(binary):
        raise ProtocolError(
            f"binary data: {len(binary) - offset} bytes beyond the declared inputs "
            f"(check {HEADER_LENGTH} and binary_data_size)"
        )
    missing = [s.name for s in sig.inputs if s.name not in arrays]
    if missing:
        raise ProtocolError(f"input {missing[0]!r}: missing (model {sig.name!r} needs it)")
    ordered = {s.name: arrays[s.name] for s in sig.inputs}

    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ProtocolError("parameters.binary_data_output: must be a boolean")
    out_names = [o.name for o in sig.outputs]
    requested: list[RequestedOutput] = []
    raw_outputs = req.get("outputs")
    if raw_outputs is None:
        requested = [RequestedOutput(n, binary_default) for n in out_names]
    else:
        if not isinstance(raw_outputs, list):
            raise ProtocolError("outputs: must be a list")
        for i, o in enumerate(raw_outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError(f"outputs[{i}]: must be an object with a name")
            if o["name"] not in out_names:
                raise ProtocolError(
                    f"output {wire.shown(o['name'])}: unknown; model {sig.name!r} gives "
                    f"{', '.join(repr(n) for n in out_names)}"
                )
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise ProtocolError(f"output {o['name']!r}: parameters must be an object")
            if op.get("classification"):
                raise ProtocolError(
                    f"output {o['name']!r}: the classification extension is not supported"
                )
            b = op.get("binary_data", binary_default)
            if not isinstance(b, bool):
                raise ProtocolError(f"output {o['name']!r}: binary_data must be a boolean")
            requested.append(RequestedOutput(o["name"], b))

    priority, deadline_in_s = class_parameters(params)
    assert items is not None
    return InferRequest(
        id=rid,
        inputs=ordered,
        items=items,
        outputs=requested,
        priority=priority,
        deadline_in_s=deadline_in_s,
        parameters=params,
    )


def class_parameters(params: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """(priority, deadline in seconds) from a request's ``priority``, ``timeout`` and
    ``deadline_ms`` parameters (None where absent); ProtocolError naming a bad one."""
    priority = _parsed(wire.parse_priority, params, "priority", "parameters.")
    timeout = params.get("timeout")
    deadline_in_s = None
    if timeout is not None:
        if not _is_int(timeout) or timeout < 0:
            raise ProtocolError("parameters.timeout: must be an integer of microseconds >= 0")
        deadline_in_s = timeout / 1e6 if timeout > 0 else None
    deadline_ms = _parsed(wire.parse_deadline_ms, params, "deadline_ms", "parameters.")
    if deadline_ms is not None:
        own = deadline_ms / 1000.0
        deadline_in_s = own if deadline_in_s is None else min(deadline_in_s, own)
    return priority, deadline_in_s


def check_shape(name: str, spec: TensorSpec, shape: Any, max_batch_size: int) -> list[int]:
    """An input's shape checked against the model's ([batch, *dims]); ProtocolError naming
    the input otherwise."""
    return _check_shape(name, spec, shape, max_batch_size)


def _parsed(
    parse: Callable[[Any, str], T], source: Mapping[str, Any], key: str, prefix: str = ""
) -> T:
    """``source[key]`` read by a ``core.wire`` parser; a bad one is a 400 naming it."""
    try:
        return parse(source.get(key), prefix + key)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def request_class(req: InferRequest, headers: Mapping[str, str]) -> tuple[int | None, float | None]:
    """(priority, deadline in seconds) of a parsed request: its parameters, else the
    ``x-evenserve-*`` headers; None where neither gives one (the model's default holds)."""
    priority = req.priority
    if priority is None:
        priority = _parsed(wire.parse_priority, headers, wire.PRIORITY_HEADER)
    deadline_in_s = req.deadline_in_s
    if "deadline_ms" not in req.parameters:
        header_ms = _parsed(wire.parse_deadline_ms, headers, wire.DEADLINE_HEADER)
        if header_ms is not None:
            header_s = header_ms / 1000.0
            deadline_in_s = header_s if deadline_in_s is None else min(deadline_in_s, header_s)
    return priority, deadline_in_s
