"""The precision a graph will run at, read from the ONNX file: initializer dtypes (count and
elements), quantized operators, the INT8 share of the weights, and a verdict (``int8``,
``fp16``, ``bf16`` or ``fp32``). What the ``onnx`` runtime reports at load, and what
``evenserve optimize`` checks a quantized variant by. onnx is imported inside the function."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.runtime.base import require

#: Operators that only a quantized graph holds.
QUANTIZED_OPS = frozenset(
    {
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearConcat",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QAttention",
        "QGemm",
        "MatMulIntegerToFloat",
        "MatMulNBits",
        "QOrderedMatMul",
    }
)
_FLOATS = ("float32", "float16", "bfloat16", "float64")
_INTS8 = ("int8", "uint8")


def graph_precision(path: Path) -> dict[str, Any]:
    """The precision a graph runs at, read from it: ``initializers`` (count per dtype),
    ``initializer_elements`` (elements per dtype), ``quantized_ops`` (count per quantized
    operator), ``quantized_weight_fraction`` (INT8 share of the weight elements) and the
    verdict ``precision``: ``int8`` when INT8 weights and quantized operators are present,
    ``fp16`` when the float weights are mostly float16, else ``fp32``."""
    onnx = require("onnx", "onnx")
    model = onnx.load(str(path), load_external_data=False)
    counts: Counter[str] = Counter()
    elements: Counter[str] = Counter()
    tensors = list(model.graph.initializer)
    tensors += [
        a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.t.dims
    ]
    for t in tensors:
        dtype = str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)))
        if t.data_type == onnx.TensorProto.BFLOAT16:
            dtype = "bfloat16"
        counts[dtype] += 1
        elements[dtype] += int(np.prod(t.dims)) if t.dims else 1
    ops: Counter[str] = Counter(n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS)
    int8 = sum(elements[d] for d in _INTS8)
    weights = int8 + sum(elements[d] for d in _FLOATS)
    if int8 and ops:
        verdict = "int8"
    elif elements["float16"] > elements["float32"]:
        verdict = "fp16"
    elif elements["bfloat16"] > elements["float32"]:
        verdict = "bf16"
    else:
        verdict = "fp32"
    return {
        "precision": verdict,
        "initializers": dict(sorted(counts.items())),
        "initializer_elements": dict(sorted(elements.items())),
        "quantized_ops": dict(sorted(ops.items())),
        "quantized_weight_fraction": round(int8 / weights, 4) if weights else 0.0,
    }
