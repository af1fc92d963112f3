"""``evenserve optimize`` on the tiny example models: variants built, gated, profiled, one
chosen and written into the model folder, where the repository (and so the worker) serves it.

Variants are chosen by measured throughput, which depends on the machine: the tests assert
on what does not (the report's shape, the gate's verdicts, the precision checks, that the
chosen one is the usable one of the highest measured throughput, the files written)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from evenserve.cli.main import app
from evenserve.core.errors import ConfigError
from evenserve.runtime.device import parse_device
from evenserve.worker.optimize.run import OptimizeOptions, optimize
from evenserve.worker.repository import VARIANT_FILE, load_model

pytest.importorskip("transformers")

TINY = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny"
CPU = parse_device("cpu")


@pytest.fixture
def tiny_bert(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TINY / "tiny-bert", tmp_path / "tiny-bert"))


@pytest.fixture
def overflow(tmp_path: Path) -> Path:
    """tiny-resnet fed unnormalised pixels (0..60000): fine in fp32, inf in fp16."""
    folder = Path(shutil.copytree(TINY / "tiny-resnet", tmp_path / "tiny-overflow"))
    doc = yaml.safe_load((folder / "model.yaml").read_text())
    doc["inputs"][0]["synthetic"] = {"low": 0, "high": 60000}
    (folder / "model.yaml").write_text(yaml.safe_dump(doc))
    return folder


def _options(**kw: object) -> OptimizeOptions:
    base: dict[str, object] = dict(
        calibration_items=32, batch_sizes=[1, 4], warmup=1, iters=2, cpu_threads=1
    )
    base.update(kw)
    return OptimizeOptions(**base)  # type: ignore[arg-type]


def test_tiny_bert_variants_report_and_write(tiny_bert: Path) -> None:
    entry = load_model(tiny_bert)
    report = optimize(entry, CPU, _options(variants=["int8-dynamic", "bf16"]))
    data = report.to_dict()
    assert list(data["variants"]) == ["fp32", "int8-dynamic", "bf16"]
    for name, v in data["variants"].items():
        assert v["status"] in ("chosen", "passed"), (name, v["reasons"])
        assert v["gate"]["passed"] and v["gate"]["top1_agreement"] >= 0.99
        assert v["gate"]["cosine"] >= 0.99
        assert v["precision_check"]["passed"]
        assert set(v["profile"]["latency_ms"]) == {"1", "4"}
        assert v["throughput_rps"] > 0
        assert (tiny_bert / v["profile"]["path"]).is_file()
    assert data["variants"]["fp32"]["gate"]["top1_agreement"] == 1.0
    int8 = data["variants"]["int8-dynamic"]["precision_check"]["evidence"]
    assert int8["quantized_weight_fraction"] == 1.0 and "qint8" in int8["weights_bytes"]
    bf16 = data["variants"]["bf16"]["precision_check"]["evidence"]
    assert set(bf16["activation_dtypes"]) == {"bfloat16"}
    assert bf16["activation_source"] == "layers"  # every leaf module's outputs
    # The chosen one is the usable variant of the highest measured throughput.
    best = max(data["variants"].items(), key=lambda kv: kv[1]["throughput_rps"])[0]
    assert data["chosen"] == best and data["variants"][best]["status"] == "chosen"
    # variant.yaml: the repository serves the chosen variant with its profile.
    assert report.written == str(tiny_bert / VARIANT_FILE)
    served = load_model(tiny_bert)
    assert served.variant is not None and served.variant["name"] == best
    assert served.config.profile == data["variants"][best]["profile"]["path"]
    assert served.latency_profile() is not None
    precision = {"fp32": "fp32", "int8-dynamic": "int8", "bf16": "bf16"}[best]
    assert served.runtime_params.precision == precision  # type: ignore[union-attr]
    saved = json.loads((tiny_bert / "variants" / "optimize.json").read_text())
    assert saved["chosen"] == best
    # use_variant: false serves model.yaml as written.
    plain = load_model(tiny_bert, override={"use_variant": False})
    assert plain.variant is None and plain.config.profile is None


def test_fp16_overflow_is_rejected_with_its_figures(overflow: Path) -> None:
    report = optimize(load_model(overflow), CPU, _options(variants=["fp16"], write=False))
    fp16 = report.to_dict()["variants"]["fp16"]
    assert fp16["status"] == "rejected"
    assert not fp16["gate"]["passed"]
    assert fp16["gate"]["nonfinite_items"] > 0
    assert fp16["gate"]["top1_agreement"] < 0.99
    assert any("non-finite" in r for r in fp16["reasons"])
    assert report.chosen == "fp32"
    assert not (overflow / VARIANT_FILE).exists() and not (overflow / "variants").exists()


def test_int8_dynamic_on_a_cnn_fails_the_precision_check(overflow: Path) -> None:
    report = optimize(load_model(overflow), CPU, _options(variants=["int8-dynamic"], write=False))
    v = report.to_dict()["variants"]["int8-dynamic"]
    assert v["status"] == "rejected"
    assert not v["precision_check"]["passed"]
    assert any("of the Linear/Conv weights" in r for r in v["reasons"])


def test_slo_no_batch_fits_rejects_everything_and_exits_1(tiny_bert: Path) -> None:
    doc = yaml.safe_load((tiny_bert / "model.yaml").read_text())
    doc["slo_ms"] = 0.001
    (tiny_bert / "model.yaml").write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(
        app,
        [
            "optimize",
            str(tiny_bert),
            "--variants",
            "fp32",
            "--calibration-items",
            "8",
            "--batch-sizes",
            "1",
            "--iters",
            "1",
            "--json",
            str(tiny_bert / "r.json"),
            "--quiet",
        ],
    )
    assert result.exit_code == 1, result.output
    data = json.loads((tiny_bert / "r.json").read_text())
    assert data["chosen"] is None
    assert "slo_ms" in data["variants"]["fp32"]["reasons"][0]
    assert not (tiny_bert / VARIANT_FILE).exists()


def test_cli_writes_and_copies_the_chosen_profile(tiny_bert: Path, tmp_path: Path) -> None:
    from evenserve.core.profile import load_profile_set

    args = ["optimize", str(tiny_bert), "--variants", "fp32", "--calibration-items", "8"]
    args += ["--batch-sizes", "1,2", "--iters", "1", "--profile-set", str(tmp_path / "set")]
    args += ["--plot", str(tmp_path / "v.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "chosen: fp32" in result.output
    profiles = load_profile_set(tmp_path / "set")
    assert set(profiles) == {"tiny-bert"} and profiles["tiny-bert"].batches == (1, 2)
    assert (tmp_path / "v.png").stat().st_size > 0
    assert (tiny_bert / VARIANT_FILE).is_file()


def test_cli_json_shape(tiny_bert: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    result = CliRunner().invoke(
        app,
        [
            "optimize",
            str(tiny_bert),
            "--variants",
            "int8-dynamic,onnxruntime-int8-static",
            "--calibration-items",
            "16",
            "--batch-sizes",
            "1,2",
            "--iters",
            "1",
            "--cpu-threads",
            "1",
            "--no-write",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) >= {"variants", "chosen", "gate_set", "thresholds", "device"}
    for v in data["variants"].values():
        assert {"precision", "gate", "profile", "throughput_rps"} <= set(v)
        assert {"passed", "top1_agreement", "cosine"} <= set(v["gate"])
    static = data["variants"]["onnxruntime-int8-static"]
    assert static["status"] == "unsupported" and "calibration" in static["reasons"][0]
    assert data["gate_set"] == {"source": "synthetic", "items": 16, "batch": 8, "output": "logits"}
    assert not (tiny_bert / VARIANT_FILE).exists()
    # --json -: the report alone on stdout (the table goes to stderr)
    args = ["optimize", str(tiny_bert), "--variants", "fp32", "--calibration-items", "8"]
    result = CliRunner().invoke(app, [*args, "--batch-sizes", "1", "--no-write", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["chosen"] == "fp32"


def test_calibration_file_is_the_gate_set(tiny_bert: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    npz = tmp_path / "cal.npz"
    np.savez(
        npz,
        input_ids=rng.integers(0, 100, size=(12, 10)),
        attention_mask=np.ones((12, 10), dtype=np.int64),
    )
    report = optimize(
        load_model(tiny_bert),
        CPU,
        _options(variants=["onnxruntime-int8-static"], calibration=npz, write=False),
    )
    assert report.gate_set["source"] == str(npz) and report.gate_set["items"] == 12
    assert report.variants["fp32"].gate is not None
    assert report.variants["fp32"].gate.items == 12
    static = report.to_dict()["variants"]["onnxruntime-int8-static"]
    assert static["status"] in ("passed", "chosen", "rejected"), static["reasons"]
    assert static["precision_check"]["evidence"]["precision"] == "int8"
    quant = static["build"]["artifacts"]["quantization"]
    assert quant["calibration_items"] == 3  # the first quarter of the 12 items
    assert static["gate"]["items"] == 12 and static["gate"]["cosine"] is not None


def test_bad_input_is_named(tiny_bert: Path, tmp_path: Path) -> None:
    entry = load_model(tiny_bert)
    with pytest.raises(ConfigError, match="unknown variant"):
        optimize(entry, CPU, _options(variants=["int3"]))
    with pytest.raises(ConfigError, match="--batch-sizes"):
        optimize(entry, CPU, _options(batch_sizes=[64]))
    npz = tmp_path / "cal.npz"
    np.savez(npz, input_ids=np.zeros((4, 8), dtype=np.int64))
    with pytest.raises(ConfigError, match="no array 'attention_mask'"):
        optimize(entry, CPU, _options(calibration=npz))
    emulated = load_model(TINY / "tiny-emulated")
    with pytest.raises(ConfigError, match="torch-based"):
        optimize(emulated, CPU, _options())
    runner = CliRunner()
    result = runner.invoke(app, ["optimize", str(tiny_bert), "--variants", "int3"])
    assert result.exit_code == 2 and "unknown variant" in result.output
    result = runner.invoke(app, ["optimize", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "model.yaml" in result.output


def test_model_yaml_thresholds_and_bad_values(tiny_bert: Path) -> None:
    doc = yaml.safe_load((tiny_bert / "model.yaml").read_text())
    doc["optimize"] = {"min_top1_agreement": 1.5}
    (tiny_bert / "model.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"optimize\.min_top1_agreement"):
        load_model(tiny_bert)
    doc["optimize"] = {"gate_output": "nope"}
    (tiny_bert / "model.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="gate_output"):
        load_model(tiny_bert)
    # A threshold no variant can meet: even int8's tiny drift is rejected.
    doc["optimize"] = {"min_cosine": 1.0, "variants": ["int8-dynamic"], "calibration_items": 8}
    (tiny_bert / "model.yaml").write_text(yaml.safe_dump(doc))
    report = optimize(load_model(tiny_bert), CPU, _options(calibration_items=None, write=False))
    assert report.thresholds["min_cosine"] == 1.0
    v = report.variants["int8-dynamic"]
    assert v.status == "rejected" and any("min_cosine" in r for r in v.reasons)


def test_broken_variant_file_is_a_clear_error(tiny_bert: Path) -> None:
    (tiny_bert / VARIANT_FILE).write_text("variant: x\nruntime: onnx\n")
    with pytest.raises(ConfigError, match="onnx: section required"):
        load_model(tiny_bert)
    (tiny_bert / VARIANT_FILE).write_text("variant: x\nruntime: transformers\nbogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_model(tiny_bert)


def test_worker_serves_the_chosen_variant(tiny_bert: Path) -> None:
    import httpx

    from evenserve.worker.app import Worker
    from evenserve.worker.options import WorkerOptions
    from evenserve.worker.repository import load_repository
    from evenserve.worker.server import BackgroundWorker

    report = optimize(load_model(tiny_bert), CPU, _options(variants=["onnxruntime"]))
    assert report.chosen is not None
    entries = load_repository(tiny_bert.parent, [tiny_bert.name])
    service = Worker(entries, WorkerOptions(device=CPU, cpu_threads=1))
    ids = np.arange(10, dtype=np.int64).reshape(1, 10) % 100
    body = {
        "inputs": [
            {"name": n, "datatype": "INT64", "shape": [1, 10], "data": d}
            for n, d in (("input_ids", ids.ravel().tolist()), ("attention_mask", [1] * 10))
        ]
    }
    with BackgroundWorker(service) as w:
        info = service.models[tiny_bert.name].load_info
        assert info["variant"] == report.chosen
        assert info["warmup_batch_sizes"] == list(range(1, 9))
        r = httpx.post(f"{w.url}/v2/models/{tiny_bert.name}/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        got = np.array(r.json()["outputs"][0]["data"])
    fp32 = load_model(tiny_bert, override={"use_variant": False})
    from evenserve.worker.profiler import build_runtime

    rt = build_runtime(fp32, CPU, cpu_threads=1)
    rt.load()
    want = rt.run({"input_ids": ids, "attention_mask": np.ones_like(ids)})["logits"].ravel()
    rt.close()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_compile_variant_reports_its_compile_and_caches_it_in_the_folder(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("cc") is None:  # inductor on the CPU needs a C compiler
        report = optimize(load_model(tiny_bert), CPU, _options(variants=["compile"]))
        assert report.variants["compile"].status == "unsupported"
        return
    # As if the user named no inductor cache: the model folder's is used.
    monkeypatch.setattr("evenserve.runtime.torch_common._USER_INDUCTOR_CACHE", None)
    # Profiled at the gate's batch (8): inductor compiles for the load's warm-up batch, then
    # once more with dynamic shapes; profiling at 1 would add a third compile (each is most of
    # a minute of C++ compiling on a small CPU).
    report = optimize(load_model(tiny_bert), CPU, _options(variants=["compile"], batch_sizes=[8]))
    v = report.to_dict()["variants"]["compile"]
    assert v["status"] in ("passed", "chosen"), v["reasons"]
    assert v["engine"] == "compile" and v["gate"]["top1_agreement"] == 1.0
    info = v["build"]["compile"]
    assert info["first_batch_seconds"] > 0
    assert info["fxgraph_cache_miss"] >= 1  # a fresh folder: compiled, not found
    cache = tiny_bert / ".cache" / "inductor"
    assert info["cache_dir"] == str(cache) and any(cache.iterdir())
    served = load_model(tiny_bert)
    if report.chosen == "compile":
        assert served.runtime_params.compile is not None  # type: ignore[union-attr]


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_torch_runtime_models(tmp_path: Path, fmt: str) -> None:
    """A TorchScript file and a torch.export program: the reference's evidence comes from
    the module's outputs where layers cannot be hooked; ONNX export works from both;
    torch's dynamic INT8 can convert neither (no nn.Linear modules): the runtime refuses."""
    import warnings

    torch = pytest.importorskip("torch")
    folder = tmp_path / "lin"
    folder.mkdir()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    example = torch.rand(2, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fmt == "torchscript":
            torch.jit.save(torch.jit.trace(net.eval(), example), folder / "model.pt")
            file = "model.pt"
        else:
            batch = torch.export.Dim("b", min=1, max=64)
            program = torch.export.export(net.eval(), (example,), dynamic_shapes=({0: batch},))
            torch.export.save(program, folder / "model.pt2")
            file = "model.pt2"
    (folder / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "torch",
                "max_batch_size": 8,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [16]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
                "torch": {"file": file},
            }
        )
    )
    variants = ["onnxruntime", "int8-dynamic"]
    report = optimize(load_model(folder), CPU, _options(variants=variants, write=False))
    data = report.to_dict()["variants"]
    fp32 = data["fp32"]
    assert fp32["precision_check"]["passed"], fp32["reasons"]
    # no hooks on a ScriptModule, no leaf modules in an exported program
    assert fp32["precision_check"]["evidence"]["activation_source"] == "outputs"
    assert data["onnxruntime"]["status"] in ("passed", "chosen"), data["onnxruntime"]["reasons"]
    assert data["onnxruntime"]["gate"]["cosine"] > 0.999
    int8 = data["int8-dynamic"]
    assert int8["status"] == "failed"  # the runtime refuses an int8 that would run fp32
    why = "cannot be dynamically quantized" if fmt == "torchscript" else "no nn.Linear layers"
    assert why in int8["reasons"][0]
