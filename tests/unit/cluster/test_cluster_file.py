from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.cluster.admin_token import (
    DEFAULT_TOKEN_ENV,
    MIN_TOKEN_LENGTH,
    AdminToken,
    write_private,
)
from evenserve.cluster.file import load_cluster, parse_cluster
from evenserve.cluster.prometheus_mapping import TRITON_MAPPING
from evenserve.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def cluster(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "backends": [{"name": "a", "url": "http://127.0.0.1:9001", "models": ["m"]}],
    }
    raw.update(over)
    return raw


def error_of(raw: Any) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_cluster(raw, Path("."))
    return str(ei.value)


def test_defaults_are_the_articles() -> None:
    c = parse_cluster(cluster(), Path(".")).config
    g = c.gateway
    assert g.routing == "queue-aware"
    assert g.signals.interval_ms == 100 and g.signals.window == 3
    assert g.forward.retries == 1
    assert c.backends[0].signals.source == "evenserve"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (cluster(gateway={"port": 70000}), "cluster: gateway.port: "),
        (cluster(gateway={"routing": "nope"}), "gateway.routing: unknown routing policy 'nope'"),
        (
            cluster(gateway={"routing": {"policy": "queue-aware", "queue_weight": -1}}),
            "gateway.routing.queue_weight",
        ),
        (cluster(gateway={"signals": {"interval_ms": 0}}), "gateway.signals.interval_ms"),
        (cluster(gateway={"bogus": 1}), "gateway.bogus: Extra inputs are not permitted"),
        (cluster(backends=[{"name": "a", "url": "ftp://x", "models": ["m"]}]), "backends.0.url"),
        (cluster(backends=[{"name": "a", "url": "http://h:1", "models": []}]), "backends.0.models"),
        (
            cluster(backends=[{"name": "a b", "url": "http://h:1", "models": ["m"]}]),
            "backends.0.name",
        ),
        (
            cluster(backends=[{"name": "a", "url": "http://h:1", "models": ["m", ".."]}]),
            "backends.0.models.1: Value error, '..': a model name is a path segment",
        ),
        (
            cluster(
                workers={
                    "repo": "r",
                    "devices": [{"name": "d", "device": "cpu", "models": ["a/b"]}],
                }
            ),
            "workers.devices.0.models.0",
        ),
        (cluster(backends=[]), "no backends"),
        (
            cluster(
                backends=[
                    {"name": "a", "url": "http://h:1", "models": ["m"]},
                    {"name": "a", "url": "http://h:2", "models": ["m"]},
                ]
            ),
            "'a' used twice",
        ),
        (
            cluster(
                backends=[
                    {
                        "name": "a",
                        "url": "http://h:1",
                        "models": ["m"],
                        "signals": {"source": "prometheus", "mapping": "nvidia"},
                    }
                ]
            ),
            "unknown preset 'nvidia'",
        ),
        (
            cluster(
                backends=[
                    {
                        "name": "a",
                        "url": "http://h:1",
                        "models": ["m"],
                        "signals": {"source": "none", "mapping": "triton"},
                    }
                ]
            ),
            "only meaningful with source: prometheus",
        ),
        (
            cluster(workers={"repo": "r", "devices": [{"name": "g", "device": "tpu:0"}]}),
            "workers.devices.0.device",
        ),
        (
            cluster(
                workers={
                    "repo": "r",
                    "devices": [
                        {"name": "g0", "device": "cpu", "port": 9100},
                        {"name": "g1", "device": "cpu", "port": 9100},
                    ],
                }
            ),
            "port: 9100 also used by g0",
        ),
        (
            cluster(
                workers={
                    "repo": "r",
                    "devices": [
                        {"name": "g0", "device": "cpu", "port": 9100},
                        {"name": "g1", "device": "cpu", "port": 9101, "grpc_port": 9100},
                    ],
                }
            ),
            "workers.devices.1.grpc_port: 9100 also used by g0",
        ),
        (
            cluster(
                gateway={"grpc_port": 9201},
                workers={
                    "repo": "r",
                    "devices": [{"name": "g0", "device": "cpu", "port": 9100, "grpc_port": 9201}],
                },
            ),
            "gateway.grpc_port: 9201 also used by worker g0 (gRPC)",
        ),
        (
            cluster(
                backends=[
                    {"name": "b", "url": "http://h:1", "grpc_url": "grpc://h:2", "models": ["m"]}
                ]
            ),
            "expected host:port",
        ),
        ([1, 2], "expected a mapping"),
    ],
)
def test_errors_name_the_field(raw: Any, needle: str) -> None:
    assert needle in error_of(raw)


