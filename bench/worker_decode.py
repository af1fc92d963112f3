"""The worker's JSON work per request: reading a KServe v2 body and writing an answer, with the
standard library's json and with orjson (what ``core.wire.parse_json`` and
``worker.kserve.encode_infer_response`` use).

    .venv/bin/python bench/worker_decode.py [--json out.json]

Bodies: the load tests' tiny request (4 FP32), a BERT-style request (2 x 128 INT64 ids), and
a ResNet-style FP32 image as JSON (3 x 224 x 224). For each: microseconds per parse (``loads``
+ the numpy array the worker builds from it) and per encode of a same-sized FP32 output
(json: ``tolist`` + ``dumps``; orjson: the array serialized from its buffer). Single process,
CPU time (``time.process_time``), the best of 5 repeats.
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


def best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t) / n)
    return best * 1e6


HEAD = {"model_name": "m", "model_version": "1"}


def parse(loads: Callable[[bytes], Any], body: bytes, dtype: type) -> np.ndarray:
    return np.array(loads(body)["inputs"][0]["data"], dtype=dtype)


def encode_json(out: np.ndarray) -> bytes:
    return json.dumps({**HEAD, "outputs": [{"data": out.tolist()}]}).encode()


def encode_orjson(out: np.ndarray) -> bytes:
    return orjson.dumps({**HEAD, "outputs": [{"data": out}]}, option=orjson.OPT_SERIALIZE_NUMPY)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases: list[tuple[str, str, np.ndarray, int]] = [
        ("tiny 4 x FP32", "FP32", rng.random(4, dtype=np.float32), 20000),
        ("BERT ids 2 x 128 INT64", "INT64", rng.integers(0, 30000, 256), 5000),
        ("ResNet image FP32 JSON", "FP32", rng.random(3 * 224 * 224, dtype=np.float32), 5),
    ]
    rows: list[dict[str, Any]] = []
    print(f"{'body':26s} {'bytes':>9s} {'parse json':>11s} {'orjson':>9s} {'x':>5s} "
          f"{'encode json':>12s} {'orjson':>9s} {'x':>5s}")  # fmt: skip
    for name, dt, arr, n in cases:
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": dt, "shape": [1, arr.size],
                         "data": arr.tolist()}]}
        ).encode()  # fmt: skip
        npdt = np.float32 if dt == "FP32" else np.int64
        pj = best_us(partial(parse, json.loads, body, npdt), n)
        po = best_us(partial(parse, orjson.loads, body, npdt), n)
        out = arr.astype(np.float32)
        ej = best_us(partial(encode_json, out), n)
        eo = best_us(partial(encode_orjson, out), n)
        print(f"{name:26s} {len(body):9d} {pj:9.1f}us {po:7.1f}us {pj / po:5.1f} "
              f"{ej:10.1f}us {eo:7.1f}us {ej / eo:5.1f}")  # fmt: skip
        rows.append({"body": name, "bytes": len(body), "parse_json_us": pj, "parse_orjson_us": po,
                     "encode_json_us": ej, "encode_orjson_us": eo})  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
