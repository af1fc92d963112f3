"""The worker's JSON work per request: reading a KServe v2 body and writing an answer.

    .venv/bin/python bench/worker_decode.py [--json out.json]

Bodies, as clients send them: the load tests' tiny request (4 FP32); a BERT-base request
(input_ids and attention_mask, 2 x [1, 128] INT64); a ResNet-50 image [1, 3, 224, 224] FP32 as
JSON (about 3 MB), flat as tritonclient sends it with binary data off, with values uniform in
[0, 1) (about 1 % of them below 0.01, written with fractions of 19-20 digits, the body that
sent every request to Python's json before) and standard normal ones; and the same image
nested [1][3][224][224] as curl and requests users write it.

For each body, CPU microseconds per decode:
- ``json``: Python's ``json.loads`` + ``numpy.array`` (what a body with a run of 20 digits
  cost before);
- ``orjson``: ``orjson.loads`` + ``numpy.asarray`` of the tensors at their dtypes: the floor
  the issue measures against;
- ``worker``: ``worker.kserve.parse_infer_request``, the worker's whole decode (depth scan,
  orjson, validation, the typed arrays), and ``worker / orjson`` (target: at most 1.5).
And per encode of a same-sized FP32 output (json: ``tolist`` + ``dumps``; orjson: the array
serialized from its buffer). Single process, CPU time (``time.process_time``), the best of 5
repeats.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from evenserve.runtime.base import TensorSpec
from evenserve.worker.kserve import ModelSignature, parse_infer_request

TARGET = 1.5


def best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t) / n)
    return best * 1e6


HEAD = {"model_name": "m", "model_version": "1"}
DTYPES = {"FP32": np.float32, "INT64": np.int64}


def baseline(loads: Callable[[bytes], Any], body: bytes) -> list[np.ndarray]:
    """``loads`` + one numpy array per input at its datatype."""
    doc = loads(body)
    return [np.asarray(t["data"], dtype=DTYPES[t["datatype"]]) for t in doc["inputs"]]


def encode_json(out: np.ndarray) -> bytes:
    return json.dumps({**HEAD, "outputs": [{"data": out.tolist()}]}).encode()


def encode_orjson(out: np.ndarray) -> bytes:
    return orjson.dumps({**HEAD, "outputs": [{"data": out}]}, option=orjson.OPT_SERIALIZE_NUMPY)


def case(
    name: str, tensors: list[tuple[str, str, np.ndarray]], nested: bool = False
) -> tuple[str, bytes, ModelSignature]:
    """A request body and the signature of the model it is for (batch dimension 1)."""
    inputs = [
        {
            "name": n,
            "datatype": dt,
            "shape": [1, *a.shape],
            "data": a[None].tolist() if nested else a.reshape(-1).tolist(),
        }
        for n, dt, a in tensors
    ]
    sig = ModelSignature(
        "m",
        "1",
        tuple(TensorSpec(n, dt, tuple(a.shape)) for n, dt, a in tensors),
        (TensorSpec("y", "FP32", (2,)),),
        8,
    )
    return name, json.dumps({"inputs": inputs}).encode(), sig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    image = rng.random((3, 224, 224), dtype=np.float32)
    normal = rng.standard_normal((3, 224, 224)).astype(np.float32)
    ids = rng.integers(0, 30522, 128)
    cases = [
        (case("tiny 4 x FP32", [("x", "FP32", rng.random(4, dtype=np.float32))]), 20000),
        (case("BERT 2 x [1,128] INT64", [("ids", "INT64", ids), ("mask", "INT64", ids * 0 + 1)]),
         5000),
        (case("ResNet-50 FP32, uniform", [("x", "FP32", image)]), 5),
        (case("ResNet-50 FP32, normal", [("x", "FP32", normal)]), 5),
        (case("ResNet-50 FP32, nested", [("x", "FP32", image)], nested=True), 5),
    ]  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"{'body':26s} {'bytes':>9s} {'json':>10s} {'orjson':>10s} {'worker':>10s} "
          f"{'w/orjson':>8s}  {'encode json':>11s} {'orjson':>9s}")  # fmt: skip
    worst = 0.0
    for (name, body, sig), n in cases:
        pj = best_us(partial(baseline, json.loads, body), max(1, n // 5))
        po = best_us(partial(baseline, orjson.loads, body), n)
        pw = best_us(partial(parse_infer_request, body, None, sig), n)
        out = rng.random(body.count(b",") + 1, dtype=np.float32)
        ej = best_us(partial(encode_json, out), n)
        eo = best_us(partial(encode_orjson, out), n)
        ratio = pw / po
        if len(body) > 1_000_000:
            worst = max(worst, ratio)
        print(f"{name:26s} {len(body):9d} {pj:8.1f}us {po:8.1f}us {pw:8.1f}us {ratio:8.2f}  "
              f"{ej:9.1f}us {eo:7.1f}us")  # fmt: skip
        rows.append({"body": name, "bytes": len(body), "json_us": pj, "orjson_us": po,
                     "worker_us": pw, "worker_over_orjson": ratio, "encode_json_us": ej,
                     "encode_orjson_us": eo})  # fmt: skip
    verdict = "PASS" if worst <= TARGET else "FAIL"
    print(
        f"worker decode of a 3 MB JSON tensor: at most {worst:.2f}x orjson.loads + "
        f"numpy.asarray (target <= {TARGET:g}x): {verdict}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
