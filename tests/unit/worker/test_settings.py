"""The worker's settings: every field is a flag of the same name, validated once with errors
naming the flag, and turned into the options the worker runs with; the admin token is no
setting and never shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evenserve.cli.app import app
from evenserve.cli.flags import flags_of
from evenserve.cli.main import main  # noqa: F401  (registers the commands)
from evenserve.cli.worker_cmd import ALIASES, FLAG_ORDER, NOTES
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.worker.settings import WorkerSettings


def test_every_setting_is_one_flag_in_the_help_order() -> None:
    own = set(WorkerSettings.model_fields) - {"run", "queue"}
    assert set(FLAG_ORDER) == own | set(DeviceOptions.model_fields) | set(QueueOptions.model_fields)
    assert len(FLAG_ORDER) == len(set(FLAG_ORDER))
    by_name = {f.name: f for f in flags_of(WorkerSettings, FLAG_ORDER, NOTES, ALIASES)}
    assert by_name["repo"].required
    assert by_name["max_queue_per_model"].default == 1024  # the worker's bound, not None
    assert by_name["max_queue_per_model"].decls == ("--max-queue-per-model", "--max-queue")
    assert by_name["memory_gb"].help.endswith("(24: an A10).")
    with pytest.raises(ValueError, match="misses or repeats"):
        flags_of(WorkerSettings, FLAG_ORDER[1:])


def test_to_options_converts_the_units(tmp_path: Path) -> None:
    s = WorkerSettings.from_flags(
        repo=tmp_path,
        instances=2,
        starvation_ms=250.0,
        load_wait_ms=250.0,
        repository_poll_secs=2.5,
        host_pool=tmp_path / "pool",
        host_pool_gb=2.0,
        staging_ms_per_item=2.5,
        slowdown_phases="1:2:3",
        warmup="1,4",
        batching="{policy: static, batch_size: 4}",
        model_control="explicit",
    )
    o = s.to_options("secret-token-123")
    assert o.run.instances == 2 and o.queue.max_queue_per_model == 1024
    assert o.queue.starvation_s == 0.25 and o.load_wait_s == 0.25
    assert o.repository == tmp_path and o.repository_poll_s == 2.5
    assert o.host_pool_bytes == 2 * 1024.0**3 and o.staging_s_per_item == 0.0025
    assert o.slowdown is not None and o.slowdown.phases == ((1.0, 2.0, 3.0),)
    assert o.warmup == (1, 4) and o.model_control == "explicit"
    assert o.batching_override == {"policy": "static", "batch_size": 4}
    assert "secret-token-123" not in repr(o)
    default = WorkerSettings.from_flags(repo=tmp_path).to_options()
    assert default.slowdown is None and default.load_wait_s == 10.0 and default.warmup == "all"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"port": 70000}, "--port: must be in 0..65535 (got 70000)"),
        ({"max_body_bytes": 0}, "--max-body-bytes: must be >= 1"),
        ({"record_keep": -1}, "--record-keep: must be >= 0"),
        ({"batching": "[1, 2]"}, "--batching: expected a policy name or a mapping"),
        ({"warmup": "0"}, "--warmup: '0': batch sizes must be >= 1"),
        ({"instances": 0}, "--instances: "),
        ({"max_queue_per_model": 0}, "--max-queue-per-model: "),
        ({"host_pool_gb": 1.0}, "--host-pool-gb: needs --host-pool DIR"),
        ({"slowdown_phases": "3:1:2"}, "--slowdown-phases: phase 1 ('3:1:2'): END_S"),
    ],
)
def test_a_bad_value_names_its_flag(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        WorkerSettings.from_flags(repo=tmp_path, **kw)
    assert str(exc.value).startswith(message)


def test_the_admin_token_is_never_in_the_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENSERVE_ADMIN_TOKEN", "from-the-env-123456")
    out = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "240"}).output
    assert "--admin-token-file" in out and "from-the-env-123456" not in out
