"""``evenserve up``: start one worker per device and the gateway, supervise, drain on exit.

Theory of operation. Workers and the gateway are subprocesses started by command line (this
module never imports the worker): ``python -m evenserve.cli.main worker --repo R --device D
--port P`` and ``... gateway --config FILE``. Each runs in its own session, so a Ctrl-C at the
terminal reaches only this process, which then stops things in order: the gateway first (it
stops accepting and finishes what it has), then every worker with SIGTERM (each drains its
queues), then SIGKILL for anything still alive after the drain timeout. On Linux each child
also gets SIGTERM if this process dies without cleaning up (PR_SET_PDEATHSIG).
- GPUs are pinned with CUDA_VISIBLE_DEVICES=N (the worker then sees its GPU as cuda:0; a
  share keeps its ``#share=K/M``); a MIG slice ``cuda:MIG-<uuid>`` with
  CUDA_VISIBLE_DEVICES=<uuid> (its worker sets the same itself); ``emulated:`` and ``cpu``
  workers get an empty CUDA_VISIBLE_DEVICES.
- A device that hosts only some of the repository's models gets ``--models a,b``.
- Startup waits until every worker answers ``/v2/health/ready``, then the gateway, then prints
  where to send requests. A worker that exits on its own is restarted (``workers.restart``),
  so the gateway sees it ejected and then readmitted.
- With ``gateway.placement`` every worker runs with ``--model-control explicit``, its
  configured models as ``--load-model`` (so the gateway's placement view of residents
  matches) and ``--load-wait-ms`` from the placement section. A spare (``active: false``) is
  not started at ``up``: the scale channel starts it.
- The host's warm pool: when ``gateway.placement.host_memory_gb`` is above 0, one pool
  directory per run (under /dev/shm where it exists, else the temporary directory) is given
  to every worker as ``--host-pool DIR --host-pool-gb G``, so a model unloaded on one device
  reloads warm on another, as the controller's one cluster-wide pool plans it. ``stop``
  removes it (its memory goes back to the host).
- The scale channel (``gateway.autoscaling``): every 200 ms the launcher GETs the gateway's
  ``/admin/scale`` with the admin token it holds (``[{device, action: start | stop}]``).
  ``start``: start that worker (the gateway admits it once it is ready: device_ready).
  ``stop`` (the gateway has held it out of routing and nothing is outstanding there):
  SIGTERM (the worker drains again and exits), SIGKILL after the drain timeout, then POST
  ``{"device", "event": "stopped"}`` back (device_stopped). A worker the channel stopped is
  not restarted; one that dies on its own while on is.
- The admin token is the configured one (``gateway.admin.token``, or the variable
  ``gateway.admin.token_env`` names), else a generated one, handed to the gateway in its
  environment (and to each worker, as ``EVENSERVE_ADMIN_TOKEN``: the gateway pushes
  parameters to the workers' ``/admin/params`` with it) and written to ``admin-token`` in
  the log folder (mode 0600). It is never
  printed: the summary says where it is. The ready file holds it too, so it is 0600 as well.
- ``--ray ADDRESS|auto`` (``ray_workers``): the same worker command lines, each run by a Ray
  actor on the node Ray places it on instead of as a child of this process; the gateway stays
  a local child and learns the workers' addresses from ``worker-addresses.json``. Without
  ``--ray`` nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Protocol

import httpx

from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.core.wire import HEALTH_READY_PATH
from evenserve.gateway.config import (
    DEFAULT_TOKEN_ENV,
    AdminToken,
    DeviceEntry,
    LoadedCluster,
    PlacementSettings,
    WorkersSection,
    write_private,
)
from evenserve.runtime.device import parse_device
from evenserve.runtime.host_pool import default_pool_parent

if TYPE_CHECKING:
    from evenserve.gateway.ray_workers import RayPlacement

#: How a child runs the CLI. Not ``-m evenserve.cli.main``: run as ``__main__`` that module
#: would be loaded twice and commands registered by other modules would miss the running app.
CLI_BOOT = "from evenserve.cli.main import main; main()"


def cli_cmd(python: str, *args: str) -> list[str]:
    return [python, "-c", CLI_BOOT, *args]


class LaunchError(EvenserveError):
    """A process of the local cluster could not be started or did not become ready."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Proc:
    name: str
    cmd: list[str]
    env: dict[str, str]
    url: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_file: IO[bytes] | None = None

    def start(self) -> None:
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.popen = subprocess.Popen(
            self.cmd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,  # only prctl between fork and exec
        )

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def close_log(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it exits; True when it did within ``timeout``."""
        if self.popen is None:
            return True
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


class WorkerProc(Protocol):
    """A worker as the launcher runs it: a local ``Proc`` or, with ``--ray``, an actor's
    (``ray_workers.ActorWorker``)."""

    name: str
    url: str
    log_path: Path
    restarts: int

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def signal(self, sig: int) -> None: ...

    def exit_code(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def close_log(self) -> None: ...


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def worker_env(device: str, base: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The device string the worker gets and its environment (GPU pinning)."""
    env = dict(base)
    target = parse_device(device)
    if target.kind == "cuda":
        if target.mig_uuid is not None:  # the worker sees its slice as cuda:0 either way
            env["CUDA_VISIBLE_DEVICES"] = target.mig_uuid
            return device, env
        env["CUDA_VISIBLE_DEVICES"] = str(target.index)
        tail = f"#{target.slice.text}" if target.slice is not None else ""
        return f"cuda:0{tail}", env
    env["CUDA_VISIBLE_DEVICES"] = ""
    return device, env


@dataclass
class Launcher:
    cluster: LoadedCluster
    config_path: Path
    log_dir: Path
    python: str = sys.executable
    say: Callable[[str], None] = print
    #: Default: the cluster's configured token, else a generated one (``resolve_admin_token``).
    token: AdminToken | None = None
    #: ``--ray``: workers run as Ray actors (None: local child processes).
    ray: RayPlacement | None = None
    workers: list[WorkerProc] = field(default_factory=list)
    gateway: Proc | None = None
    #: Where a generated token was written (mode 0600); None for a configured one.
    token_file: Path | None = None
    #: Workers that should be running (spares join when scaled up, leave when stopped).
    on: set[str] = field(default_factory=set)
    #: Workers the scale channel sent SIGTERM, with the time (monotonic).
    stopping: dict[str, float] = field(default_factory=dict)
    #: The host pool directory of this run (``host_memory_gb`` > 0), removed at ``stop``.
    host_pool: Path | None = None
    _stop: bool = False

    def __post_init__(self) -> None:
        if self.token is None:
            self.token = self.cluster.resolve_admin_token()

    @property
    def admin_token(self) -> str:
        assert self.token is not None
        return self.token.value

    # -- building commands ------------------------------------------------------------------
    def _models_args(self, i: int, d: DeviceEntry) -> list[str]:
        """``--models a,b`` for a device that hosts only some of the repository's models."""
        if d.models is None:
            return []
        all_models = self.cluster.repo_models()
        missing = [m for m in d.models if m not in all_models]
        if missing:
            w = self.cluster.config.workers
            assert w is not None
            raise ConfigError(
                f"workers.devices.{i}.models: {', '.join(missing)} not in "
                f"{self.cluster.resolve(w.repo)} (has: {', '.join(all_models) or 'none'})"
            )
        return ["--models", ",".join(d.models)]

    def _placement_args(self, i: int, d: DeviceEntry, load_wait_ms: float) -> list[str]:
        """A worker under placement: explicit model control, its configured models loaded at
        startup (none for a spare), the placement's load-wait bound."""
        self._models_args(i, d)  # checks they are in the repository
        startup = [] if not d.active else d.models or self.cluster.repo_models()
        loads = [a for m in startup for a in ("--load-model", m)]
        return ["--model-control", "explicit", *loads, "--load-wait-ms", f"{load_wait_ms:g}"]

    def _device_arg(self, device: str) -> str:
        target = parse_device(device)
        if target.kind == "emulated" and target.profile_set is not None:
            where = self.cluster.profile_dir(target.profile_set)
            if where is not None:
                tail = f"#{target.slice.text}" if target.slice is not None else ""
                return f"emulated:{where}{tail}"
        return device

    def plan(self) -> None:
        w = self.cluster.config.workers
        if w is None:
            raise ConfigError("workers: `evenserve up` needs a workers section with devices")
        base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        placement = self.cluster.config.gateway.placement_settings()
        pool_args: list[str] = []
        if placement is not None and placement.host_memory_gb > 0:
            if self.host_pool is None:
                self.host_pool = Path(
                    tempfile.mkdtemp(prefix="evenserve-pool-", dir=default_pool_parent())
                )
            pool_args = [
                "--host-pool", str(self.host_pool),
                "--host-pool-gb", f"{placement.host_memory_gb:g}",
            ]  # fmt: skip
        try:
            self._plan_workers(w, base_env, placement, pool_args)
        except BaseException:
            self.remove_host_pool()
            raise

    def _plan_workers(
        self,
        w: WorkersSection,
        base_env: dict[str, str],
        placement: PlacementSettings | None,
        pool_args: list[str],
    ) -> None:
        for i, d in enumerate(w.devices):
            port = w.port_of(i)
            dev, env = worker_env(self._device_arg(d.device), base_env)
            # The gateway's admin token (it pushes parameters to the workers with it): in the
            # environment only, never on the command line or in a log.
            env[DEFAULT_TOKEN_ENV] = self.admin_token
            if placement is None:
                models = self._models_args(i, d)
            else:
                models = self._placement_args(i, d, placement.load_wait_ms)
            cmd = cli_cmd(
                self.python, "worker",
                "--repo", str(self.cluster.resolve(w.repo)),
                "--device", dev,
                "--name", d.name,
                "--port", str(port),
                *([] if d.grpc_port is None else ["--grpc-port", str(d.grpc_port)]),
                *models,
                *pool_args,
                *d.option_flags(),
                *d.extra_args,
            )  # fmt: skip
            if d.active:
                self.on.add(d.name)
            url, log = f"http://{w.host}:{port}", self.log_dir / f"{d.name}.log"
            if self.ray is None:
                self.workers.append(Proc(d.name, cmd, env, url, log))
            else:
                self.workers.append(self._actor_worker(d, cmd, env, base_env, url, log, w.host))
        g = self.cluster.config.gateway
        genv = {
            **base_env,
            DEFAULT_TOKEN_ENV: self.admin_token,
            g.admin.token_env: self.admin_token,
        }
        gcmd = cli_cmd(self.python, "gateway", "--config", str(self.config_path.resolve()))
        if self.ray is not None:
            gcmd += ["--worker-addresses", str(self.addresses_file)]
        self.gateway = Proc(
            "gateway", gcmd, genv, f"http://{g.host}:{g.port}", self.log_dir / "gateway.log"
        )

    def _actor_worker(
        self,
        d: DeviceEntry,
        cmd: list[str],
        env: dict[str, str],
        base_env: dict[str, str],
        url: str,
        log: Path,
        bind_host: str,
    ) -> WorkerProc:
        """Device ``d``'s worker as a Ray actor: the local command's arguments (less the
        interpreter: the actor's node runs its own), the environment it adds, the options."""
        from evenserve.gateway.ray_workers import ActorWorker, actor_env, actor_options

        assert self.ray is not None and cmd[:3] == cli_cmd(self.python)
        dev = cmd[cmd.index("--device") + 1]
        return ActorWorker(
            d.name, cmd[3:], actor_env(dev, env, base_env), url, log,
            actor_options(d), bind_host, self.ray,
        )  # fmt: skip

    @property
    def addresses_file(self) -> Path:
        """With ``--ray``: where each worker listens (``{name: "host:port"}``), for the
        gateway (``--worker-addresses``)."""
        return self.log_dir / "worker-addresses.json"

    def write_addresses(self) -> None:
        addresses = {p.name: p.url.removeprefix("http://") for p in self.workers}
        self.addresses_file.write_text(json.dumps(addresses, indent=2) + "\n")

    # -- lifecycle --------------------------------------------------------------------------
    def _check_ports(self) -> None:
        w = self.cluster.config.workers
        assert w is not None
        # With Ray a worker binds on the node its actor runs on: its port is checked there
        # (a worker that cannot bind exits while starting, named with its log).
        busy = [
            f"{d.name} ({w.host}:{w.port_of(i)})"
            for i, d in enumerate(w.devices)
            if self.ray is None and not port_free(w.host, w.port_of(i))
        ]
        g = self.cluster.config.gateway
        if not port_free(g.host, g.port):
            busy.append(f"gateway ({g.host}:{g.port})")
        if g.grpc_port and not port_free(g.host, g.grpc_port):
            busy.append(f"gateway gRPC ({g.host}:{g.grpc_port})")
        if busy:
            raise LaunchError("ports already in use: " + ", ".join(busy))

    def _tail(self, p: WorkerProc, n: int = 15) -> str:
        try:
            lines = p.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return ""
        return "\n".join("    " + ln for ln in lines)

    def _wait_ready(self, procs: Sequence[WorkerProc], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(procs)
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while pending:
                if self._stop:
                    raise LaunchError("interrupted while starting")
                for p in list(pending):
                    if not p.alive():
                        code = p.exit_code()
                        raise LaunchError(
                            f"{p.name} exited with code {code} while starting "
                            f"(log {p.log_path}):\n{self._tail(p)}"
                        )
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(p.url + HEALTH_READY_PATH).status_code == 200:
                            pending.remove(p)
                if pending and time.monotonic() > deadline:
                    names = ", ".join(p.name for p in pending)
                    raise LaunchError(f"not ready after {timeout_s:g} s: {names}")
                if pending:
                    time.sleep(0.1)

    def start(self) -> None:
        """Start everything and wait until all of it is ready (LaunchError otherwise)."""
        w = self.cluster.config.workers
        assert w is not None and self.gateway is not None and self.token is not None
        self._check_ports()
        self.write_token_file()
        if self.ray is not None:
            from evenserve.gateway.ray_workers import connect

            self.ray.started = connect(self.ray.address, self.say)
        active = [p for p in self.workers if p.name in self.on]
        for p in active:
            p.start()
        self._wait_ready(active, w.ready_timeout_s)
        if self.ray is not None:
            self.write_addresses()
        self.gateway.start()
        self._wait_ready([self.gateway], 30.0)

    def summary(self) -> dict[str, Any]:
        """What the ready file holds (the admin token too: it is written 0600)."""
        assert self.gateway is not None and self.token is not None
        w = self.cluster.config.workers
        assert w is not None
        backends = {b.name: b for b in self.cluster.backends()}
        return {
            "cluster": self.cluster.config.name,
            "gateway": {"url": self.gateway.url, "pid": self.gateway.pid},
            "admin_token": self.admin_token,
            "admin_token_source": self.token.source,
            "admin_token_file": None if self.token_file is None else str(self.token_file),
            "routing": self.cluster.config.gateway.routing,
            "workers": [
                {
                    "name": p.name,
                    "device": d.device,
                    "url": p.url,
                    "pid": p.pid,
                    "active": p.name in self.on,
                    "models": backends[p.name].models or [],
                    **self._ray_summary(p),
                }
                for p, d in zip(self.workers, w.devices, strict=True)
            ],
            "logs": str(self.log_dir),
        }

    def _ray_summary(self, p: WorkerProc) -> dict[str, Any]:
        """With ``--ray``: the worker's actor (its pid on its node, its node, its starts)."""
        if self.ray is None:
            return {}
        from evenserve.gateway.ray_workers import ActorWorker

        if not isinstance(p, ActorWorker):
            return {}
        i = p.last_info
        return {"ray": {k: i.get(k) for k in ("actor_pid", "node_id", "starts")}}

    def print_summary(self) -> None:
        s = self.summary()
        say = self.say
        say(f"evenserve up: cluster {s['cluster']!r} is ready")
        for wk in s["workers"]:
            say(
                f"  worker  {wk['name']:<8} {wk['device']:<24} {wk['url']:<24} "
                f"pid {wk['pid']!s:<7} "
                + (", ".join(wk["models"]) if wk["active"] else "(spare: off until scaled up)")
            )
        g = s["gateway"]
        say(f"  gateway {g['url']}  pid {g['pid']}  routing {s['routing']}")
        say("")
        say(f"Send requests to {g['url']}/v2/models/<model>/infer (KServe v2 / tritonclient).")
        say(self.admin_hint())
        say(f"Metrics: {g['url']}/metrics   Logs: {s['logs']}")
        say("Ctrl-C (or SIGTERM) drains and stops every process started here.")

    def write_token_file(self) -> Path | None:
        """A generated token, written to ``admin-token`` in the log folder (mode 0600)."""
        assert self.token is not None
        if self.token.generated:
            self.token_file = write_private(self.log_dir / "admin-token", self.token.value + "\n")
        return self.token_file

    def admin_hint(self) -> str:
        """How to reach the admin API, naming where the token is, never the token."""
        assert self.gateway is not None and self.token is not None
        url = f"{self.gateway.url}/admin/backends"
        if self.token_file is not None:
            return (
                f"Admin: the token (generated) is in {self.token_file} (mode 0600): "
                f'curl -H "Authorization: Bearer $(cat {self.token_file})" {url}'
            )
        return f"Admin: curl -H 'Authorization: Bearer <the token of {self.token.source}>' {url}"

    # -- the scale channel ------------------------------------------------------------------
    def scale_step(self, requests: list[dict[str, str]]) -> list[dict[str, str]]:
        """Carry out the gateway's scale requests (``GET /admin/scale``); returns the
        reports to POST back (``{"device", "event": "stopped"}``). Called every poll."""
        w = self.cluster.config.workers
        assert w is not None
        by_name = {p.name: p for p in self.workers}
        reports: list[dict[str, str]] = []
        for req in requests:
            p = by_name.get(req.get("device", ""))
            if p is None:
                continue
            action = req.get("action")
            if action == "start" and p.name not in self.on:
                self.on.add(p.name)
                self.stopping.pop(p.name, None)
                p.close_log()
                p.start()
                self.say(f"scale up: started worker {p.name} (pid {p.pid})")
            elif action == "stop" and p.name in self.on and p.name not in self.stopping:
                self.on.discard(p.name)
                self.stopping[p.name] = time.monotonic()
                p.signal(signal.SIGTERM)
                self.say(f"scale down: stopping worker {p.name} (drained at the gateway)")
        for name, since in list(self.stopping.items()):
            p = by_name[name]
            if p.alive() and time.monotonic() - since > w.drain_timeout_s:
                self.say(f"{name} did not stop in {w.drain_timeout_s:g} s; killing it")
                p.signal(signal.SIGKILL)
            if not p.alive():
                del self.stopping[name]
                p.wait()
                p.close_log()
                reports.append({"device": name, "event": "stopped"})
                self.say(f"scale down: worker {name} stopped")
        return reports

    def _scale_poll(self, client: httpx.Client) -> None:
        """One round of the scale channel over the gateway's admin API (errors: next time)."""
        assert self.gateway is not None
        auth = {"authorization": f"Bearer {self.admin_token}"}
        url = f"{self.gateway.url}/admin/scale"
        try:
            r = client.get(url, headers=auth)
            requests = r.json().get("requests", []) if r.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            requests = []
        for report in self.scale_step(requests):
            with contextlib.suppress(httpx.HTTPError):
                client.post(url, headers=auth, json=report)

    def supervise(self, poll_s: float = 0.2) -> int:
        """Run until asked to stop; restart workers that die; with autoscaling, the scale
        channel every poll. Returns the exit code."""
        w = self.cluster.config.workers
        assert w is not None and self.gateway is not None
        scaling = self.cluster.config.gateway.autoscaling is not None
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while not self._stop:
                code = self._supervise_once(w.restart)
                if code is not None:
                    return code
                if scaling:
                    self._scale_poll(client)
                time.sleep(poll_s)
        return 0

    def _supervise_once(self, restart: bool) -> int | None:
        """One supervision round: 1 when the gateway is gone; workers that should be on and
        died on their own are restarted (``restart``)."""
        assert self.gateway is not None
        if not self.gateway.alive():
            code = self.gateway.popen.returncode if self.gateway.popen else None
            self.say(f"gateway exited (code {code}); stopping (log {self.gateway.log_path})")
            return 1
        for p in self.workers:
            if p.name not in self.on or p.name in self.stopping or p.alive() or self._stop:
                continue
            code = p.exit_code()
            if not restart:
                self.say(f"worker {p.name} exited (code {code}); not restarting")
                continue
            p.restarts += 1
            self.say(f"worker {p.name} exited (code {code}); restarting ({p.restarts})")
            p.close_log()
            p.start()
        return None

    def request_stop(self, *_: Any) -> None:
        self._stop = True

    def stop(self) -> None:
        """Drain and stop: gateway first, then workers; SIGKILL after the drain timeout."""
        w = self.cluster.config.workers
        drain_s = w.drain_timeout_s if w is not None else 15.0
        self._stop = True
        if self.gateway is not None:
            self._terminate([self.gateway], drain_s)
        self._terminate(self.workers, drain_s)
        if self.ray is not None:
            self._stop_ray()
        self.remove_host_pool()

    def _stop_ray(self) -> None:
        """Every actor ended for good (their workers stopped above); Ray stopped when this
        run started it."""
        from evenserve.gateway.ray_workers import ActorWorker, disconnect

        assert self.ray is not None
        for p in self.workers:
            if isinstance(p, ActorWorker):
                p.kill_actor()
        if self.ray.started:
            disconnect()

    def remove_host_pool(self) -> None:
        """Remove this run's host pool (its entries' memory goes back to the host)."""
        if self.host_pool is not None:
            shutil.rmtree(self.host_pool, ignore_errors=True)
            self.host_pool = None

    def _terminate(self, procs: Sequence[WorkerProc], timeout_s: float) -> None:
        for p in procs:
            p.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in procs:
            if not p.wait(timeout=max(0.0, deadline - time.monotonic())):
                self.say(f"{p.name} did not stop in {timeout_s:g} s; killing it")
                p.signal(signal.SIGKILL)
                p.wait()
            p.close_log()


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_up(
    cluster: LoadedCluster,
    config_path: Path,
    *,
    log_dir: Path | None = None,
    ready_file: Path | None = None,
    say: Callable[[str], None] = print,
    ray_address: str | None = None,
) -> int:
    """The whole ``evenserve up``: plan, start, print, supervise, drain. Returns exit code.
    ``ray_address`` (``auto`` or a Ray address): the workers as Ray actors."""
    placement = None
    if ray_address is not None:
        from evenserve.gateway.ray_workers import RayPlacement, import_ray

        import_ray()  # ConfigError with the install hint before anything starts
        placement = RayPlacement(ray_address)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="evenserve-up-"))
    logs.mkdir(parents=True, exist_ok=True)
    la = Launcher(cluster, config_path, logs, say=say, ray=placement)
    la.plan()
    with stop_signals(la.request_stop):
        try:
            la.start()
        except BaseException:
            la.stop()
            raise
        la.print_summary()
        if ready_file is not None:  # it holds the admin token
            write_private(ready_file, json.dumps(la.summary(), indent=2) + "\n")
        try:
            code = la.supervise()
        finally:
            say("stopping: draining the gateway, then the workers ...")
            la.stop()
            say("stopped.")
    return code