def test_grpc_forward_is_http_unless_the_gateway_or_a_backend_says_grpc() -> None:
    raw = cluster(
        backends=[
            {"name": "a", "url": "http://h:1", "models": ["m"]},
            {"name": "b", "url": "http://h:2", "grpc_url": "h:3", "grpc_forward": "grpc"},
            {"name": "c", "url": "http://h:4", "grpc_url": "h:5", "grpc_forward": "http"},
        ]
    )
    c = parse_cluster(raw, Path(".")).config
    assert c.gateway.grpc_forward == "http"
    a, b, cc = c.backends
    assert [x.forwards_grpc(c.gateway.grpc_forward) for x in (a, b, cc)] == [False, True, False]
    assert c.gateway.grpc_server == "h2"  # the gateway's own HTTP/2 listener
    raw["gateway"] = {"grpc_forward": "grpc", "grpc_server": "grpcio"}
    c = parse_cluster(raw, Path(".")).config
    assert c.gateway.grpc_server == "grpcio"
    # The gateway's setting is every backend's default; a backend's own setting wins.
    assert [x.forwards_grpc(c.gateway.grpc_forward) for x in c.backends] == [True, True, False]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (
            cluster(backends=[{"name": "b", "url": "http://h:1", "grpc_forward": "grpc"}]),
            "backends.0: Value error, grpc_forward: grpc needs grpc_url",
        ),
        (
            cluster(backends=[{"name": "b", "url": "http://h:1", "grpc_forward": "h2"}]),
            "backends.0.grpc_forward",
        ),
        (cluster(gateway={"grpc_forward": "HTTP"}), "gateway.grpc_forward"),
        (cluster(gateway={"grpc_server": "grpc"}), "gateway.grpc_server"),
    ],
)
def test_a_bad_grpc_forward_names_the_field(raw: Any, needle: str) -> None:
    assert needle in error_of(raw)


def test_prometheus_source_defaults_to_triton_mapping_and_presets_take_overrides() -> None:
    raw = cluster(
        backends=[
            {"name": "t", "url": "http://h:1", "models": ["m"],
             "signals": {"source": "prometheus"}},
            {"name": "u", "url": "http://h:2", "models": ["m"],
             "signals": {"source": "prometheus",
                         "mapping": {"preset": "triton",
                                     "utilization": {"metric": "gpu_pct", "scale": 0.01}}}},
        ]
    )  # fmt: skip
    c = parse_cluster(raw, Path(".")).config
    t, u = c.backends
    assert t.signals.mapping is not None and u.signals.mapping is not None
    assert t.signals.mapping.queue_depth.metric == TRITON_MAPPING["queue_depth"]["metric"]
    assert u.signals.mapping.utilization is not None
    assert u.signals.mapping.utilization.metric == "gpu_pct"
    assert u.signals.mapping.utilization.scale == 0.01
    assert u.signals.mapping.memory_total_bytes is not None


def test_seed_cluster_file_matches_the_seed_scenario_placement() -> None:
    scenario = yaml.safe_load((ROOT / "scenarios" / "seed.yaml").read_text())
    want = {d["name"]: sorted(d["models"]) for d in scenario["devices"]}
    c = load_cluster(ROOT / "examples" / "cluster-seed.yaml")
    assert {b.name: sorted(b.models) for b in c.backends()} == want
    assert [b.url for b in c.backends()] == [
        f"http://127.0.0.1:{8101 + i}" for i in range(len(want))
    ]
    for b in c.backends():
        assert b.profiles is not None
        assert c.profile_dir(b.profiles) == (ROOT / "profiles" / "a10-trt-fp16").resolve()


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_cluster(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gateway: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_cluster(bad)


def test_admin_token_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "s3cret-token-0123")
    c = parse_cluster(cluster(gateway={"admin": {"token_env": "MY_TOKEN"}}), Path("."))
    assert c.configured_admin_token() == AdminToken("s3cret-token-0123", "$MY_TOKEN")
    assert c.resolve_admin_token() == AdminToken("s3cret-token-0123", "$MY_TOKEN")
    c = parse_cluster(cluster(gateway={"admin": {"token": "literal-token-0123"}}), Path("."))
    # The file's token wins over the variable.
    assert c.configured_admin_token() == AdminToken("literal-token-0123", "gateway.admin.token")
    assert c.resolve_admin_token().source == "gateway.admin.token"


