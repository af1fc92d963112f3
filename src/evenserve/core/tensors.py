"""KServe v2 tensor datatypes: the one table of wire names -> numpy dtypes.

BF16 and BYTES have no numpy dtype and are not accepted on the wire.

``CONTENTS_FIELD``: the typed ``contents`` field of a gRPC ``InferTensorContents`` that holds
each datatype (FP16 and BF16 have none: raw contents only), for both gRPC fronts (the
worker's, and the gateway's codec).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DATATYPES: Mapping[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}

#: The typed ``contents`` field of each datatype in KServe v2's gRPC messages (FP16 and BF16
#: have none: raw contents only; BYTES is ``bytes_contents``, which has no numpy dtype).
CONTENTS_FIELD: Mapping[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
#: Every typed contents field (a tensor's values are in one of them).
ALL_CONTENTS_FIELDS = (*sorted(set(CONTENTS_FIELD.values())), "bytes_contents")


def contents_error(contents: Any, field: str, datatype: str, shape: Sequence[int]) -> str | None:
    """Why a gRPC input's ``contents`` cannot be read as ``datatype`` of ``shape`` from its
    typed ``field`` (another field given, or not the shape's element count); None if it can.
    The worker's gRPC front and the gateway's codec both check inputs by it."""
    for other in ALL_CONTENTS_FIELDS:
        if other != field and len(getattr(contents, other)):
            return f"{other} given for datatype {datatype} (use {field})"
    n, expected = len(getattr(contents, field)), math.prod(shape)
    if n != expected:
        return f"contents hold {n} elements, shape {list(shape)} needs {expected}"
    return None
