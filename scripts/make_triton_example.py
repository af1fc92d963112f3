"""Write the tiny ONNX model of examples/triton-repo (random weights, no download).

    python scripts/make_triton_example.py [REPO]   # default: examples/triton-repo

writes REPO/tiny_mlp/1/model.onnx: INPUT0 FP32 [batch, 16] → OUTPUT0 FP32 [batch, 4], a
16-32-4 MLP with ReLU. Needs the ``onnx`` package (``pip install 'evenserve[onnx]'``). The
model file is not committed; run this once, then serve the repository:

    evenserve worker --repo examples/triton-repo --device cpu
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

INPUT_SIZE, HIDDEN, OUTPUT_SIZE = 16, 32, 4


def write_tiny_mlp(path: Path, seed: int = 0) -> Path:
    """A 16-32-4 MLP (MatMul, Add, Relu, MatMul, Add) with random weights, saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {
        "w1": rng.standard_normal((INPUT_SIZE, HIDDEN)).astype(np.float32) / 4,
        "b1": rng.standard_normal(HIDDEN).astype(np.float32) / 4,
        "w2": rng.standard_normal((HIDDEN, OUTPUT_SIZE)).astype(np.float32) / 4,
        "b2": rng.standard_normal(OUTPUT_SIZE).astype(np.float32) / 4,
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["INPUT0", "w1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h2"]),
            helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
            helper.make_node("Add", ["h3", "b2"], ["OUTPUT0"]),
        ],
        "tiny_mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", INPUT_SIZE])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", OUTPUT_SIZE])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by onnxruntime >= 1.17
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def main(argv: list[str]) -> int:
    default = Path(__file__).resolve().parent.parent / "examples" / "triton-repo"
    repo = Path(argv[0]) if argv else default
    out = write_tiny_mlp(repo / "tiny_mlp" / "1" / "model.onnx")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
