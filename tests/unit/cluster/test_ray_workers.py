"""`evenserve up --ray`, the parts that need no Ray: actor options from a device, the actor's
arguments (the local launcher's), the addresses the gateway reads, the install hint."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from evenserve.cli.gateway_cmd import read_addresses
from evenserve.cluster.file import load_cluster, parse_cluster
from evenserve.cluster.launcher import Launcher, run_up
from evenserve.cluster.processes import Proc
from evenserve.cluster.ray_workers import (
    EMULATED_NUM_CPUS,
    NODE_PIN,
    RAY_MISSING,
    ActorWorker,
    RayPlacement,
    actor_env,
    actor_options,
)
from evenserve.cluster.workers_section import DeviceEntry
from evenserve.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "examples" / "cluster-seed.yaml"


def dev(device: str, **kw: object) -> DeviceEntry:
    return DeviceEntry.model_validate({"name": "d", "device": device, **kw})


def test_a_gpu_worker_asks_for_its_gpu_a_share_for_its_part() -> None:
    whole = actor_options(dev("cuda:1"))
    assert whole["num_gpus"] == 1 and whole["num_cpus"] == EMULATED_NUM_CPUS
    assert actor_options(dev("cuda:0#share=1/2"))["num_gpus"] == 0.5
    mig = actor_options(dev("cuda:MIG-5c5a4d5e-0000-0000-0000-000000000000"))
    assert mig["num_gpus"] == 0  # a UUID names one node's slice: pinned with ray_node
    # Ray restarts the actor when its process dies, and retries its (idempotent) calls.
    assert whole["max_restarts"] == -1 and whole["max_task_retries"] == -1
    assert "resources" not in whole


def test_emulated_and_cpu_workers_ask_for_cpu_only() -> None:
    em = actor_options(dev("emulated:a10-trt-fp16"))
    assert em["num_gpus"] == 0 and em["num_cpus"] == EMULATED_NUM_CPUS < 1
    cpu = actor_options(dev("cpu"))
    assert cpu["num_gpus"] == 0 and cpu["num_cpus"] == 1


def test_ray_node_pins_the_actor_to_that_node() -> None:
    opts = actor_options(dev("emulated:a10-trt-fp16", ray_node="10.0.0.7"))
    assert opts["resources"] == {"node:10.0.0.7": NODE_PIN}


def test_the_actor_adds_only_what_the_launcher_adds_and_leaves_gpus_to_ray() -> None:
    base = {"PATH": "/bin", "HOME": "/h"}
    env = {**base, "CUDA_VISIBLE_DEVICES": "3", "EVENSERVE_ADMIN_TOKEN": "t"}
    assert actor_env("cuda:0", env, base) == {"EVENSERVE_ADMIN_TOKEN": "t"}
    env = {**base, "CUDA_VISIBLE_DEVICES": "", "EVENSERVE_ADMIN_TOKEN": "t"}
    assert actor_env("emulated:x", env, base) == {
        "CUDA_VISIBLE_DEVICES": "",
        "EVENSERVE_ADMIN_TOKEN": "t",
    }
    mig = "cuda:MIG-5c5a4d5e-0000-0000-0000-000000000000"
    env = {**base, "CUDA_VISIBLE_DEVICES": mig.removeprefix("cuda:")}
    assert actor_env(mig, env, base) == {"CUDA_VISIBLE_DEVICES": mig.removeprefix("cuda:")}


def test_each_actor_gets_the_local_launcher_s_worker_arguments(tmp_path: Path) -> None:
    local = Launcher(load_cluster(SEED), SEED, tmp_path, python="py")
    local.plan()
    ray = Launcher(load_cluster(SEED), SEED, tmp_path, python="py", ray=RayPlacement())
    ray.plan()
    # The token: the same one in both plans (their workers' env carries it).
    ray.token = local.token
    assert len(ray.workers) == len(local.workers) == 4
    for lw, rw in zip(local.workers, ray.workers, strict=True):
        assert isinstance(lw, Proc) and isinstance(rw, ActorWorker)
        assert rw.name == lw.name and rw.url == lw.url and rw.log_path == lw.log_path
        assert lw.cmd[:3] == ["py", "-m", "evenserve"]
        assert rw.argv == lw.cmd[3:]  # the interpreter is the actor's node's own
        assert rw.options == actor_options(dev("emulated:a10-trt-fp16"))
        assert rw.env["CUDA_VISIBLE_DEVICES"] == ""
        assert "EVENSERVE_ADMIN_TOKEN" in rw.env and "PATH" not in rw.env
        assert rw.bind_host == "127.0.0.1"
    assert ray.gateway is not None and local.gateway is not None
    assert ray.gateway.cmd[-2:] == ["--worker-addresses", str(ray.addresses_file)]
    assert "--worker-addresses" not in local.gateway.cmd


def test_the_gateway_reads_the_actors_addresses(tmp_path: Path) -> None:
    cluster = load_cluster(SEED)
    moved = cluster.with_worker_addresses({"gpu1": "10.0.0.7:9001"})
    urls = {b.name: b.url for b in moved.backends()}
    assert urls["gpu1"] == "http://10.0.0.7:9001"
    assert urls["gpu0"] == "http://127.0.0.1:8101"  # the others as configured
    assert {b.name: b.url for b in cluster.backends()}["gpu1"] == "http://127.0.0.1:8102"
    with pytest.raises(ConfigError, match="'gpu9' is not a worker"):
        cluster.with_worker_addresses({"gpu9": "h:1"})
    with pytest.raises(ConfigError, match="gpu1: expected host:port"):
        cluster.with_worker_addresses({"gpu1": "nohost"})
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"gpu0": "127.0.0.1:8101"}))
    assert read_addresses(f) == {"gpu0": "127.0.0.1:8101"}
    f.write_text("[1]")
    with pytest.raises(ConfigError, match="--worker-addresses"):
        read_addresses(f)


def test_a_device_host_is_where_the_gateway_reaches_it(tmp_path: Path) -> None:
    (tmp_path / "repo" / "m").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "model.yaml").write_text("runtime: emulated\n")
    raw = {
        "workers": {
            "repo": "repo",
            "devices": [
                {"name": "a", "device": "cpu", "host": "10.1.1.1", "port": 9000},
                {"name": "b", "device": "cpu", "ray_node": "10.1.1.2"},
            ],
        }
    }
    urls = [b.url for b in parse_cluster(raw, tmp_path).backends()]
    assert urls == ["http://10.1.1.1:9000", "http://127.0.0.1:8102"]


def test_ray_without_ray_installed_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError) as exc:
        run_up(load_cluster(SEED), SEED, log_dir=tmp_path, ray_address="auto", say=lambda s: None)
    assert str(exc.value) == RAY_MISSING
    assert "pip install 'evenserve[ray]'" in RAY_MISSING
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_up_without_ray_never_imports_ray(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from evenserve.cli.main import main\n"
        "from evenserve.cluster.file import load_cluster\n"
        "from evenserve.cluster.launcher import Launcher\n"
        f"la = Launcher(load_cluster(Path({str(SEED)!r})), Path({str(SEED)!r}), "
        f"Path({str(tmp_path)!r}))\n"
        "la.plan()\n"
        "print('ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class FakeRay(types.ModuleType):
    """Just enough of ``ray`` for ActorWorker's liveness rules: ``get`` answers from a script."""

    def __init__(self) -> None:
        super().__init__("ray")
        ex = types.SimpleNamespace()
        ex.RayError = type("RayError", (Exception,), {})
        ex.RayActorError = type("RayActorError", (ex.RayError,), {})
        ex.ActorDiedError = type("ActorDiedError", (ex.RayActorError,), {})
        ex.ActorUnavailableError = type("ActorUnavailableError", (ex.RayActorError,), {})
        ex.GetTimeoutError = type("GetTimeoutError", (ex.RayError, TimeoutError), {})
        self.exceptions = ex
        self.answers: list[object] = []
        self.killed: list[object] = []

    def get(self, ref: object, timeout: float | None = None) -> object:
        a = self.answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return a

    def kill(self, handle: object, no_restart: bool = False) -> None:
        self.killed.append((handle, no_restart))


class Handle:
    def __getattr__(self, name: str) -> object:
        return types.SimpleNamespace(remote=lambda *a: name)


def _actor(tmp_path: Path) -> ActorWorker:
    a = ActorWorker("w", ["worker"], {}, "http://127.0.0.1:1", tmp_path / "w.log", {}, "127.0.0.1")
    a.handle = Handle()
    return a


def test_an_actor_ray_is_restarting_counts_as_alive_one_gone_for_good_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    a = _actor(tmp_path)
    ex = ray.exceptions
    for answer, alive in [
        (None, True),  # the worker runs
        (ex.GetTimeoutError(), True),  # Ray is restarting the actor: not ours to restart
        (ex.ActorUnavailableError(), True),
        (ex.ActorDiedError(), False),  # gone for good: `up` makes a new one
    ]:
        ray.answers.append(answer)
        a._checked = 0.0
        assert a.alive() is alive, answer
    assert a.handle is None and a.exit_code() is None
    b = _actor(tmp_path)
    ray.answers.append(-9)  # the worker exited, the actor lives
    assert not b.alive() and b.exit_code() == -9
    handle = b.handle
    b.close_log()  # after a stop: the actor ends too, for good
    assert ray.killed == [(handle, True)] and b.handle is None
