"""A reference emulated device for the benches: the simplest device that batches well.

    python bench/reference_device.py --port 0 --port-file F --model resnet-like=4,0.6 \\
        --model bert-like=12,3.5 [--max-batch 8] [--window-ms 2] [--slowdown 1.0]

One process, one device, no evenserve scheduler: what the benches put nginx in front of, to
judge evenserve's batching against a device that does nothing clever. It answers KServe v2
``POST /v2/models/{model}/infer`` (any body, read and dropped; a small JSON answer),
``GET /v2/health/ready`` and ``/v2/health/live``, a model's metadata ``GET /v2/models/{model}``
(its inputs from ``--inputs``, JSON: model -> KServe v2 input list; by default one FP32 [4]
input ``x``, what the load generator makes its bodies from), and ``GET /stats`` (per model: batches,
items, their mean; the figures since the last ``POST /stats/reset``).

The device is a thread of its own, as a model instance is in Triton: it forms each batch
itself at the moment it can start one, so every request that has arrived by then rides in it
(up to ``--max-batch``), and runs it for t(b) = slowdown x (fixed + per_item x b) ms (a coarse
sleep, then a spin to the exact end). When it is free it takes the model whose oldest request
is oldest; if fewer than ``--max-batch`` of that model wait and the oldest has waited less
than ``--window-ms``, it waits for more (topping the batch up with each arrival) until the
batch is full or the window is over. Its answers go back to the event loop, which only reads
requests and writes answers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import threading
import time
from pathlib import Path

from evenserve.httpio.server import Request, Response
from evenserve.httpio.serving import Serving

SPIN_S = 0.0003
ANSWER = (
    b'{"model_name":"%s","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[0.0,0.0]}]}'
)


class Device:
    def __init__(
        self, models: dict[str, tuple[float, float]], max_batch: int, window_s: float, slow: float
    ) -> None:
        self.models = models
        self.max_batch = max_batch
        self.window_s = window_s
        self.slow = slow
        self.cond = threading.Condition()
        self.queues: dict[str, collections.deque[tuple[float, asyncio.Future[None]]]] = {
            m: collections.deque() for m in models
        }
        self.batches = dict.fromkeys(models, 0)
        self.items = dict.fromkeys(models, 0)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self.run, daemon=True, name="reference-device")

    def offer(self, model: str, fut: asyncio.Future[None]) -> None:
        with self.cond:
            self.queues[model].append((time.perf_counter(), fut))
            self.cond.notify()

    def _pick(self) -> str | None:
        heads = [(q[0][0], m) for m, q in self.queues.items() if q]
        return min(heads)[1] if heads else None

    def run(self) -> None:
        while True:
            with self.cond:
                model = self._pick()
                while model is None and not self.stopping:
                    self.cond.wait()
                    model = self._pick()
                if model is None:
                    return
                q = self.queues[model]
                while len(q) < self.max_batch:  # top the batch up while the window lasts
                    left = q[0][0] + self.window_s - time.perf_counter()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                batch = [q.popleft() for _ in range(min(self.max_batch, len(q)))]
            fixed, per = self.models[model]
            end = time.perf_counter() + self.slow * (fixed + per * len(batch)) / 1000.0
            coarse = end - time.perf_counter() - SPIN_S
            if coarse > 0:
                time.sleep(coarse)
            while time.perf_counter() < end:
                pass
            self.batches[model] += 1
            self.items[model] += len(batch)
            assert self.loop is not None
            self.loop.call_soon_threadsafe(_resolve, [f for _, f in batch])

    def stats(self) -> dict[str, dict[str, float]]:
        return {
            m: {
                "batches": self.batches[m],
                "items": self.items[m],
                "mean_batch": self.items[m] / self.batches[m] if self.batches[m] else 0.0,
            }
            for m in self.models
        }


def _resolve(futs: list[asyncio.Future[None]]) -> None:
    for f in futs:
        if not f.done():
            f.set_result(None)


DEFAULT_INPUTS = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]


class App:
    def __init__(self, device: Device, inputs: dict[str, list[dict[str, object]]]) -> None:
        self.device = device
        self.metadata = {
            m: json.dumps(
                {
                    "name": m,
                    "versions": ["1"],
                    "platform": "reference",
                    "inputs": inputs.get(m, DEFAULT_INPUTS),
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
                }
            ).encode()
            for m in device.models
        }

    async def startup(self) -> None:
        self.device.loop = asyncio.get_running_loop()
        self.device.thread.start()

    def begin_drain(self) -> None:
        pass

    async def shutdown(self) -> None:
        with self.device.cond:
            self.device.stopping = True
            self.device.cond.notify()

    async def __call__(self, request: Request) -> Response:
        path = request.path
        if path in ("/v2/health/ready", "/v2/health/live"):
            return Response(200)
        if path == "/stats":
            if request.method == "POST":
                self.device.batches = dict.fromkeys(self.device.models, 0)
                self.device.items = dict.fromkeys(self.device.models, 0)
            return Response(200, json.dumps(self.device.stats()).encode())
        parts = path.split("/")
        if len(parts) == 4 and parts[1:3] == ["v2", "models"] and parts[3] in self.metadata:
            return Response(200, self.metadata[parts[3]], {"content-type": "application/json"})
        if len(parts) == 5 and parts[1:3] == ["v2", "models"] and parts[4] == "infer":
            model = parts[3]
            if model not in self.device.models:
                return Response(404, b'{"error":"no such model"}')
            fut = asyncio.get_running_loop().create_future()
            self.device.offer(model, fut)
            await fut
            return Response(200, ANSWER % model.encode(), {"content-type": "application/json"})
        return Response(404, b'{"error":"no such path"}')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", type=Path)
    ap.add_argument("--model", action="append", required=True, help="NAME=FIXED_MS,PER_ITEM_MS")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--slowdown", type=float, default=1.0)
    ap.add_argument("--inputs", default="{}", help="JSON: model -> its v2 input list")
    args = ap.parse_args()
    models = {}
    for spec in args.model:
        name, times = spec.split("=", 1)
        fixed, per = (float(x) for x in times.split(","))
        models[name] = (fixed, per)
    device = Device(models, args.max_batch, args.window_ms / 1000.0, args.slowdown)
    serving = Serving(App(device, json.loads(args.inputs)), "127.0.0.1", args.port)

    async def announce() -> None:
        while serving.server is None or not serving.started.is_set():
            await asyncio.sleep(0.01)
        if args.port_file is not None:
            args.port_file.write_text(str(serving.port))

    async def both() -> None:
        task = asyncio.ensure_future(announce())
        await serving.serve(handle_signals=True)
        task.cancel()

    from evenserve.httpio.serving import new_loop

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(both())


if __name__ == "__main__":
    main()
