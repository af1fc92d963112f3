"""A Triton model folder (config.pbtxt + version folders) mapped to the repository's model
config: every mapped field, the version chosen, the notes on what is ignored, the override,
and the errors naming the file and the line or field."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tritonclient.grpc.model_config_pb2")

from evenserve.core.errors import ConfigError
from evenserve.worker import triton_config
from evenserve.worker.repository import load_model, load_repository

ONNX = "model.onnx"
IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 4 ] } ]
"""

FULL = f"""
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 16
{IO}
dynamic_batching {{
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 2500
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {{
    timeout_action: REJECT
    default_timeout_microseconds: 150000
    allow_timeout_override: false
    max_queue_size: 64
  }}
}}
instance_group [ {{ count: 2 kind: KIND_GPU }} ]
model_warmup [ {{ name: "w" batch_size: 1 }} ]
model_transaction_policy {{ decoupled: false }}
optimization {{ graph {{ level: 1 }} }}
response_cache {{ enable: true }}
parameters {{ key: "k" value: {{ string_value: "v" }} }}
"""


def _folder(tmp_path: Path, pbtxt: str, versions: dict[str, str | None] | None = None) -> Path:
    """A model folder ``m`` with ``pbtxt``; ``versions``: folder → model file (None: empty)."""
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.pbtxt").write_text(pbtxt)
    for v, file in (versions if versions is not None else {"1": "model.onnx"}).items():
        (d / v).mkdir()
        if file is not None:
            (d / v / file).write_bytes(b"not loaded by load_model")
    return d