def test_no_token_configured_generates_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    c = parse_cluster(cluster(), Path("."))
    assert c.configured_admin_token() is None
    token = c.resolve_admin_token()
    assert token.generated and len(token.value) >= MIN_TOKEN_LENGTH
    assert token.value != c.resolve_admin_token().value


@pytest.mark.parametrize("short", ["x", "y" * (MIN_TOKEN_LENGTH - 1)])
def test_a_short_token_from_the_environment_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, short: str
) -> None:
    monkeypatch.setenv(DEFAULT_TOKEN_ENV, short)
    c = parse_cluster(cluster(), Path("."))
    with pytest.raises(ConfigError) as err:
        c.resolve_admin_token()
    msg = str(err.value)
    assert msg.startswith(f"{DEFAULT_TOKEN_ENV} (the environment variable gateway.admin.token_env")
    assert f"at least {MIN_TOKEN_LENGTH} characters" in msg and short not in msg


def test_a_short_token_in_the_file_is_refused_naming_the_field() -> None:
    msg = error_of(cluster(gateway={"admin": {"token": "abc-short-tok"}}))
    assert "gateway.admin.token: String should have at least 16 characters" in msg
    assert "abc-short-tok" not in msg


def test_the_token_never_shows_in_a_repr() -> None:
    token = AdminToken("very-secret-token-value", "generated")
    assert "very-secret" not in repr(token) and "very-secret" not in str(token)


def test_write_private_is_owner_only_even_over_a_wider_file(tmp_path: Path) -> None:
    target = tmp_path / "ready.json"
    target.write_text("old, longer content")
    target.chmod(0o644)
    write_private(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600
    fresh = write_private(tmp_path / "token", "t")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_worker_devices_take_slices_and_shares() -> None:
    mig = "MIG-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"
    raw = cluster(
        workers={
            "repo": "r",
            "devices": [
                {"name": "g0", "device": "emulated:toy#mig=3g.20gb", "models": ["m"]},
                {"name": "g1", "device": "emulated:toy#share=1/2", "models": ["m"]},
                {"name": "g2", "device": f"cuda:{mig}", "models": ["m"]},
                {"name": "g3", "device": "cuda:0#share=1/2", "models": ["m"]},
            ],
        }
    )
    specs = {b.name: b for b in parse_cluster(raw, Path(".")).backends()}
    assert specs["g0"].profiles == "toy" and specs["g0"].profile_speed == pytest.approx(3 / 7)
    assert specs["g1"].profiles == "toy" and specs["g1"].profile_speed == 1.0
    assert specs["g2"].profiles is None and specs["g3"].profiles is None


def test_a_bad_slice_names_the_device_field() -> None:
    msg = error_of(
        cluster(
            workers={
                "repo": "r",
                "devices": [{"name": "g", "device": "cuda:0#share=3/2", "models": ["m"]}],
            }
        )
    )
    assert "workers.devices.0.device" in msg and "share='3/2'" in msg, msg


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"max_mb": 0}, "gateway.record.max_mb"),
        ({"keep": -1}, "gateway.record.keep"),
        ({"window": "many"}, "gateway.record.window"),
        ({"path": ""}, "gateway.record.path"),
        ({"rotate": 1}, "gateway.record.rotate"),
    ],
)
def test_a_bad_record_section_names_the_field(record: dict[str, Any], needle: str) -> None:
    assert needle in error_of(cluster(gateway={"record": record}))


def test_record_settings_from_the_file_and_the_flags_over_it(tmp_path: Path) -> None:
    assert parse_cluster(cluster(), tmp_path).record_settings() is None
    loaded = parse_cluster(
        cluster(gateway={"record": {"path": "logs/r.jsonl", "max_mb": 2, "keep": 1}}), tmp_path
    )
    s = loaded.record_settings()
    assert s is not None
    assert s.path == (tmp_path / "logs/r.jsonl").resolve()
    assert (s.max_bytes, s.keep, s.window) == (2 * 1024 * 1024, 1, 200_000)
    s = loaded.record_settings(tmp_path / "cli.jsonl", max_mb=1, keep=3, window=10)
    assert s is not None and s.path == tmp_path / "cli.jsonl"
    assert (s.max_bytes, s.keep, s.window) == (1024 * 1024, 3, 10)
    # A flag alone turns it on; the section alone without a path keeps only the window.
    s = parse_cluster(cluster(), tmp_path).record_settings(tmp_path / "x.jsonl")
    assert s is not None and s.keep == 4
    s = parse_cluster(cluster(gateway={"record": {}}), tmp_path).record_settings()
    assert s is not None and s.path is None
    with pytest.raises(ConfigError, match="--record-keep"):
        loaded.record_settings(keep=-1)
