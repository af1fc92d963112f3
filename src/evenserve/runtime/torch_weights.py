"""A torch module's weights as the precision evidence reads them: bytes by dtype (dynamically
quantized Linear layers hold theirs packed, counted as qint8), how many layers dynamic INT8
quantization converted, and how much of the matmul and convolution weights it covers. torch
is passed in (imported by the runtime), so the core install never needs it."""

from __future__ import annotations

from typing import Any


def weight_bytes(torch: Any, module: Any) -> dict[str, float]:
    """Bytes of a module's parameters and buffers by dtype; dynamically quantized Linear
    layers hold their weights packed (not as parameters): counted as qint8."""
    out: dict[str, float] = {}

    def add(dtype: Any, n: float) -> None:
        key = str(dtype).removeprefix("torch.")
        out[key] = out.get(key, 0.0) + n

    for t in [*module.parameters(), *module.buffers()]:
        add(t.dtype, float(t.numel() * t.element_size()))
    linear = dynamic_linear_class(torch)
    if linear is not None:
        for m in module.modules():
            if isinstance(m, linear):
                w = m.weight()
                add(w.dtype, float(w.numel() * w.element_size()))
                b = m.bias()
                if b is not None:
                    add(b.dtype, float(b.numel() * b.element_size()))
    return out


def dynamic_linear_class(torch: Any) -> Any:
    """torch's dynamically quantized Linear class (None where this torch has none)."""
    dynamic = getattr(getattr(torch.ao.nn, "quantized", None), "dynamic", None)
    return getattr(dynamic, "Linear", None)


def dynamic_linears(torch: Any, module: Any) -> int:
    """How many of a module's layers are dynamically quantized Linear layers."""
    linear = dynamic_linear_class(torch)
    return 0 if linear is None else sum(isinstance(m, linear) for m in module.modules())


def matmul_weights(torch: Any, module: Any) -> tuple[int, int]:
    """(quantized, float) weight elements of a module's Linear and Conv layers."""
    nn = torch.nn
    dense_kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    linear = dynamic_linear_class(torch)
    quantized = dense = 0
    for m in module.modules():
        if linear is not None and isinstance(m, linear):
            quantized += int(m.weight().numel())
        elif isinstance(m, dense_kinds):
            dense += int(m.weight.numel())
    return quantized, dense
