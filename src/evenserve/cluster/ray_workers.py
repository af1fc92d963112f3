"""``evenserve up --ray``: every device's worker placed as a Ray actor.

Theory of operation. The worker is the same program with the same flags as without Ray: the
launcher builds its command line once (``Launcher.plan``) and, with ``--ray``, hands the
arguments after the interpreter to a small actor, ``ray_worker_host.WorkerHost``, instead of
starting them itself. The actor runs ``<its node's python> -m evenserve <those arguments>`` as
a subprocess on the node Ray placed it on, its output in the same log path (created on that
node), and supervises it: ``poll`` (exit code or None), ``signal`` (SIGTERM drains, as
locally), ``ensure_running`` (start it again if it exited). ``ActorWorker`` is the launcher's
handle on such an actor, with the interface of a local process (``processes.WorkerProc``).

Placement (``actor_options``, pure): a ``cuda`` device asks for its GPU (``num_gpus`` 1, a
share ``#share=K/M`` K/M, so two shares fit one GPU) and runs as ``cuda:0`` on whichever GPU
Ray gives it (Ray sets CUDA_VISIBLE_DEVICES in the actor); a MIG slice keeps its UUID, asks
for no Ray GPU and belongs pinned to its node with ``ray_node``; an
emulated device asks for ``EMULATED_NUM_CPUS`` of a CPU and no GPU, a ``cpu`` device one
CPU. A device's ``ray_node: IP`` pins it to that node (the node's own resource
``node:IP``).

Addresses: a worker on the launcher's own node binds ``workers.host`` (127.0.0.1 by
default), exactly as locally; on another node the actor adds ``--host <node IP>`` and the
worker binds that. Each actor reports ``host:port``; the launcher writes them to
``worker-addresses.json`` in the log folder and the gateway reads it
(``--worker-addresses``), so it routes to wherever the workers run.

What restarts what: an actor whose process dies (killed, its node lost) is restarted by Ray
(``max_restarts=-1``); its constructor starts the worker again. A worker that exits while its
actor lives is restarted by the launcher's supervision loop, as a local process is
(``workers.restart``): it ends that actor and makes a new one. An actor that is gone for
good (Ray gave up on it) is made anew the same way. Either way the gateway's health polling
ejects the backend while it does not answer and readmits it once it does. The worker
subprocess dies with its actor (PR_SET_PDEATHSIG, SIGKILL: nothing is left holding its port).

Ray is optional (``pip install 'evenserve[ray]'``): this module imports it only inside the
functions that need it, and the launcher imports this module only with ``--ray``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evenserve.cluster.processes import WorkerProc, cli_cmd, without_startup_loads
from evenserve.cluster.ray_worker_host import WorkerHost
from evenserve.cluster.workers_section import DeviceEntry
from evenserve.core.errors import ConfigError
from evenserve.runtime.device import parse_device

#: What an emulated worker asks of a CPU: it sleeps through its batches, so four of them on
#: one core leave room for the gateway and the load.
EMULATED_NUM_CPUS = 0.25
#: A ``node:IP`` resource request that pins an actor to that node without using it up.
NODE_PIN = 0.001
#: The hint when ``--ray`` is given without Ray installed.
RAY_MISSING = "--ray: Ray is not installed: pip install 'evenserve[ray]'"


def import_ray() -> Any:
    """The ``ray`` module, or ConfigError with the install hint."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def actor_options(d: DeviceEntry) -> dict[str, Any]:
    """The Ray actor options for device ``d``'s worker (pure: no Ray needed)."""
    target = parse_device(d.device)
    # Restarted by Ray when its process dies; its calls (all idempotent) retried across that.
    opts: dict[str, Any] = {"max_restarts": -1, "max_task_retries": -1}
    if target.kind == "cuda":
        opts["num_gpus"] = gpu_part(d.device)
        opts["num_cpus"] = EMULATED_NUM_CPUS
    elif target.kind == "cpu":
        opts["num_gpus"] = 0
        opts["num_cpus"] = 1
    else:
        opts["num_gpus"] = 0
        opts["num_cpus"] = EMULATED_NUM_CPUS
    if d.ray_node is not None:
        opts["resources"] = {f"node:{d.ray_node}": NODE_PIN}
    return opts


def gpu_part(device: str) -> float:
    """How much of a Ray GPU a ``cuda`` worker asks for: a whole GPU 1, a share K/M its
    part; a MIG slice none (it names one GPU's slice by UUID: pin it with ``ray_node``)."""
    target = parse_device(device)
    if target.mig_uuid is not None:
        return 0.0
    if target.slice is not None and target.slice.share is not None:
        return target.slice.share.fraction
    return 1.0


def actor_env(device: str, env: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """What the actor adds to its own environment for the worker: the launcher's worker
    environment less what it took from the launcher's own (``base``), and, for a whole GPU
    or a share, without CUDA_VISIBLE_DEVICES: Ray chose the actor's GPU and set it."""
    out = {k: v for k, v in env.items() if base.get(k) != v}
    target = parse_device(device)
    if target.kind == "cuda" and target.mig_uuid is None:
        out.pop("CUDA_VISIBLE_DEVICES", None)
    return out


def connect(address: str, say: Any = print) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the running one, else a new local one
    on this machine, no dashboard). True when this call started Ray (``disconnect`` stops
    it then)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    # ray.init sets its own SIGTERM handler (exit at once); the launcher's drains first.
    main = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGTERM) if main else None
    try:
        return _init(ray, address, say)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _init(ray: Any, address: str, say: Any) -> bool:
    quiet = {"log_to_driver": False, "configure_logging": False}
    if address != "auto":
        ray.init(address=address, **quiet)
        say(f"ray: joined the cluster at {address}")
        return False
    try:
        ray.init(address="auto", **quiet)
        say("ray: joined the running cluster")
        return False
    except ConnectionError:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
        say("ray: no running cluster; started a local one")
        return True


