"""NVIDIA's own client (tritonclient.http) through the evenserve gateway: both models of the
seed cluster, and which backend served each request (the ``x-evenserve-backend`` header).

    .venv/bin/python bench/tritonclient_through_gateway.py --cluster examples/cluster-seed.yaml
    .venv/bin/python bench/tritonclient_through_gateway.py --url 127.0.0.1:8000   # running one

With ``--cluster`` it runs ``evenserve up`` on that file (ports moved to free ones), waits for
the ready file, sends the requests, then stops the cluster with SIGTERM and checks that every
process it started is gone. Prints a JSON summary (``--json`` writes it to a file too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]


class HeaderClient(httpclient.InferenceServerClient):  # type: ignore[misc]
    """tritonclient's client, remembering the backend header of every response."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.backends: list[str] = []
        self._lock = threading.Lock()

    def _post(self, request_uri: str, request_body: Any, headers: Any, query_params: Any) -> Any:
        response = super()._post(request_uri, request_body, headers, query_params)
        with self._lock:
            self.backends.append(response.get("x-evenserve-backend") or "?")
        return response


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resnet_inputs() -> list[Any]:
    x = httpclient.InferInput("pixel_values", [1, 3, 224, 224], "FP32")
    x.set_data_from_numpy(np.random.rand(1, 3, 224, 224).astype(np.float32), binary_data=True)
    return [x]


def bert_inputs() -> list[Any]:
    ids = httpclient.InferInput("input_ids", [1, 128], "INT64")
    ids.set_data_from_numpy(np.random.randint(0, 30522, (1, 128), dtype=np.int64),
                            binary_data=False)  # fmt: skip
    mask = httpclient.InferInput("attention_mask", [1, 128], "INT64")
    mask.set_data_from_numpy(np.ones((1, 128), dtype=np.int64), binary_data=False)
    return [ids, mask]


def drive(url: str, n_resnet: int, n_bert: int, concurrency: int) -> dict[str, Any]:
    client = HeaderClient(url=url, concurrency=concurrency)
    out: dict[str, Any] = {
        "server_live": client.is_server_live(),
        "server_ready": client.is_server_ready(),
        "server": client.get_server_metadata()["name"],
    }
    for model, make, n, out_name in (
        ("resnet50", resnet_inputs, n_resnet, "logits"),
        ("bert-base", bert_inputs, n_bert, "logits"),
    ):
        assert client.is_model_ready(model), model
        meta = client.get_model_metadata(model)
        client.backends.clear()
        t0 = time.perf_counter()
        pending = [
            client.async_infer(model, make(), outputs=[httpclient.InferRequestedOutput(out_name)])
            for _ in range(n)
        ]
        ok = 0
        shapes = set()
        for p in pending:
            res = p.get_result()
            shapes.add(tuple(res.as_numpy(out_name).shape))
            ok += 1
        wall = time.perf_counter() - t0
        out[model] = {
            "inputs": [i["name"] for i in meta["inputs"]],
            "requests": n,
            "succeeded": ok,
            "output_shapes": sorted(shapes),
            "seconds": round(wall, 2),
            "backend_header_counts": dict(sorted(Counter(client.backends).items())),
        }
    client.close()
    return out


def drive_mixed(url: str, n: int, concurrency: int, bert_share: float = 0.27) -> dict[str, Any]:
    """The articles' mix (27 % BERT), interleaved (per-backend counts: gateway metrics)."""
    client = HeaderClient(url=url, concurrency=concurrency)
    models = ["bert-base" if (i * bert_share) % 1 + bert_share >= 1 else "resnet50"
              for i in range(n)]  # fmt: skip
    pending = []
    for m in models:
        make = bert_inputs if m == "bert-base" else resnet_inputs
        pending.append(
            client.async_infer(m, make(), outputs=[httpclient.InferRequestedOutput("logits")])
        )
    for p in pending:
        p.get_result()  # raises on any failed request
    client.close()
    return {"requests": n, "succeeded": len(pending)}


