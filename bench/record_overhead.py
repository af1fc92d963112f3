"""What recording costs (``--record``): the request path's append, the writer's flush, and the
gateway's throughput with and without the request log.

    .venv/bin/python bench/record_overhead.py
    .venv/bin/python bench/record_overhead.py --appends 2000000 --seconds 10 --conns 16

Part 1 (in process). ``Recorder.add`` as the gateway calls it (header text for priority and
the worker's figures), ``--appends`` times into a buffer large enough to hold them all:
nanoseconds per append. Then one ``flush`` of them all (encode, the window, the file):
microseconds per record, the writer thread's cost, off the request path.

Part 2 (live). One ``evenserve worker`` with a model whose batch takes 1 us on an emulated
device, one ``evenserve gateway`` in front of it, and a closed loop of ``--conns`` keep-alive
connections for ``--seconds`` per phase, alternating the gateway without and with
``--record`` (``--rounds`` each; a new gateway per phase): requests per second through the
gateway, and the log's drop count after each recorded phase (its Prometheus counter).

Numbers depend on the host: the client, the gateway and the worker share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from evenserve.core.requestlog import Recorder, RecordSettings
from gateway_overhead import (
    EVENSERVE,
    RawClient,
    free_port,
    gateway_config,
    make_zero_model,
    start,
    stop,
    wait_ready,
)


def part1(appends: int, tmp: Path) -> None:
    settings = RecordSettings(tmp / "p1.jsonl", 1 << 40, buffer=appends, window=appends)
    rec = Recorder(settings)
    now, wall, add = rec.clock.now, time.time, rec.add
    t0 = time.perf_counter()
    for _ in range(appends):
        add(now(), wall(), "resnet50", "online", None, "w0", 200, "1.250", "3.500")
    took = time.perf_counter() - t0
    print(f"append: {took / appends * 1e9:.0f} ns per request (clock + wall reads included)")
    t0 = time.perf_counter()
    n = rec.flush()
    took = time.perf_counter() - t0
    rec.stop()
    size = (tmp / "p1.jsonl").stat().st_size
    print(
        f"flush: {took / n * 1e6:.2f} us per record ({n} records, {size / n:.0f} bytes a line), "
        f"dropped {rec.dropped}"
    )


async def closed_loop(port: int, conns: int, seconds: float) -> int:
    client = RawClient("127.0.0.1", port, "/v2/models/zero/infer", conns)
    await client.open()
    done = 0
    end = time.monotonic() + seconds

    async def user() -> None:
        nonlocal done
        while time.monotonic() < end:
            if await client.post() == 200:
                done += 1

    await asyncio.gather(*(user() for _ in range(conns)))
    await client.close()
    return done


def dropped(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("evenserve_gateway_record_dropped_total"):
            return float(line.split()[-1])
    return float("nan")


def part2(args: argparse.Namespace, tmp: Path) -> None:
    repo, pset = make_zero_model(tmp)
    wport = free_port()
    worker = start(
        [
            *EVENSERVE,
            "worker",
            "--repo",
            str(repo),
            "--device",
            f"emulated:{pset}",
            "--port",
            str(wport),
        ],
        tmp / "worker.log",
    )
    try:
        wait_ready(f"http://127.0.0.1:{wport}", worker)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for mode in ("off", "on"):
                gport = free_port()
                cfg = gateway_config(
                    tmp, gport, [("w0", f"http://127.0.0.1:{wport}")], "zero", "round-robin"
                )
                extra = ["--record", str(tmp / f"rec-{r}.jsonl")] if mode == "on" else []
                gw = start(
                    [*EVENSERVE, "gateway", "--config", str(cfg), *extra],
                    tmp / f"gateway-{r}-{mode}.log",
                )
                try:
                    wait_ready(f"http://127.0.0.1:{gport}", gw)
                    n = asyncio.run(closed_loop(gport, args.conns, args.seconds))
                    rates[mode].append(n / args.seconds)
                    lost = dropped(f"http://127.0.0.1:{gport}") if mode == "on" else 0.0
                    print(
                        f"round {r} record {mode:>3}: {n / args.seconds:8.0f} req/s"
                        + (f"  (dropped {lost:g})" if mode == "on" else ""),
                        flush=True,
                    )
                finally:
                    stop([gw])
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        print(f"median: off {off:.0f} req/s, on {on:.0f} req/s ({(on / off - 1) * 100:+.1f} %)")
    finally:
        stop([worker])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--skip-live", action="store_true", help="part 1 only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evenserve-record-") as d:
        tmp = Path(d)
        part1(args.appends, tmp)
        if not args.skip_live:
            part2(args, tmp)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