def test_every_mapped_field(tmp_path: Path) -> None:
    entry = load_model(_folder(tmp_path, FULL))
    cfg = entry.config
    assert (cfg.name, cfg.version, cfg.runtime, cfg.max_batch_size) == ("m", "1", "onnx", 16)
    assert cfg.onnx == {"file": "1/model.onnx"}
    assert [(t.name, t.datatype, t.shape) for t in cfg.inputs] == [("INPUT0", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, t.shape) for t in cfg.outputs] == [("OUTPUT0", "INT64", [4])]
    # dynamic batching: the delay in ms, the largest preferred size caps batches
    assert entry.batching_spec() == {
        "policy": "fixed-window",
        "max_batch_delay_ms": 2.5,
        "max_batch_size": 8,
    }
    assert entry.build_policy().max_batch_size == 8
    # default level 2 of 3 → halfway between online (10) and offline (0)
    assert cfg.priority == 5
    assert (cfg.deadline_ms, cfg.max_queue_size) == (150.0, 64)
    assert entry.triton_config is not None
    assert entry.triton_config["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert entry.triton_config["input"][0]["dims"] == [-1, 16]  # numbers, not strings
    assert entry.triton_config["dynamic_batching"]["max_queue_delay_microseconds"] == 2500


def test_ignored_fields_are_noted_one_line_each_naming_the_field(tmp_path: Path) -> None:
    notes = load_model(_folder(tmp_path, FULL)).notes
    fields = [n.split(":")[0].split(" ")[0] for n in notes]
    assert fields == [
        "dynamic_batching.preferred_batch_size",
        "dynamic_batching.priority_levels",
        "dynamic_batching.default_queue_policy.allow_timeout_override",
        "dynamic_batching.preserve_ordering",
        "instance_group[0]",
        "optimization",
        "parameters",
        "model_warmup",
        "model_transaction_policy",
        "response_cache",
    ]
    assert "the largest (8) caps batches, 4 ignored" in notes[0]
    assert "count 2, KIND_GPU" in notes[4]


def test_sequence_batching_is_ignored_with_a_note(tmp_path: Path) -> None:
    pbtxt = f'platform: "onnxruntime_onnx" max_batch_size: 2 {IO} sequence_batching {{ }}'
    entry = load_model(_folder(tmp_path, pbtxt))
    assert entry.batching_spec() == {"policy": "none"}
    assert len(entry.notes) == 1
    assert entry.notes[0].startswith("sequence_batching: ignored (stateful sequence batching")


def test_priority_levels_ends_are_online_and_offline(tmp_path: Path) -> None:
    for level, expected in ((1, "online"), (4, "offline")):
        pbtxt = (
            f'name: "m" backend: "onnxruntime" max_batch_size: 2 {IO} '
            f"dynamic_batching {{ priority_levels: 4 default_priority_level: {level} }}"
        )
        d = tmp_path / str(level)
        d.mkdir()
        assert load_model(_folder(d, pbtxt)).config.priority == expected


def test_pytorch_libtorch_is_the_torch_runtime_with_torchscript(tmp_path: Path) -> None:
    pbtxt = f'backend: "pytorch" max_batch_size: 4 {IO}'
    entry = load_model(_folder(tmp_path, pbtxt, {"3": "model.pt"}))
    assert (entry.config.runtime, entry.config.version) == ("torch", "3")
    assert entry.config.torch == {"file": "3/model.pt", "format": "torchscript"}
    assert entry.config.name == "m"  # default: the folder's name
    # no dynamic_batching: Triton's default scheduler runs requests one at a time
    assert entry.batching_spec() == {"policy": "none"}
    assert entry.notes == []


def test_default_model_filename(tmp_path: Path) -> None:
    pbtxt = 'platform: "onnxruntime_onnx" default_model_filename: "net.onnx" '
    pbtxt += f"max_batch_size: 1 {IO}"
    entry = load_model(_folder(tmp_path, pbtxt, {"1": "net.onnx"}))
    assert entry.config.onnx == {"file": "1/net.onnx"}


def test_queue_timeout_with_delay_action_is_noted_not_mapped(tmp_path: Path) -> None:
    pbtxt = (
        f'platform: "onnxruntime_onnx" max_batch_size: 2 {IO} dynamic_batching {{ '
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 "
        "allow_timeout_override: true } }"
    )
    entry = load_model(_folder(tmp_path, pbtxt))
    assert entry.config.deadline_ms is None
    assert entry.batching_spec()["max_batch_size"] == 2  # no preferred sizes: the model's
    assert len(entry.notes) == 1
    assert entry.notes[0].startswith("dynamic_batching.default_queue_policy.default_timeout")
    assert "timeout_action DELAY" in entry.notes[0]


@pytest.mark.parametrize(
    ("policy", "versions", "served", "noted"),
    [
        ("", {"1": "model.onnx", "2": "model.onnx", "10": "model.onnx"}, "10", False),
        ("version_policy { latest { num_versions: 2 } }", {"1": "x", "2": "model.onnx"}, "2", True),
        ("version_policy { all { } }", {"1": "model.onnx", "2": None, "3": ONNX}, "3", True),
        (
            "version_policy { specific { versions: [ 1, 2 ] } }",
            {"1": "model.onnx", "2": "model.onnx", "3": "model.onnx"},
            "2",
            True,
        ),
        ("version_policy { specific { versions: [ 4 ] } }", {"4": ONNX, "5": None}, "4", False),
    ],
)
def test_version_policy_serves_the_highest_allowed_version_with_the_file(
    tmp_path: Path, policy: str, versions: dict[str, str | None], served: str, noted: bool
) -> None:
    pbtxt = f'platform: "onnxruntime_onnx" max_batch_size: 1 {IO} {policy}'
    entry = load_model(_folder(tmp_path, pbtxt, versions))
    assert entry.config.version == served
    assert entry.config.onnx == {"file": f"{served}/model.onnx"}
    assert any(n.startswith("version_policy") for n in entry.notes) is noted


def test_a_version_folder_is_read_as_an_integer(tmp_path: Path) -> None:
    pbtxt = f'platform: "onnxruntime_onnx" max_batch_size: 1 {IO}'
    entry = load_model(_folder(tmp_path, pbtxt, {"007": ONNX, "3": ONNX}))
    assert (entry.config.version, entry.config.onnx) == ("7", {"file": "007/model.onnx"})


@pytest.mark.parametrize(
    ("policy", "versions"),
    [
        ("", {"1": "model.onnx", "2": None}),  # latest 1 is version 2, which has no file
        ("version_policy { specific { versions: [ 7 ] } }", {"1": "model.onnx"}),
        ("", {}),
    ],
)
def test_no_servable_version_is_an_error(
    tmp_path: Path, policy: str, versions: dict[str, str | None]
) -> None:
    pbtxt = f'platform: "onnxruntime_onnx" max_batch_size: 1 {IO} {policy}'
    with pytest.raises(ConfigError, match=r"config\.pbtxt: version_policy \(.*\): no version"):
        load_model(_folder(tmp_path, pbtxt, versions))


@pytest.mark.parametrize(
    ("pbtxt", "message"),
    [
        ('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1\nbogus: 3\n', r"line 4"),
        ('name: "m"\nmax_batch_size: "eight"\n', r"line 2, column \d+: .*max_batch_size"),
        ('name: "m"\ninput [ { name: "a" data_type: TYPE_NOPE } ]\n', r"line 2, column \d+"),
    ],
)
def test_bad_pbtxt_names_the_file_and_line(tmp_path: Path, pbtxt: str, message: str) -> None:
    d = _folder(tmp_path, pbtxt)
    with pytest.raises(ConfigError, match=rf"{d / 'config.pbtxt'}: {message}"):
        load_model(d)


@pytest.mark.parametrize(
    ("pbtxt", "message"),
    [
        (f'name: "other" platform: "onnxruntime_onnx" max_batch_size: 1 {IO}', r"name: 'other'"),
        (f'platform: "tensorrt_plan" max_batch_size: 1 {IO}', r"platform: 'tensorrt_plan' is not"),
        (f'backend: "python" max_batch_size: 1 {IO}', r"backend: 'python' is not supported"),
        (f"max_batch_size: 1 {IO}", r"platform, backend: give one"),
        (
            f'platform: "onnxruntime_onnx" backend: "pytorch" max_batch_size: 1 {IO}',
            r"platform 'onnxruntime_onnx' and backend 'pytorch' disagree",
        ),
        (
            f'platform: "onnxruntime_onnx" max_batch_size: 0 {IO}',
            r"max_batch_size: 0 \(no batching dimension\) is not supported",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 1 '
            'input [ { name: "s" data_type: TYPE_STRING dims: [ 1 ] } ] '
            'output [ { name: "o" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            r"input\[0\]\.data_type: TYPE_STRING is not supported",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 1 '
            'input [ { name: "i" data_type: TYPE_FP32 dims: [ 0 ] } ] '
            'output [ { name: "o" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            r"input\[0\]\.dims: 0: must be -1",
        ),
        (
            'platform: "onnxruntime_onnx" max_batch_size: 1 '
            'input [ { name: "i" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            r"output: at least one output is required",
        ),
        (
            f'platform: "onnxruntime_onnx" max_batch_size: 4 {IO} '
            "dynamic_batching { preferred_batch_size: [ 8 ] }",
            r"dynamic_batching\.preferred_batch_size: 8 is outside 1\.\.max_batch_size \(4\)",
        ),
        (
            f'platform: "onnxruntime_onnx" max_batch_size: 4 {IO} '
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            r"dynamic_batching\.default_priority_level: 3 is outside 1\.\.priority_levels",
        ),
    ],
)
def test_unsupported_or_inconsistent_fields_are_named(
    tmp_path: Path, pbtxt: str, message: str
) -> None:
    d = _folder(tmp_path, pbtxt)
    with pytest.raises(ConfigError, match=rf"{d / 'config.pbtxt'}: {message}"):
        load_model(d)


def test_model_yaml_and_config_pbtxt_together_is_an_error_naming_both(tmp_path: Path) -> None:
    d = _folder(tmp_path, f'platform: "onnxruntime_onnx" max_batch_size: 1 {IO}')
    (d / "model.yaml").write_text("runtime: emulated\n")
    with pytest.raises(ConfigError, match=r"holds both model\.yaml and config\.pbtxt") as err:
        load_model(d)
    assert str(d / "model.yaml") in str(err.value)
    assert str(d / "config.pbtxt") in str(err.value)


def test_a_triton_folder_in_a_repository(tmp_path: Path) -> None:
    _folder(tmp_path, f'platform: "onnxruntime_onnx" max_batch_size: 2 {IO}')
    (entry,) = load_repository(tmp_path)
    assert (entry.name, entry.config.runtime) == ("m", "onnx")


def test_override_replaces_config_pbtxt_entirely(tmp_path: Path) -> None:
    d = _folder(tmp_path, FULL, {"1": "model.onnx", "2": "model.pt"})
    override = {
        "backend": "pytorch",
        "max_batch_size": 3,
        "input": [{"name": "x", "data_type": "TYPE_FP16", "dims": [2]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["5"]}],
    }
    entry = load_model(d, override=override)
    cfg = entry.config
    assert (cfg.runtime, cfg.version, cfg.max_batch_size) == ("torch", "2", 3)
    assert [(t.name, t.datatype, t.shape) for t in cfg.inputs] == [("x", "FP16", [2])]
    assert cfg.outputs[0].shape == [5]
    # nothing of config.pbtxt remains: no dynamic batching, no deadline, no notes
    assert entry.batching_spec() == {"policy": "none"}
    assert (cfg.deadline_ms, entry.notes) == (None, [])
    assert entry.triton_config is not None
    assert entry.triton_config["output"][0]["dims"] == [5]


def test_a_bad_override_names_the_override(tmp_path: Path) -> None:
    d = _folder(tmp_path, FULL)
    with pytest.raises(ConfigError, match=rf"{d}: override: not a Triton model config: .*bogus"):
        load_model(d, override={"bogus": 1})
    with pytest.raises(ConfigError, match=rf"{d}: override: max_batch_size: 0"):
        load_model(d, override={"platform": "onnxruntime_onnx", "input": [], "output": []})


def test_the_schema_missing_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _folder(tmp_path, FULL)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc.model_config_pb2", None)
    monkeypatch.delattr("tritonclient.grpc.model_config_pb2", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'evenserve\[grpc\]'"):
        load_model(d)
    assert triton_config.GRPC_EXTRA == "pip install 'evenserve[grpc]'"