def disconnect() -> None:
    ray = import_ray()
    if ray.is_initialized():
        ray.shutdown()


@dataclass
class RayPlacement:
    """``--ray ADDRESS`` (or ``auto``)."""

    address: str = "auto"
    #: Whether this run started Ray (``connect``): ``stop_actors`` stops it then.
    started: bool = False


@dataclass
class ActorWorker:
    """The launcher's handle on one worker actor: the ``Proc`` interface over Ray."""

    name: str
    argv: list[str]
    env: dict[str, str]
    url: str
    log_path: Path
    options: dict[str, Any]
    bind_host: str
    restarts: int = 0
    handle: Any = None
    last_info: dict[str, Any] = field(default_factory=dict)
    _code: int | None = None
    _checked: float = 0.0
    _alive: bool = False

    #: Seconds a liveness answer is reused (the supervision loop polls every 200 ms).
    CHECK_EVERY_S = 0.5
    #: Seconds to wait for an actor's answer.
    CALL_TIMEOUT_S = 5.0

    def start(self, *, bare: bool = False) -> None:
        """A new actor (its worker starts in its constructor), or, when the actor lives and
        its worker exited, that worker again. ``bare``: without its startup loads."""
        ray = import_ray()
        if self.handle is not None:
            try:
                ray.get(self.handle.ensure_running.remote(bare), timeout=self.CALL_TIMEOUT_S)
                self._fresh()
                return
            except ray.exceptions.ActorDiedError:
                self.handle = None  # gone for good (Ray restarts it otherwise): a new one
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                return  # Ray is restarting it; its constructor starts the worker
        cls = ray.remote(WorkerHost)
        launcher_node = ray.get_runtime_context().get_node_id()
        argv = without_startup_loads(self.argv) if bare else self.argv
        self.handle = cls.options(**self.options).remote(
            argv, self.env, str(self.log_path), self.bind_host, launcher_node
        )
        self._fresh()

    def _fresh(self) -> None:
        self._code = None
        self._checked = 0.0
        self.refresh()

    def refresh(self) -> dict[str, Any]:
        """Ask the actor where its worker listens (blocks until the actor is up)."""
        ray = import_ray()
        self.last_info = ray.get(self.handle.info.remote(), timeout=120.0)
        self.url = f"http://{self.last_info['address']}"
        return self.last_info

    @property
    def pid(self) -> int | None:
        pid = self.last_info.get("pid")
        return None if pid is None else int(pid)

    @property
    def actor_pid(self) -> int | None:
        pid = self.last_info.get("actor_pid")
        return None if pid is None else int(pid)

    def alive(self) -> bool:
        """Whether the worker runs. An actor Ray is restarting counts as alive (its
        constructor starts the worker); one gone for good, or a worker that exited, not."""
        if self.handle is None:
            return False
        now = time.monotonic()
        if now - self._checked < self.CHECK_EVERY_S:
            return self._alive
        ray = import_ray()
        self._checked = now
        try:
            self._code = ray.get(self.handle.poll.remote(), timeout=self.CALL_TIMEOUT_S)
            self._alive = self._code is None
        except ray.exceptions.ActorDiedError:  # gone for good: start() makes a new one
            self._alive, self._code = False, None
            self.handle = None
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            self._alive = True  # restarting (Ray's business) or slow to answer
        return self._alive

    def exit_code(self) -> int | None:
        return self._code

    def signal(self, sig: int) -> None:
        if self.handle is None:
            return
        ray = import_ray()
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self.handle.signal.remote(sig), timeout=self.CALL_TIMEOUT_S)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the worker exits; True when it did within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._checked = 0.0
            if not self.alive():
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def close_log(self) -> None:
        """Called once the worker stopped (drained, scaled down, or exited before a restart):
        its actor ends too (it holds the log), so Ray never restarts a worker meant to be
        off, and a restart is a fresh actor."""
        if not self.alive():
            self.kill_actor()

    def kill_actor(self) -> None:
        """End the actor for good (after its worker stopped): ``ray.kill``, no restart."""
        if self.handle is None:
            return
        ray = import_ray()
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(self.handle, no_restart=True)
        self.handle = None


def actor_worker(
    d: DeviceEntry,
    cmd: list[str],
    env: dict[str, str],
    base_env: dict[str, str],
    url: str,
    log: Path,
    bind_host: str,
) -> ActorWorker:
    """Device ``d``'s worker as a Ray actor, from its local command line ``cmd`` and
    environment ``env``: the arguments after the interpreter's (the actor's node runs its
    own), what the environment adds to the launcher's (``base_env``), the actor's options."""
    argv = cmd[len(cli_cmd("")) :]
    dev = argv[argv.index("--device") + 1]
    return ActorWorker(
        d.name, argv, actor_env(dev, env, base_env), url, log,
        actor_options(d), bind_host,
    )  # fmt: skip


def actor_summary(p: WorkerProc) -> dict[str, Any]:
    """What the ready file says of a worker's actor (its pid on its node, its node, its
    starts); {} for a worker that is not an actor's."""
    if not isinstance(p, ActorWorker):
        return {}
    i = p.last_info
    return {"ray": {k: i.get(k) for k in ("actor_pid", "node_id", "starts")}}


def stop_actors(workers: Sequence[WorkerProc], placement: RayPlacement) -> None:
    """Every actor ended for good (once their workers stopped); Ray stopped when this run
    started it."""
    for p in workers:
        if isinstance(p, ActorWorker):
            p.kill_actor()
    if placement.started:
        disconnect()
