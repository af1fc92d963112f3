"""Time per LLM routing decision at 64 engines (issue 29: under 0.5 ms), each policy.

    .venv/bin/python bench/llm_route_speed.py [--engines 64] [--decisions 5000] [--waiting 0]

The router (``policy.llm_routing.LlmRouter``) holds ``--engines`` engines, half with the
H100 step profile of Llama-3.1-8B and half with the A100's, each sampled once. A stream of
requests like ``scenarios/llm-pool.yaml``'s (a third chat prompts of ~800 tokens, two thirds
a tenant's 6,144-token shared prefix plus a 1,200-token query, 30 tenants; block names as the
simulator makes them) is routed; each routed request is sent, gets its first token and ends
later, so about ``--in-flight`` requests are in flight per engine while decisions are timed.
``--waiting K`` holds each routed request's first token until K x ``--engines`` later ones
were routed: about K prompts wait at each engine, so that (K = 64) no engine can give a first
token within the headroom of the target and predicted-ttft predicts every engine in full.
Printed per policy: the decision alone (``route``: prefix lookup and the policy) and a
request's whole accounting (``route`` + ``sent`` + ``first_token`` + ``done``), median and P99
in microseconds, measured with ``time.perf_counter_ns`` around each call on this process; and
the decision's P99 in this thread's CPU time (``time.thread_time_ns``, which a busy host's
other processes do not move; it reads a little high: one read of that clock costs about a
microsecond or two).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from evenserve.core.llm import load_step_profiles
from evenserve.policy.llm_routing import LLM_ROUTING, EngineSample, LlmRequestInfo, LlmRouter
from evenserve.sched.engine import prompt_hashes

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "src" / "evenserve" / "profiles"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--decisions", type=int, default=5000)
    ap.add_argument("--in-flight", type=int, default=8, help="requests in flight per engine")
    ap.add_argument(
        "--waiting", type=int, default=0, help="requests waiting for a first token per engine"
    )
    ap.add_argument("--policies", default=",".join(LLM_ROUTING.names()))
    args = ap.parse_args()
    h100 = load_step_profiles(PROFILES / "h100-llm")["llama-3.1-8b"]
    a100 = load_step_profiles(PROFILES / "a100-llm")["llama-3.1-8b"]
    rng = random.Random(7)
    tenants = [[rng.randrange(256) for _ in range(6144)] for _ in range(30)]
    reqs = []
    for i in range(2000):
        if i % 3 == 0:
            prompt = [rng.randrange(256) for _ in range(int(rng.lognormvariate(6.5, 0.6)))]
        else:
            prompt = tenants[rng.randrange(30)] + [rng.randrange(256) for _ in range(1200)]
        reqs.append((prompt, prompt_hashes(prompt, 16)))
    con = Console()
    t = Table(
        title=f"LLM routing decision time, {args.engines} engines ({args.decisions} decisions,"
        f" {args.waiting} waiting per engine)"
    )
    for h in ("policy", "route P50 us", "route P99 us", "route CPU P99 us", "whole P50 us",
              "whole P99 us", "sent"):  # fmt: skip
        t.add_column(h, justify="right")
    for name in args.policies.split(","):
        r = LlmRouter.build({"policy": name} if name != "kv-load" else name, seed=1)
        for e in range(args.engines):
            r.add_engine(f"e{e}", ["m"], h100 if e % 2 == 0 else a100, 4096, 16, 256, 512)
            r.observe(f"e{e}", EngineSample(0.0, 4, 1, kv_usage=0.4), 0.0)
        live: deque[int] = deque()
        pending: deque[int] = deque()
        sent = 0
        route_ns, cpu_ns, whole_ns = [], [], []
        now = 0.0
        for i in range(args.decisions):
            now += 0.01
            prompt, hashes = reqs[i % len(reqs)]
            info = LlmRequestInfo(i, "m", now, len(prompt), 200, hashes, 10 if i % 5 else 0,
                                  1.0 if i % 5 else 5.0, 0.05)  # fmt: skip
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            d = r.route(info, now)
            t1 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
            if d.engine is not None:
                r.sent(info, d.engine, now)
                pending.append(i)
                sent += 1
            while len(pending) > args.waiting * args.engines:
                j = pending.popleft()
                r.first_token(j, now)
                live.append(j)
            while len(live) > args.in_flight * args.engines:
                r.done(live.popleft(), now, 200)
            t2 = time.perf_counter_ns()
            route_ns.append(t1 - t0)
            cpu_ns.append(c1 - c0)
            whole_ns.append(t2 - t0)
        a, b = np.asarray(route_ns) / 1e3, np.asarray(whole_ns) / 1e3
        c = np.asarray(cpu_ns) / 1e3
        t.add_row(name, f"{np.percentile(a, 50):.0f}", f"{np.percentile(a, 99):.0f}",
                  f"{np.percentile(c, 99):.0f}", f"{np.percentile(b, 50):.0f}",
                  f"{np.percentile(b, 99):.0f}", f"{sent / args.decisions:.0%}")  # fmt: skip
    con.print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
