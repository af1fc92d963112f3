"""KServe v2 inference protocol: a response's encoding (its request is ``kserve``).

A successful response is JSON; the outputs asked for as binary data follow it as raw
little-endian bytes, in order (the binary tensor data extension: the
``Inference-Header-Content-Length`` header gives the JSON's length). An error is
``{"error": message}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from evenserve.runtime.base import Array
from evenserve.worker.kserve import HEADER_LENGTH, ModelSignature, RequestedOutput

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"


def encode_infer_response(
    sig: ModelSignature,
    request_id: str | None,
    outputs: Mapping[str, Array],
    requested: Sequence[RequestedOutput],
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a successful response (binary outputs after the JSON header)."""
    specs = {s.name: s for s in sig.outputs}
    meta: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for r in requested:
        arr = np.ascontiguousarray(outputs[r.name])
        entry: dict[str, Any] = {
            "name": r.name,
            "datatype": specs[r.name].datatype,
            "shape": list(arr.shape),
        }
        if r.binary:
            raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            flat = arr.reshape(-1)
            entry["data"] = flat if flat.dtype.kind in "biuf" else flat.tolist()
        meta.append(entry)
    head: dict[str, Any] = {"model_name": sig.name, "model_version": sig.version}
    if request_id is not None:
        head["id"] = request_id
    head["outputs"] = meta
    # orjson writes numeric arrays straight from their buffers (no Python list of floats).
    header = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, {"content-type": JSON_CONTENT_TYPE}
    return b"".join([header, *blobs]), {
        "content-type": BINARY_CONTENT_TYPE,
        HEADER_LENGTH: str(len(header)),
    }


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
