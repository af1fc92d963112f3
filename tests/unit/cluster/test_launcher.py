"""`evenserve up` planning: commands, GPU pinning, placement, failures named clearly."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV
from evenserve.cluster.file import load_cluster, parse_cluster
from evenserve.cluster.launcher import Launcher
from evenserve.cluster.processes import LaunchError
from evenserve.cluster.worker_commands import device_arg, worker_env
from evenserve.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_gpu_pinning_and_emulated_devices() -> None:
    dev, env = worker_env("cuda:3", {"PATH": "/bin"})
    assert dev == "cuda:0" and env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin"
    dev, env = worker_env("emulated:a10-trt-fp16", {})
    assert dev == "emulated:a10-trt-fp16" and env["CUDA_VISIBLE_DEVICES"] == ""


def test_pinning_shares_and_mig_slices() -> None:
    dev, env = worker_env("cuda:2#share=1/2", {})
    assert dev == "cuda:0#share=1/2" and env["CUDA_VISIBLE_DEVICES"] == "2"
    mig = "MIG-4f2d8c1e-93a7-5b11-8a3e-0123456789ab"
    dev, env = worker_env(f"cuda:{mig}", {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert dev == f"cuda:{mig}" and env["CUDA_VISIBLE_DEVICES"] == mig
    dev, env = worker_env("emulated:a10-trt-fp16#mig=3g.20gb", {})
    assert dev == "emulated:a10-trt-fp16#mig=3g.20gb" and env["CUDA_VISIBLE_DEVICES"] == ""


def test_an_emulated_slice_keeps_its_part_when_its_profile_set_is_resolved(
    tmp_path: Path,
) -> None:
    cfg = ROOT / "examples" / "cluster-seed.yaml"
    arg = device_arg(load_cluster(cfg), "emulated:a10-trt-fp16#mig=3g.20gb")
    where, _, tail = arg.removeprefix("emulated:").partition("#")
    assert Path(where).is_dir() and Path(where).name == "a10-trt-fp16"
    assert tail == "mig=3g.20gb"


def test_seed_plan_one_worker_per_device_with_placement(tmp_path: Path) -> None:
    cfg = ROOT / "examples" / "cluster-seed.yaml"
    la = Launcher(load_cluster(cfg), cfg, tmp_path, python="py")
    la.plan()
    assert [p.name for p in la.workers] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    cmd = la.workers[2].cmd
    assert cmd[0] == "py" and cmd[3] == "worker"
    assert cmd[cmd.index("--port") + 1] == "8103"
    assert cmd[cmd.index("--models") + 1] == "resnet50"
    assert cmd[cmd.index("--repo") + 1] == str(ROOT / "examples" / "models" / "emulated")
    a10 = (ROOT / "profiles" / "a10-trt-fp16").resolve()  # profiles/ links to the package's
    assert cmd[cmd.index("--device") + 1] == f"emulated:{a10}"
    assert "bert-base" in la.workers[0].cmd[la.workers[0].cmd.index("--models") + 1]
    assert la.workers[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert la.gateway is not None and la.gateway.cmd[3:5] == ["gateway", "--config"]
    assert la.gateway.env["EVENSERVE_ADMIN_TOKEN"] == la.admin_token
    # The workers get the gateway's token (it pushes parameters with it): in the
    # environment only, never on a command line.
    for w in la.workers:
        assert w.env["EVENSERVE_ADMIN_TOKEN"] == la.admin_token
        assert not any(la.admin_token in arg for arg in w.cmd)
    assert not any(la.admin_token in arg for arg in la.gateway.cmd)


def test_model_not_in_repo_is_named(tmp_path: Path) -> None:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    raw = {
        "workers": {
            "repo": "repo",
            "devices": [{"name": "g0", "device": "cpu", "models": ["a", "zzz"]}],
        }
    }
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path / "logs")
    with pytest.raises(ConfigError, match=r"workers.devices.0.models: zzz not in .* \(has: a\)"):
        la.plan()


def test_triton_model_folders_count_as_the_repository_s_models(tmp_path: Path) -> None:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    (tmp_path / "repo" / "t").mkdir()
    (tmp_path / "repo" / "t" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    (tmp_path / "repo" / "neither").mkdir()
    raw = {"workers": {"repo": "repo", "devices": [{"name": "g0", "device": "cpu"}]}}
    assert parse_cluster(raw, tmp_path).repo_models() == ["a", "t"]


def test_busy_port_and_dying_worker_fail_clearly(tmp_path: Path) -> None:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    # The worker's port is one the kernel just handed out, not busy + 1: on a shared machine
    # the port after a free one may well be taken by someone else.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        raw = {
            "gateway": {"port": busy},
            "workers": {"repo": "repo", "base_port": free,
                        "devices": [{"name": "g0", "device": "cpu", "port": free}]},
        }  # fmt: skip
        la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path)
        la.plan()
        with pytest.raises(LaunchError, match="ports already in use: gateway"):
            la.start()
    # A "python" that exits at once: the worker dies while starting, its log is quoted.
    raw["gateway"] = {"port": busy}
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="false")
    la.plan()
    with pytest.raises(LaunchError, match="g0 exited with code 1 while starting"):
        la.start()
    la.stop()


def test_busy_gateway_grpc_port_is_named(tmp_path: Path) -> None:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    with socket.socket() as f1, socket.socket() as f2:
        f1.bind(("127.0.0.1", 0))
        f2.bind(("127.0.0.1", 0))
        free = [f1.getsockname()[1], f2.getsockname()[1]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        raw = {
            "gateway": {"port": free[0], "grpc_port": busy},
            "workers": {"repo": "repo", "devices": [{"name": "g0", "device": "cpu",
                                                     "port": free[1]}]},
        }  # fmt: skip
        la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="py")
        la.plan()
        with pytest.raises(LaunchError, match=f"gateway gRPC \\(127.0.0.1:{busy}\\)"):
            la.start()


def _token_cluster(tmp_path: Path, **admin: str) -> Launcher:
    (tmp_path / "repo" / "a").mkdir(parents=True, exist_ok=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    raw = {
        "gateway": {"admin": admin},
        "workers": {"repo": "repo", "devices": [{"name": "g0", "device": "cpu"}]},
    }
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="py")
    la.plan()
    return la


def test_a_token_in_the_cluster_file_is_the_one_used_and_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEFAULT_TOKEN_ENV, "another-token-from-env")
    la = _token_cluster(tmp_path, token="the-file-token-0123456")
    assert la.admin_token == "the-file-token-0123456"
    assert la.gateway is not None and la.gateway.env[DEFAULT_TOKEN_ENV] == la.admin_token
    assert la.write_token_file() is None  # nothing generated: nothing written
    assert la.summary()["admin_token"] == la.admin_token  # the ready file (0600) holds it
    lines: list[str] = []
    la.say = lines.append
    la.print_summary()
    text = "\n".join(lines)
    assert "the-file-token-0123456" not in text and "gateway.admin.token" in text


def test_a_generated_token_is_written_0600_and_never_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEFAULT_TOKEN_ENV, raising=False)
    la = _token_cluster(tmp_path)
    assert la.token is not None and la.token.generated
    where = la.write_token_file()
    assert where == tmp_path / "admin-token" and where.read_text() == la.admin_token + "\n"
    assert stat.S_IMODE(where.stat().st_mode) == 0o600
    assert la.gateway is not None and la.gateway.env[DEFAULT_TOKEN_ENV] == la.admin_token
    lines: list[str] = []
    la.say = lines.append
    la.print_summary()
    text = "\n".join(lines)
    assert la.admin_token not in text and str(where) in text


def test_a_short_token_in_the_environment_stops_up_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEFAULT_TOKEN_ENV, "x")
    with pytest.raises(ConfigError, match=f"^{DEFAULT_TOKEN_ENV} .*at least 16 characters"):
        _token_cluster(tmp_path)


def test_device_grpc_port_is_passed_and_routed(tmp_path: Path) -> None:
    (tmp_path / "repo" / "a").mkdir(parents=True)
    (tmp_path / "repo" / "a" / "model.yaml").write_text("runtime: emulated\n")
    raw = {
        "gateway": {"grpc_port": 9000},
        "workers": {
            "repo": "repo",
            "devices": [
                {"name": "g0", "device": "cpu", "port": 9101, "grpc_port": 9201},
                {"name": "g1", "device": "cpu", "port": 9102},
            ],
        },
    }
    cluster = parse_cluster(raw, tmp_path)
    la = Launcher(cluster, tmp_path / "c.yaml", tmp_path)
    la.plan()
    g0, g1 = (w.cmd for w in la.workers)
    assert g0[g0.index("--grpc-port") + 1] == "9201" and "--grpc-port" not in g1
    assert [b.grpc_url for b in cluster.backends()] == ["127.0.0.1:9201", None]


def _placement_cluster(tmp_path: Path) -> dict[str, object]:
    for m in ("a", "b"):
        (tmp_path / "repo" / m).mkdir(parents=True, exist_ok=True)
        (tmp_path / "repo" / m / "model.yaml").write_text("runtime: emulated\n")
    return {
        "gateway": {
            "placement": {"policy": "lru", "load_wait_ms": 2500},
            "autoscaling": {"policy": "demand"},
        },
        "workers": {
            "repo": "repo",
            "devices": [
                {"name": "g0", "device": "cpu", "models": ["a"]},
                {"name": "g1", "device": "cpu", "active": False},
            ],
        },
    }


def test_under_placement_workers_run_explicit_with_their_models_and_a_spare_waits(
    tmp_path: Path,
) -> None:
    raw = _placement_cluster(tmp_path)
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="py")
    la.plan()
    g0, g1 = (p.cmd for p in la.workers)
    assert g0[g0.index("--model-control") + 1] == "explicit"
    assert [g0[i + 1] for i, a in enumerate(g0) if a == "--load-model"] == ["a"]
    assert g0[g0.index("--load-wait-ms") + 1] == "2500"
    assert "--models" not in g0
    assert g1[g1.index("--model-control") + 1] == "explicit" and "--load-model" not in g1
    assert la.on == {"g0"}


def test_host_memory_gives_every_worker_one_pool_removed_at_stop(tmp_path: Path) -> None:
    raw = _placement_cluster(tmp_path)
    gw = raw["gateway"]
    assert isinstance(gw, dict)
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="py")
    la.plan()
    assert la.host_pool is None and "--host-pool" not in la.workers[0].cmd  # 0 GB: no pool
    gw["placement"] = {"policy": "lru", "host_memory_gb": 1.5}
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, python="py")
    la.plan()
    pool = la.host_pool
    assert pool is not None and pool.is_dir()
    for p in la.workers:  # one directory for all: a model unloaded on g0 is warm on g1
        assert p.cmd[p.cmd.index("--host-pool") + 1] == str(pool)
        assert p.cmd[p.cmd.index("--host-pool-gb") + 1] == "1.5"
    (pool / "m-0.entry").write_bytes(b"x")
    la.stop()
    assert not pool.exists() and la.host_pool is None


def test_spares_and_autoscaling_are_validated_naming_the_field(tmp_path: Path) -> None:
    raw = _placement_cluster(tmp_path)
    del raw["gateway"]  # a spare without an autoscaler: nothing would turn it on
    with pytest.raises(ConfigError, match=r"workers.devices.1.active"):
        parse_cluster(raw, tmp_path)
    raw = _placement_cluster(tmp_path)
    raw["gateway"] = {"placement": {"policy": "nope"}, "autoscaling": "demand"}
    with pytest.raises(ConfigError, match=r"gateway.placement"):
        parse_cluster(raw, tmp_path)
    raw["gateway"] = {"placement": {"policy": "lru", "interval_ms": 0}, "autoscaling": "demand"}
    with pytest.raises(ConfigError, match=r"gateway.placement.interval_ms"):
        parse_cluster(raw, tmp_path)
    raw["gateway"] = {"placement": "lru", "autoscaling": {"policy": "demand", "bad": 1}}
    with pytest.raises(ConfigError, match=r"gateway.autoscaling"):
        parse_cluster(raw, tmp_path)
    raw["gateway"] = {"autoscaling": "demand"}
    with pytest.raises(ConfigError, match=r"gateway.autoscaling: needs gateway.placement"):
        parse_cluster(raw, tmp_path)


def test_the_scale_channel_starts_a_spare_and_stops_it_after_the_gateway_drained_it(
    tmp_path: Path,
) -> None:
    import sys
    import time

    raw = _placement_cluster(tmp_path)
    said: list[str] = []
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, say=said.append)
    la.plan()
    g1 = la.workers[1]
    g1.cmd = [sys.executable, "-c", "import time; time.sleep(120)"]  # a worker stand-in
    assert not g1.alive()
    # The gateway asks for g1 (a ScaleUp): started once, however often it is asked.
    assert la.scale_step([{"device": "g1", "action": "start"}]) == []
    pid = g1.pid
    assert g1.alive() and "g1" in la.on
    assert la.scale_step([{"device": "g1", "action": "start"}]) == []
    assert g1.pid == pid
    # Drained at the gateway (``stop``): SIGTERM, then reported stopped once it has exited.
    reports = la.scale_step([{"device": "g1", "action": "stop"}])
    deadline = time.monotonic() + 60
    while not reports:
        assert time.monotonic() < deadline
        time.sleep(0.02)
        reports = la.scale_step([{"device": "g1", "action": "stop"}])
    assert reports == [{"device": "g1", "event": "stopped"}]
    assert not g1.alive() and "g1" not in la.on
    assert la.scale_step([]) == []  # reported once
    assert any("scale up: started worker g1" in s for s in said)
    assert any("scale down: worker g1 stopped" in s for s in said)


def test_the_scale_channel_starts_a_device_without_its_startup_loads(tmp_path: Path) -> None:
    # The controller counts a device turned on as empty (device_ready), as the simulator
    # starts it: a device turned off and on again must not come back with its configured
    # models (an LLM awake at once, a load nobody decided and no load time paid).
    import sys
    import time

    raw = _placement_cluster(tmp_path)
    la = Launcher(parse_cluster(raw, tmp_path), tmp_path / "c.yaml", tmp_path, say=lambda s: None)
    la.plan()
    g0 = la.workers[0]
    assert "--load-model" in g0.cmd  # its configured models, at ``up``
    seen = tmp_path / "argv"
    stand_in = (
        f"import sys, time; open({str(seen)!r}, 'w').write(' '.join(sys.argv)); time.sleep(120)"
    )
    g0.cmd = [sys.executable, "-c", stand_in, "--load-model", "a", "--port", "1"]
    if "g0" in la.on:  # on at ``up`` (not started here): turned off first
        assert la.scale_step([{"device": "g0", "action": "stop"}]) == [
            {"device": "g0", "event": "stopped"}
        ]
    la.scale_step([{"device": "g0", "action": "start"}])
    deadline = time.monotonic() + 60
    while not seen.exists() or not seen.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert seen.read_text().split() == ["-c", "--port", "1"]
    g0.signal(15)
    g0.wait(30)
    g0.close_log()


def test_without_startup_loads_drops_each_load_model_pair() -> None:
    from evenserve.cluster.processes import without_startup_loads

    argv = ["worker", "--load-model", "a", "--repo", "r", "--load-model", "b", "--x"]
    assert without_startup_loads(argv) == ["worker", "--repo", "r", "--x"]
    assert without_startup_loads(["worker"]) == ["worker"]
