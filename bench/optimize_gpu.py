"""The GPU run of ``evenserve optimize``: fp32 / bf16 / fp16 / compile for ResNet-50 and
BERT-base at batch 1..64, written as profile sets (one prepared script for a lent GPU).

For each model, a copy of its example folder (``max_batch_size`` raised to 64) is optimized
on ``--device`` with ``--variants``; each variant's measured profile is then copied into
``OUT/profile-sets/<prefix>-<variant>/<model>.yaml`` (a profile set per variant, what
``--device emulated:SET`` and the simulator read), the reports into ``OUT/reports/``. A
summary table prints the latency at each batch size and the gate's figures.

    python bench/optimize_gpu.py --out bench-out/gpu [--device cuda:0] [--prefix h200]

``--tiny`` runs the same on the tiny example models (a check of the script on a CPU:
``--device cpu --tiny --variants fp32,bf16``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
FULL = {
    "resnet50": MODELS / "transformers" / "resnet50",
    "bert-base": MODELS / "transformers" / "bert-base",
}
TINY = {"tiny-resnet": MODELS / "tiny" / "tiny-resnet", "tiny-bert": MODELS / "tiny" / "tiny-bert"}


def prepare(src: Path, into: Path, max_batch: int) -> Path:
    """A copy of a model folder with ``max_batch_size`` at least ``max_batch``."""
    folder = Path(shutil.copytree(src, into / src.name))
    doc = yaml.safe_load((folder / "model.yaml").read_text())
    doc["max_batch_size"] = max(int(doc["max_batch_size"]), max_batch)
    doc.pop("profile", None)  # the CPU profile's relative path does not hold in the copy
    (folder / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--prefix", default="gpu", help="profile set names: PREFIX-VARIANT")
    ap.add_argument("--variants", default="fp32,bf16,fp16,compile")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--items", type=int, default=512, help="synthetic gate items")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="the tiny example models instead")
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    models = TINY if args.tiny else FULL
    console = Console(width=140)
    summary: dict[str, Any] = {"device": args.device, "models": {}}
    with tempfile.TemporaryDirectory(prefix="evenserve-optimize-gpu-") as tmp:
        for name, src in models.items():
            folder = prepare(src, Path(tmp), max(sizes))
            report_path = args.out / "reports" / f"{name}.json"
            report_path.parent.mkdir(parents=True, exist_ok=True)
            cmd = [
                sys.executable, "-m", "evenserve", "optimize", str(folder),
                "--device", args.device, "--variants", args.variants,
                "--batch-sizes", args.batch_sizes, "--calibration-items", str(args.items),
                "--iters", str(args.iters), "--json", str(report_path), "--quiet",
            ]  # fmt: skip
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            took = time.perf_counter() - t0
            if proc.returncode not in (0, 1) or not report_path.exists():
                console.print(f"{name}: optimize failed ({proc.returncode})\n{proc.stderr[-3000:]}")
                summary["models"][name] = {"error": proc.stderr[-3000:]}
                continue
            report = json.loads(report_path.read_text())
            written = {}
            for variant, v in report["variants"].items():
                if v["profile"] is None or v["profile"]["path"] is None:
                    continue
                target = args.out / "profile-sets" / f"{args.prefix}-{variant}" / f"{name}.yaml"
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / v["profile"]["path"], target)
                written[variant] = str(target)
            summary["models"][name] = {"seconds": round(took, 1), "profiles": written,
                                       "chosen": report["chosen"]}  # fmt: skip
            table = Table(title=f"{name} on {report['device']} ({took:.0f} s)")
            table.add_column("variant", no_wrap=True)
            table.add_column("status")
            table.add_column("top-1", justify="right")
            for b in sizes:
                table.add_column(f"b{b} ms", justify="right")
            for variant, v in report["variants"].items():
                lat = (v["profile"] or {}).get("latency_ms", {})
                top1 = v["gate"]["top1_agreement"]
                table.add_row(
                    variant,
                    v["status"],
                    "-" if top1 is None else f"{top1:.4f}",
                    *[f"{lat[str(b)]:.2f}" if str(b) in lat else "-" for b in sizes],
                )
            console.print(table)
            for variant, v in report["variants"].items():
                for r in v["reasons"]:
                    console.print(f"  {variant}: {r}", highlight=False, markup=False)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"profile sets in {args.out / 'profile-sets'}")


if __name__ == "__main__":
    main()
