"""What a user outside the checkout gets: the shipped profile sets, the version, the license,
and install hints that keep their brackets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evenserve import __version__
from evenserve.cli.app import fail
from evenserve.cli.main import app
from evenserve.core.llm import load_step_profiles
from evenserve.core.profile import bundled_profile_set, load_profile_set
from evenserve.runtime.base import RuntimeContext
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import resolve_profile

ROOT = Path(__file__).resolve().parents[2]


def test_every_profile_set_of_the_checkout_ships_in_the_package() -> None:
    for d in sorted((ROOT / "profiles").iterdir()):
        shipped = bundled_profile_set(d.name)
        # A set holds classic profiles, LLM step profiles (kind: llm-step), or both.
        assert shipped is not None, d.name
        assert load_profile_set(shipped) or load_step_profiles(shipped), d.name
    assert bundled_profile_set("no-such-set") is None
    assert bundled_profile_set("..") is None


def test_an_emulated_device_finds_a_shipped_set_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no profiles/ here
    ctx = RuntimeContext(
        model="resnet50",
        model_dir=tmp_path,
        device=parse_device("emulated:a10-trt-fp16"),
        inputs=(),
        outputs=(),
    )
    prof = resolve_profile(ctx, None, Path("profiles"))
    assert prof.latency_s(1) > 0


def test_version_flag() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"evenserve {__version__}"


def test_a_failure_message_keeps_its_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit):
        fail("torch is not installed; install the optional extra: pip install 'evenserve[torch]'")
    assert "evenserve[torch]" in capsys.readouterr().err


def test_the_license_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert os.path.islink(ROOT / "profiles")  # one copy: the package's


def test_worker_help_documents_the_device_forms() -> None:
    result = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    for form in ("cuda:N#share=K/M", "cuda:MIG-<uuid>", "CUDA_VISIBLE_DEVICES", "#mig=<G>g.<M>gb"):
        assert form in text, form
