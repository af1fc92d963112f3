"""LLMs in the pools, in the simulator (issue 29 item 4; design note 0022).

    python bench/llm_pools_night.py [--scenario scenarios/llm-pools-night.yaml] [--seed N]
                                    [--static 1 2 3 4] [--jobs 2] [--json out.json]

Runs the scenario's placement arm (``--arm``, default ``cost-aware``), the same arm with no
host memory (every load of the LLM from disk: its cold load), and static layouts of N
devices (every model resident on each, no placement) for each ``--static`` N, then prints:

- the table: device-seconds, SLO attainment (the LLM's: TTFT and TPOT targets met; the
  classic streams': within SLO), the LLM's TTFT p99, loads (warm / cold), evictions, and the
  shortest time between two changes of one model on one device;
- the must-shows: (1) a cold LLM behind a burst: for each load of the LLM a miss started,
  how long after the burst's first request every request met its TTFT target again, against
  the wake (or load) + one full-budget step (the pass); and the first request's TTFT as its
  wait + the step its first token came from (and when that step began after the wake);
  (2) no model switches more than once per 30 s; (3) the placement arm's device-seconds
  against the tightest static layout whose SLO attainment (the LLM's and the classic
  streams', each) is within 0.5 point of the placement arm's or above.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evenserve.sim.llm_placement import run_placement_arm, summarize_placement  # noqa: E402
from evenserve.sim.llm_placement_scenario import (  # noqa: E402
    ArmEntry,
    DeviceEntry,
    load_llm_placement_scenario,
)

#: A static layout counts as meeting the placement arm's SLO attainment within this.
TOLERANCE = 0.005


def static_arm(path: Path, n: int) -> dict[str, Any]:
    sc = load_llm_placement_scenario(path)
    models = [sc.doc.llm.model, *dict.fromkeys(c.model for c in sc.doc.classic)]
    devices = [DeviceEntry(name=f"s{i}", models=models) for i in range(n)]
    return ArmEntry(devices=devices).model_dump()


def run_one(path: str, name: str, arm: dict[str, Any], seed: int | None) -> dict[str, Any]:
    sc = load_llm_placement_scenario(Path(path))
    sc = sc.with_arms({name: ArmEntry.model_validate(arm)})
    return summarize_placement(sc, run_placement_arm(sc, name, seed))


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios/llm-pools-night.yaml")
    ap.add_argument("--arm", default="cost-aware")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--static", type=int, nargs="*", default=[1, 2, 3, 4])
    ap.add_argument("--no-cold", action="store_true", help="skip the no-host-memory run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    sc = load_llm_placement_scenario(a.scenario)
    if a.arm not in sc.doc.arms:
        ap.error(f"--arm: no arm {a.arm!r} in {a.scenario}")
    arm = sc.doc.arms[a.arm].model_dump()
    runs: dict[str, dict[str, Any]] = {a.arm: arm}
    if not a.no_cold:
        runs[f"{a.arm} (from disk)"] = {**arm, "host_memory_gib": 0.0}
    for n in a.static:
        runs[f"static-{n}"] = static_arm(a.scenario, n)
    path = str(a.scenario)
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        futs = {k: ex.submit(run_one, path, k, v, a.seed) for k, v in runs.items()}
        out = {k: f.result() for k, f in futs.items()}

    print(f"# {sc.doc.name}, seed {a.seed if a.seed is not None else sc.doc.seed}")
    print()
    print(
        "| arm | device-s | LLM SLO | classic SLO | LLM TTFT p99 s | loads (warm / cold) "
        "| evictions | shortest switch gap s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for k, s in out.items():
        p99 = s["llm_classes"].get(max(s["llm_classes"], default=0), {}).get("ttft_p99_s")
        gap = s["shortest_switch_gap_s"]
        print(
            f"| {k} | {s['device_seconds']:.0f} | {pct(s['llm_attainment'])} "
            f"| {pct(s['classic_attainment'])} | {'-' if p99 is None else f'{p99:.3f}'} "
            f"| {s['loads']} ({s['warm_loads']} / {s['cold_loads']}) | {s['evictions']} "
            f"| {'-' if gap is None else f'{gap:.1f}'} |"
        )
    print()
    ok_all = True

    print("## A cold LLM behind a burst")
    for k in [x for x in out if not x.startswith("static-")]:
        for b in out[k]["bursts"]:
            bound = b["load_s"] + b["one_step_s"]
            rec_ok = b["recovered_s"] <= bound + 1e-9
            kind = "wake" if b["warm"] else "load from disk"
            print(
                f"- {k}, at {b['at_s']:.1f} s on {b['device']} ({kind} {b['load_s']:.2f} s, "
                f"one step {b['one_step_s'] * 1e3:.1f} ms): every request met its TTFT target "
                f"from {b['recovered_s']:.3f} s after the burst's first (bound: {kind} + one "
                f"step = {bound:.3f} s): {'PASS' if rec_ok else 'FAIL'}; the first request's "
                f"TTFT {b['first_ttft_s']:.4f} s: its wait for the {kind}, "
                f"{b['first_step_after_load_s'] * 1e6:.1f} us (a classic batch in flight "
                f"ending), the step its first token came from, the token's CPU; "
                f"{b['during_load']} requests came during the "
                f"{kind} (worst TTFT beyond it {b['worst_ttft_beyond_load_s']:.3f} s), "
                f"{pct(b['after_ttft_met'])} of the {b['after']} after it met the target"
            )
            if k == a.arm:
                ok_all &= rec_ok
        if not out[k]["bursts"]:
            print(f"- {k}: no load of the LLM started by a miss")
            if k == a.arm:
                ok_all = False
    print()

    print("## No model switches more than once per 30 s")
    for k in [x for x in out if not x.startswith("static-")]:
        s = out[k]
        gap = s["shortest_switch_gap_s"]
        ok = s["switches_within_30s"] == 0
        print(
            f"- {k}: {s['switches']} changes of a model on a device, shortest gap between two "
            f"of one (model, device) {'-' if gap is None else f'{gap:.1f} s'}, "
            f"{s['switches_within_30s']} within 30 s: {'PASS' if ok else 'FAIL'}"
        )
        if k == a.arm:
            ok_all &= ok
    print()

    print("## Device-seconds against the tightest static with the same SLO attainment")
    mine = out[a.arm]
    fits = [
        k
        for k in out
        if k.startswith("static-")
        and out[k]["llm_attainment"] >= mine["llm_attainment"] - TOLERANCE
        and out[k]["classic_attainment"] >= mine["classic_attainment"] - TOLERANCE
    ]
    if fits:
        tight = min(fits, key=lambda k: out[k]["device_seconds"])
        ratio = mine["device_seconds"] / out[tight]["device_seconds"]
        ok = ratio <= 0.70
        print(
            f"- tightest static within {100 * TOLERANCE:.1f} point of {a.arm}'s SLO attainment "
            f"(LLM {pct(mine['llm_attainment'])}, classic {pct(mine['classic_attainment'])}): "
            f"{tight}, {out[tight]['device_seconds']:.0f} device-s (LLM "
            f"{pct(out[tight]['llm_attainment'])}, classic "
            f"{pct(out[tight]['classic_attainment'])}); {a.arm} {mine['device_seconds']:.0f}: "
            f"{100 * ratio:.1f} % of it, {100 * (1 - ratio):.1f} % fewer (target >= 30 % "
            f"fewer): {'PASS' if ok else 'FAIL'}"
        )
        ok_all &= ok
    else:
        print(f"- no static layout of {a.static} devices reaches {a.arm}'s SLO attainment")
        ok_all = False
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1, default=str))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
