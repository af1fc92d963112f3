"""``evenserve optimize``: build a model's cheaper variants, gate and profile them, choose one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from evenserve.cli.app import console, err_console, fail, parse_batch_sizes, write_json
from evenserve.core.errors import EvenserveError


def optimize(
    model_dir: Annotated[
        Path, typer.Argument(help="The model's folder (its model.yaml).", show_default=False)
    ],
    device: Annotated[str, typer.Option(help="cpu or cuda:N.")] = "cpu",
    variants: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated variants: fp32, fp16, bf16, int8-dynamic, compile, "
            "onnxruntime, onnxruntime-int8, onnxruntime-int8-static (default: model.yaml's "
            "optimize.variants, else every one the device supports). fp32, the reference, "
            "is always built."
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="A .npz of input arrays named like the model's inputs (leading dim = items): "
            "the gate set, and the calibration of static INT8 (default: model.yaml's "
            "optimize.calibration, else synthetic inputs from the input spec)."
        ),
    ] = None,
    calibration_items: Annotated[
        int | None,
        typer.Option(min=1, help="Synthetic gate items (default: optimize.calibration_items)."),
    ] = None,
    batch_sizes: Annotated[
        str | None,
        typer.Option(help="Batch sizes profiled (default: powers of 2 up to max_batch_size)."),
    ] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured runs per batch size.")] = 2,
    iters: Annotated[int, typer.Option(min=1, help="Measured runs per batch size.")] = 5,
    cpu_threads: Annotated[int | None, typer.Option(min=1, help="Threads of CPU runtimes.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic gate set.")] = 0,
    write: Annotated[
        bool,
        typer.Option(
            help="Write variant.yaml, the profiles and the ONNX files into the model folder "
            "(--no-write: report only)."
        ),
    ] = True,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON here ('-': stdout).")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG of latency per batch size per variant.")
    ] = None,
    profile_set: Annotated[
        Path | None,
        typer.Option(
            help="Also copy the chosen variant's profile into this profile set folder as "
            "MODEL.yaml (what a gateway's or cluster file's profile set reads)."
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress or table.")] = False,
) -> None:
    """Build a model's variants (precision, INT8, compilation, ONNX Runtime), check that each
    runs the precision asked for and agrees with fp32 on a gate set, profile each, and choose
    the cheapest that passes and meets the SLO (written to the folder's variant.yaml).
    Exit status 1 when no variant passes."""
    from evenserve.runtime.device import parse_device, select_visible_device
    from evenserve.worker.optimize.run import OptimizeOptions
    from evenserve.worker.optimize.run import optimize as run_optimize
    from evenserve.worker.repository import load_model

    names = None if variants is None else [v.strip() for v in variants.split(",") if v.strip()]
    options = OptimizeOptions(
        variants=names,
        batch_sizes=None if batch_sizes is None else parse_batch_sizes(batch_sizes),
        calibration=calibration,
        calibration_items=calibration_items,
        warmup=warmup,
        iters=iters,
        cpu_threads=cpu_threads,
        seed=seed,
        write=write,
    )
    try:
        dev = parse_device(device)
        select_visible_device(dev)
        # The model as model.yaml writes it: an earlier variant.yaml is what is replaced.
        entry = load_model(model_dir, check_profile=False, override={"use_variant": False})
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            disable=quiet,
            transient=True,
        ) as progress:
            task = progress.add_task(f"{entry.name}: starting", total=None)

            def step(variant: str, what: str) -> None:
                progress.update(task, description=f"{entry.name} / {variant}: {what}")

            report = run_optimize(entry, dev, options, progress=step)
    except EvenserveError as exc:
        fail(str(exc))
    data = report.to_dict()
    if not quiet:  # beside JSON on stdout, the table goes to stderr
        _print(data, err_console if str(json_path) == "-" else console)
    if json_path is not None:
        write_json(json_path, data)
    if plot is not None:
        from evenserve.report.plots import plot_variants

        plot_variants(data, plot)
    if profile_set is not None and report.chosen is not None:
        chosen = report.variants[report.chosen].profile_path
        if chosen is None:
            fail("--profile-set: needs the profiles written (drop --no-write)")
        target = profile_set / f"{report.model}.yaml"
        profile_set.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_dir / chosen, target)
        if not quiet:
            err_console.print(f"copied the {report.chosen} profile to {target}", highlight=False)
    if report.chosen is None:
        err_console.print("no variant passed the gate and the SLO", style="bold red")
        raise typer.Exit(1)


def _print(data: dict[str, Any], out: Console) -> None:
    table = Table(title=f"{data['model']} on {data['device']} (slo_ms {data['slo_ms']})")
    for col in ("variant", "status", "top-1", "cosine", "ms @ best", "items/s", "vs fp32"):
        table.add_column(col, justify="left" if col in ("variant", "status") else "right")
    for name, v in data["variants"].items():
        g = v["gate"]
        best = v["best_batch"]
        lat = v["profile"]["latency_ms"].get(str(best)) if v["profile"] and best else None
        table.add_row(
            name,
            v["status"],
            "-" if g["top1_agreement"] is None else f"{g['top1_agreement']:.4f}",
            "-" if g["cosine"] is None else f"{g['cosine']:.4f}",
            "-" if lat is None else f"{lat:.{1 if lat >= 10 else 3}f} (b{best})",
            "-" if v["throughput_rps"] is None else f"{v['throughput_rps']:.1f}",
            "-" if v["speedup_vs_fp32"] is None else f"{v['speedup_vs_fp32']:.2f}x",
        )
    out.print(table)
    for name, v in data["variants"].items():
        for r in v["reasons"]:
            out.print(f"  {name}: {r}", highlight=False, markup=False)
        for n in v["notes"]:
            out.print(f"  {name} (note): {n}", highlight=False, markup=False, style="dim")
    chosen = data["chosen"]
    out.print(
        f"chosen: {chosen or 'none'}"
        + (f"; wrote {data['written']}" if data.get("written") else ""),
        highlight=False,
    )
