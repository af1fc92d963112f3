"""``evenserve up --ray``: every device's worker placed as a Ray actor.

Theory of operation. The worker is the same program with the same flags as without Ray: the
launcher builds its command line once (``Launcher.plan``) and, with ``--ray``, hands the
arguments after the interpreter to a small actor, ``WorkerHost``, instead of starting them
itself. The actor runs ``<its node's python> -c CLI_BOOT <those arguments>`` as a subprocess
on the node Ray placed it on, its output in the same log path (created on that node), and
supervises it: ``poll`` (exit code or None), ``signal`` (SIGTERM drains, as locally),
``ensure_running`` (start it again if it exited). Why a subprocess and not the worker's server
inside the actor's process: the worker owns its event loop, its signal handlers and (on a
GPU) its CUDA context; in a subprocess those are exactly what the local launcher runs, and a
worker that crashes takes only itself down, not the actor that reports it.

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
good (Ray gave up on it) is made anew the same way. Either way the gateway's health polling ejects
the backend while it does not answer and readmits it once it does. The worker subprocess
dies with its actor (PR_SET_PDEATHSIG, SIGKILL: nothing is left holding its port).

Ray is optional (``pip install 'evenserve[ray]'``): this module imports it only inside the
functions that need it, and the launcher imports this module only with ``--ray``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from evenserve.core.errors import ConfigError
from evenserve.gateway.config import DeviceEntry
from evenserve.runtime.device import parse_device

#: What an emulated worker asks of a CPU: it sleeps through its batches, so four of them on
#: one core leave room for the gateway and the load.
EMULATED_NUM_CPUS = 0.25
#: A ``node:IP`` resource request that pins an actor to that node without using it up.
NODE_PIN = 0.001
#: The hint when ``--ray`` is given without Ray installed.
RAY_MISSING = "--ray: Ray is not installed: pip install 'evenserve[ray]'"
#: How a worker subprocess boots (the launcher's ``CLI_BOOT``; repeated here so the actor's
#: node needs only this module).
CLI_BOOT = "from evenserve.cli.main import main; main()"


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


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class WorkerHost:
    """The actor's body (``ray.remote`` of it): runs one worker subprocess on its node.

    ``argv``: the worker's arguments after the interpreter (``worker --repo ...``), as the
    local launcher runs them. ``env``: added to the actor's environment. ``log_path``: where
    the worker's output goes on this node. ``host``: the bind address when this actor is on
    ``launcher_node`` (the launcher's node); elsewhere the node's IP. Plain Python: the
    constructor starts the worker, so an actor Ray restarts starts it again."""

    def __init__(
        self, argv: list[str], env: dict[str, str], log_path: str, host: str, launcher_node: str
    ) -> None:
        import ray

        ctx = ray.get_runtime_context()
        self.node_id: str = ctx.get_node_id()
        local = self.node_id == launcher_node
        self.host = host if local else ray.util.get_node_ip_address()
        self.argv = list(argv) if local or "--host" in argv else [*argv, "--host", self.host]
        self.env = {**os.environ, **env}
        self.log_path = Path(log_path)
        self.port = _flag(self.argv, "--port")
        self.popen: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None
        self.starts = 0
        self.ensure_running()

    def ensure_running(self) -> int:
        """Start the worker unless it runs; its pid."""
        if self.popen is not None and self.popen.poll() is None:
            return self.popen.pid
        if self.log is not None:
            self.log.close()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.popen = subprocess.Popen(
            [sys.executable, "-c", CLI_BOOT, *self.argv],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
        self.starts += 1
        return self.popen.pid

    def info(self) -> dict[str, Any]:
        """Where the worker listens and who runs it (for the launcher and the gateway)."""
        return {
            "address": f"{self.host}:{self.port}",
            "node_id": self.node_id,
            "actor_pid": os.getpid(),
            "pid": None if self.popen is None else self.popen.pid,
            "starts": self.starts,
        }

    def poll(self) -> int | None:
        """The worker's exit code, None while it runs."""
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)


def _flag(argv: list[str], name: str) -> str:
    i = argv.index(name)
    return argv[i + 1]


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
    started: bool = False
    #: Actors made, per worker (the launcher's count of new actors, not Ray's restarts).
    created: dict[str, int] = field(default_factory=dict)


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
    placement: RayPlacement
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

    def start(self) -> None:
        """A new actor (its worker starts in its constructor), or, when the actor lives and
        its worker exited, that worker again."""
        ray = import_ray()
        if self.handle is not None:
            try:
                ray.get(self.handle.ensure_running.remote(), timeout=self.CALL_TIMEOUT_S)
                self._fresh()
                return
            except ray.exceptions.ActorDiedError:
                self.handle = None  # gone for good (Ray restarts it otherwise): a new one
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                return  # Ray is restarting it; its constructor starts the worker
        cls = ray.remote(WorkerHost)
        launcher_node = ray.get_runtime_context().get_node_id()
        self.handle = cls.options(**self.options).remote(
            self.argv, self.env, str(self.log_path), self.bind_host, launcher_node
        )
        self.placement.created[self.name] = self.placement.created.get(self.name, 0) + 1
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
    def address(self) -> str:
        return self.url.removeprefix("http://")

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