def set_policy(gw_url: str, token: str, spec: dict[str, Any]) -> dict[str, Any]:
    import httpx

    r = httpx.put(f"{gw_url}/admin/routing", json=spec,
                  headers={"authorization": f"Bearer {token}"})  # fmt: skip
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def served_by_model(gw_url: str) -> dict[str, dict[str, float]]:
    """Per model and backend: requests answered ok, from the gateway's own metrics."""
    import httpx

    out: dict[str, dict[str, float]] = {}
    for line in httpx.get(f"{gw_url}/metrics").text.splitlines():
        if line.startswith("evenserve_gateway_requests_total{") and 'outcome="ok"' in line:
            b = line.split('backend="', 1)[1].split('"', 1)[0]
            m = line.split('model="', 1)[1].split('"', 1)[0]
            out.setdefault(m, {})[b] = float(line.rsplit(" ", 1)[1])
    return out


def diff(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> Any:
    return {
        m: {b: int(v - before.get(m, {}).get(b, 0.0)) for b, v in sorted(bs.items())}
        for m, bs in sorted(after.items())
    }


def compare_policies(url: str, token: str, policies: list[str], n: int, conc: int) -> Any:
    gw = "http://" + url
    out = {}
    for pol in policies:
        set_policy(gw, token, {"policy": pol})
        before = served_by_model(gw)
        t0 = time.perf_counter()
        drive_mixed(url, n, conc)
        out[pol] = {"seconds": round(time.perf_counter() - t0, 2),
                    "served_ok": diff(served_by_model(gw), before)}  # fmt: skip
    return out


def run_cluster(cluster: Path, args: argparse.Namespace) -> dict[str, Any]:
    raw = yaml.safe_load(cluster.read_text())
    tmp = Path(tempfile.mkdtemp(prefix="evenserve-tc-"))
    raw["gateway"]["port"] = free_port()
    w = raw["workers"]
    w["repo"] = str((cluster.parent / w["repo"]).resolve())
    for d in w["devices"]:
        d["port"] = free_port()
        dev = d["device"]
        if dev.startswith("emulated:") and not Path(dev.split(":", 1)[1]).is_absolute():
            d["device"] = f"emulated:{(ROOT / 'profiles' / dev.split(':', 1)[1]).resolve()}"
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    ready = tmp / "ready.json"
    up = subprocess.Popen([*EVENSERVE, "up", str(cfg), "--log-dir", str(tmp / "logs"),
                           "--ready-file", str(ready)], cwd=ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if up.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"evenserve up did not get ready (code {up.poll()})")
            time.sleep(0.2)
        info = json.loads(ready.read_text())
        url = info["gateway"]["url"].removeprefix("http://")
        result = drive(url, args.resnet, args.bert, args.concurrency)
        if args.compare:
            result["mixed_by_policy"] = compare_policies(
                url, info["admin_token"], args.compare.split(","), args.mixed, args.concurrency
            )
        result["cluster"] = {wk["name"]: wk["models"] for wk in info["workers"]}
        pids = [info["gateway"]["pid"]] + [wk["pid"] for wk in info["workers"]]
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=60)
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    result["up_exit_code"] = code
    result["processes_left_after_sigterm"] = alive
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--cluster", type=Path, help="start `evenserve up` on this cluster file")
    g.add_argument("--url", help="a running gateway, host:port")
    ap.add_argument("--resnet", type=int, default=200)
    ap.add_argument("--bert", type=int, default=80)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--compare", help="policies to run the mixed load under, e.g. "
                    "round-robin,queue-aware (switched through the admin API)")  # fmt: skip
    ap.add_argument("--mixed", type=int, default=600, help="requests per mixed run")
    ap.add_argument("--token", help="admin token (with --url and --compare)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cluster:
        result = run_cluster(args.cluster, args)
    else:
        result = drive(args.url, args.resnet, args.bert, args.concurrency)
        if args.compare:
            result["mixed_by_policy"] = compare_policies(
                args.url, args.token, args.compare.split(","), args.mixed, args.concurrency
            )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
