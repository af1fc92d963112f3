"""model.yaml: the shipped examples load; every error names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evenserve.core.errors import ConfigError
from evenserve.runtime.emulated import EmulatedParams
from evenserve.runtime.transformers_runtime import TransformersParams
from evenserve.worker.repository import load_repository

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "models"

GOOD = {
    "runtime": "emulated",
    "max_batch_size": 8,
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": [{"name": "y", "datatype": "fp32", "shape": [-1]}],
    "emulated": {"profile": "p.yaml"},
}


def _repo(tmp_path: Path, model: dict[str, object], name: str = "m") -> Path:
    d = tmp_path / "repo" / name
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(yaml.safe_dump(model))
    return tmp_path / "repo"


@pytest.mark.parametrize("repo", ["emulated", "transformers", "tiny"])
def test_examples_load(repo: str) -> None:
    entries = load_repository(EXAMPLES / repo, check_profiles=False)
    assert entries
    for e in entries:
        e.build_policy()
        if e.config.runtime == "transformers":
            assert isinstance(e.runtime_params, TransformersParams)


def test_defaults(tmp_path: Path) -> None:
    (e,) = load_repository(_repo(tmp_path, GOOD), check_profiles=False)
    assert e.name == "m" and e.config.version == "1"
    assert e.outputs[0].datatype == "FP32" and e.outputs[0].shape == (-1,)
    assert isinstance(e.runtime_params, EmulatedParams)
    spec = e.batching_spec()
    assert spec == {"policy": "fixed-window", "max_batch_delay_ms": 0, "max_batch_size": 8}
    assert e.config.priority_value == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"runtime": "tensorrt"}, "runtime: Input should be"),
        ({"max_batch_size": 0}, "max_batch_size: Input should be greater"),
        ({"inputs": [{"name": "x", "datatype": "FP99", "shape": [4]}]}, "inputs.0.datatype"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [0]}]}, "inputs.0.shape"),
        ({"inputs": []}, "inputs: List should have at least 1"),
        ({"outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}] * 2}, "outputs: name 'y'"),
        ({"batching": {"policy": "warp-speed"}}, "batching.policy: unknown batching policy"),
        (
            {"batching": {"policy": "static", "batch_size": 99}},
            "exceeds the model's max_batch_size (8)",
        ),
        (
            {"batching": {"policy": "fixed-window", "max_batch_delay_ms": -1}},
            "batching.max_batch_delay_ms",
        ),
        ({"priority": "urgent"}, "priority: Value error, unknown priority class"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"name": "other"}, "name: 'other' differs from its folder 'm'"),
        ({"torch": {"file": "x.pt"}}, "torch: section given but runtime is 'emulated'"),
        ({"emulated": {"profile": 3}}, "emulated.profile: Input should be a valid string"),
        (
            {"runtime": "transformers", "transformers": {"precision": "fp8"}},
            "transformers.architecture: Field required",
        ),
        ({"slo_ms": 0}, "slo_ms: Input should be greater than 0"),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "example_shape": [2, 2]}]},
            "example_shape [2, 2] does not fit",
        ),
    ],
)
def test_errors_name_the_field(tmp_path: Path, change: dict[str, object], message: str) -> None:
    repo = _repo(tmp_path, {**GOOD, **change})
    with pytest.raises(ConfigError) as err:
        load_repository(repo)
    assert "model.yaml" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(("folder", "field"), [("a b", "name"), ("x..y", None), ("é", "name")])
def test_a_model_name_must_be_routable(tmp_path: Path, folder: str, field: str | None) -> None:
    repo = _repo(tmp_path, GOOD, name=folder)
    if field is None:  # a name of dots and letters is a name
        assert load_repository(repo, check_profiles=False)[0].name == "x..y"
        return
    with pytest.raises(ConfigError, match=f"{field}: Value error, .* is no path segment"):
        load_repository(repo, check_profiles=False)


@pytest.mark.parametrize("version", ["..", ".", "1/2", "", "v 1"])
def test_a_version_must_be_routable(tmp_path: Path, version: str) -> None:
    with pytest.raises(ConfigError, match="version: Value error"):
        load_repository(_repo(tmp_path, {**GOOD, "version": version}), check_profiles=False)


def test_missing_profile_is_named(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {**GOOD, "profile": "nowhere.yaml"})
    with pytest.raises(ConfigError, match="profile: profile file not found"):
        load_repository(repo)


def test_repository_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--repo: not a folder"):
        load_repository(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no model folders"):
        load_repository(tmp_path / "empty")
    (tmp_path / "r" / "nomodel").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no model\.yaml"):
        load_repository(tmp_path / "r")
    (tmp_path / "bad" / "m").mkdir(parents=True)
    (tmp_path / "bad" / "m" / "model.yaml").write_text("runtime: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_repository(tmp_path / "bad")
    repo = _repo(tmp_path, GOOD, "m2")
    with pytest.raises(ConfigError, match="--models: no model folder 'zz'"):
        load_repository(repo, ["zz"])


def test_a_variant_of_runtime_emulated_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    """variant.yaml names a real runtime (what evenserve optimize chose); emulated is refused
    naming the file and the field, not an AttributeError."""
    repo = _repo(tmp_path, GOOD)
    (repo / "m" / "variant.yaml").write_text(
        yaml.safe_dump({"variant": "v", "runtime": "emulated"})
    )
    with pytest.raises(ConfigError, match=r"variant\.yaml: runtime: "):
        load_repository(repo, check_profiles=False)
