"""How fast ``evenserve diagnose`` reads a long run: the seed scenario's baseline simulated
for 10 minutes, its summary JSON written as ``simulate`` writes it, then ``evenserve
diagnose RUN --no-verify --json`` timed as a whole process (start-up included), and the read
and detection alone in this process. With ``--verify-s S`` it also times a verified run on
the first S seconds of the replay.

    python bench/diagnose_speed.py [--minutes 10] [--verify-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evenserve.experiment.diagnose import diagnose_summary
from evenserve.report.summary import run_summary, summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "scenarios" / "seed.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--verify-s", type=float, default=None)
    args = ap.parse_args()
    duration = args.minutes * 60.0
    sets = [f"duration_s={duration}"]
    t = time.perf_counter()
    loaded = load_scenario(SEED, sets)
    summary = run_summary("seed", 1, {"baseline": summarize(simulate(loaded, "baseline", 1))})
    summary["source"] = {"scenario": str(SEED), "arm": "baseline", "seed": 1, "set": sets}
    sim_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run.json"
        run.write_text(json.dumps(summary))
        size_kb = run.stat().st_size / 1e3
        t = time.perf_counter()
        found = diagnose_summary(json.loads(run.read_text()))
        inproc_s = time.perf_counter() - t
        cmd = [sys.executable, "-m", "evenserve", "diagnose", str(run), "--no-verify"]
        env = {**os.environ, "COLUMNS": "200"}
        t = time.perf_counter()
        out = subprocess.run([*cmd, "--json", "-"], capture_output=True, text=True, env=env)
        whole_s = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        report = json.loads(out.stdout)
        kinds = [f["kind"] for f in report["runs"][0]["arms"]["baseline"]["findings"]]
        print(f"run: seed baseline, {duration:.0f} s simulated in {sim_s:.1f} s", end="")
        print(f"; JSON {size_kb:.0f} kB")
        print(f"findings: {len(found['baseline'])} ({', '.join(sorted(set(kinds)))})")
        print(f"read + detect in process: {inproc_s * 1000:.0f} ms")
        print(f"evenserve diagnose --no-verify, whole process: {whole_s:.2f} s")
        if args.verify_s is not None:
            t = time.perf_counter()
            v = subprocess.run(
                [*cmd[:-1], "--verify-s", str(args.verify_s), "--json", "-"],
                capture_output=True,
                text=True,
                env=env,
            )
            if v.returncode != 0:
                raise SystemExit(v.stderr)
            arm = json.loads(v.stdout)["runs"][0]["arms"]["baseline"]
            print(
                f"evenserve diagnose --verify-s {args.verify_s:g}: {time.perf_counter() - t:.1f} s "
                f"({arm['simulator_runs']} simulator runs)"
            )


if __name__ == "__main__":
    main()
