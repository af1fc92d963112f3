"""The worker's KServe v2 protobuf codec: a ``ModelInferRequest`` validated for a model as
the HTTP front validates a JSON one (``parse_grpc_request``), and its outputs encoded as a
``ModelInferResponse`` (``encode_grpc_response``): raw output contents, as Triton answers, or
typed contents when the request asks for them. Binary inputs are read without a copy
(``np.frombuffer`` over the message's bytes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from evenserve.core import wire
from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES, contents_error
from evenserve.runtime.base import Array
from evenserve.worker.kserve import (
    InferRequest,
    ModelSignature,
    ProtocolError,
    RequestedOutput,
    check_shape,
    class_parameters,
    input_spec,
)


def _parameter(p: Any) -> Any:
    """An ``InferParameter``'s value (None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _parameter(v) for k, v in params.items()}


def _typed_array(name: str, dt: str, contents: Any, shape: list[int]) -> Array:
    """An input's typed contents as an array of ``shape``; ProtocolError naming it."""
    field = CONTENTS_FIELD.get(dt)
    if field is None:
        raise ProtocolError(f"input {name!r}: {dt} has no typed contents; use raw_input_contents")
    why = contents_error(contents, field, dt, shape)
    if why is not None:
        raise ProtocolError(f"input {name!r}: {why}")
    values = getattr(contents, field)
    want = DATATYPES[dt]
    if want.kind in "iu" and want.itemsize < 4:
        raw = np.array(values, dtype=np.int64)
        info = np.iinfo(want)
        if raw.size and (int(raw.min()) < info.min or int(raw.max()) > info.max):
            raise ProtocolError(f"input {name!r}: a value is out of range for {dt}")
        return raw.astype(want).reshape(shape)
    return np.array(values, dtype=want).reshape(shape)


def parse_grpc_request(req: Any, sig: ModelSignature) -> tuple[InferRequest, bool]:
    """A ``ModelInferRequest`` validated for model ``sig`` as the HTTP path validates a JSON
    one, and whether to answer with raw contents; ProtocolError naming the field otherwise."""
    params = _parameters(req.parameters)
    if params.get("sequence_id") not in (None, 0, ""):
        raise ProtocolError("parameters.sequence_id: sequence batching is not supported")
    if not req.inputs:
        raise ProtocolError("inputs: required, a non-empty list")
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise ProtocolError(
            f"raw_input_contents: {len(raw)} given for {len(req.inputs)} inputs "
            "(raw contents are given for every input or for none)"
        )
    specs = {s.name: s for s in sig.inputs}
    arrays: dict[str, Array] = {}
    items: int | None = None
    for i, t in enumerate(req.inputs):
        name = t.name
        spec = input_spec(sig, specs, name, arrays)
        if t.datatype != spec.datatype:
            raise ProtocolError(
                f"input {name!r}: datatype {wire.shown(t.datatype)}, model {sig.name!r} expects "
                f"{spec.datatype}"
            )
        shape = check_shape(name, spec, list(t.shape), sig.max_batch_size)
        if items is None:
            items = shape[0]
        elif shape[0] != items:
            raise ProtocolError(
                f"input {name!r}: batch dimension {shape[0]} differs from the other inputs' {items}"
            )
        if raw:
            if t.HasField("contents"):
                raise ProtocolError(f"input {name!r}: both contents and raw_input_contents given")
            expected = math.prod(shape) * spec.dtype.itemsize
            if len(raw[i]) != expected:
                raise ProtocolError(
                    f"input {name!r}: raw_input_contents[{i}] holds {len(raw[i])} bytes but "
                    f"shape {shape} of {spec.datatype} needs {expected}"
                )
            arr = np.frombuffer(raw[i], dtype=spec.dtype.newbyteorder("<"))
            arrays[name] = arr.astype(spec.dtype, copy=False).reshape(shape)
        else:
            arrays[name] = _typed_array(name, spec.datatype, t.contents, shape)
    missing = [s.name for s in sig.inputs if s.name not in arrays]
    if missing:
        raise ProtocolError(f"input {missing[0]!r}: missing (model {sig.name!r} needs it)")

    binary_default = params.get("binary_data_output", True)
    if not isinstance(binary_default, bool):
        raise ProtocolError("parameters.binary_data_output: must be a boolean")
    out_names = [o.name for o in sig.outputs]
    requested: list[RequestedOutput] = []
    for o in req.outputs:
        if o.name not in out_names:
            raise ProtocolError(
                f"output {wire.shown(o.name)}: unknown; model {sig.name!r} gives "
                f"{', '.join(repr(n) for n in out_names)}"
            )
        op = _parameters(o.parameters)
        if op.get("classification"):
            raise ProtocolError(f"output {o.name!r}: the classification extension is not supported")
        b = op.get("binary_data", binary_default)
        if not isinstance(b, bool):
            raise ProtocolError(f"output {o.name!r}: binary_data must be a boolean")
        requested.append(RequestedOutput(o.name, b))
    if not requested:
        requested = [RequestedOutput(n, binary_default) for n in out_names]
    kinds = {r.binary for r in requested}
    if len(kinds) > 1:
        raise ProtocolError(
            "outputs: raw_output_contents are used for every output or for none "
            "(binary_data differs between outputs)"
        )
    priority, deadline_in_s = class_parameters(params)
    assert items is not None
    parsed = InferRequest(
        id=req.id or None,
        inputs={s.name: arrays[s.name] for s in sig.inputs},
        items=items,
        outputs=requested,
        priority=priority,
        deadline_in_s=deadline_in_s,
        parameters=params,
    )
    return parsed, kinds == {True}


def encode_grpc_response(
    sig: ModelSignature,
    request_id: str | None,
    outputs: Mapping[str, Array],
    requested: Sequence[RequestedOutput],
    raw: bool,
) -> Any:
    """A ``ModelInferResponse``: raw output contents, or typed ones."""
    specs = {s.name: s for s in sig.outputs}
    resp = service_pb2.ModelInferResponse(
        model_name=sig.name, model_version=sig.version, id=request_id or ""
    )
    for r in requested:
        arr = np.ascontiguousarray(outputs[r.name])
        dt = specs[r.name].datatype
        out = resp.outputs.add(name=r.name, datatype=dt, shape=list(arr.shape))
        if raw:
            resp.raw_output_contents.append(
                arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            )
        else:
            field = CONTENTS_FIELD.get(dt)
            if field is None:
                raise ProtocolError(
                    f"output {r.name!r}: {dt} has no typed contents; ask for raw contents"
                )
            getattr(out.contents, field).extend(arr.reshape(-1).tolist())
    return resp
