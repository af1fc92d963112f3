"""``evenserve up``: start one worker per device and the gateway, supervise, drain on exit.

Theory of operation. Workers and the gateway are subprocesses started by command line
(``processes.cli_cmd``; ``cluster`` imports neither the gateway nor the worker):
``python -m evenserve worker --repo R --device D --port P ...`` (``worker_commands``: GPU
pinning, ``--models``, the placement flags) and ``... gateway --config FILE``. Each runs in
its own session, so a Ctrl-C at the terminal reaches only this process, which then stops
things in order: the gateway first (it stops accepting and finishes what it has), then every
worker with SIGTERM (each drains its queues), then SIGKILL for anything still alive after
the drain timeout. On Linux each child also gets SIGTERM if this process dies without
cleaning up (PR_SET_PDEATHSIG).
- Startup waits until every worker answers ``/v2/health/ready``, then the gateway, then prints
  where to send requests. A worker that exits on its own is restarted (``workers.restart``),
  so the gateway sees it ejected and then readmitted. A spare (``active: false``) is not
  started at ``up``: the scale channel starts it.
- The host's warm pool: when ``gateway.placement.host_memory_gb`` is above 0, one pool
  directory per run (under /dev/shm where it exists, else the temporary directory) is given
  to every worker as ``--host-pool DIR --host-pool-gb G``, so a model unloaded on one device
  reloads warm on another, as the controller's one cluster-wide pool plans it. ``stop``
  removes it (its memory goes back to the host).
- The scale channel (``gateway.autoscaling``, ``scale_channel``): every 200 ms the launcher
  asks the gateway's ``/admin/scale`` which workers to start or stop, and reports the
  stopped ones back. A worker the channel stopped is not restarted; one that dies on its own
  while on is.
- The admin token is the configured one (``gateway.admin.token``, or the variable
  ``gateway.admin.token_env`` names), else a generated one, handed to the gateway in its
  environment (and to each worker, as ``EVENSERVE_ADMIN_TOKEN``: the gateway pushes
  parameters to the workers' ``/admin/params`` with it) and written to ``admin-token`` in
  the log folder (mode 0600). It is never printed: the summary says where it is. The ready
  file holds it too, so it is 0600 as well.
- ``--ray ADDRESS|auto`` (``ray_workers``): the same worker command lines, each run by a Ray
  actor on the node Ray places it on instead of as a child of this process; the gateway stays
  a local child and learns the workers' addresses from ``worker-addresses.json``. Without
  ``--ray`` nothing here imports Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from evenserve.cluster import scale_channel
from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV, AdminToken, write_private
from evenserve.cluster.file import LoadedCluster
from evenserve.cluster.gateway_section import PlacementSettings
from evenserve.cluster.processes import (
    LaunchError,
    Proc,
    WorkerProc,
    cli_cmd,
    port_free,
    stop_signals,
    wait_ready,
)
from evenserve.cluster.worker_commands import worker_command
from evenserve.cluster.workers_section import WorkersSection
from evenserve.core.errors import ConfigError
from evenserve.runtime.host_pool import default_pool_parent

if TYPE_CHECKING:
    from evenserve.cluster.ray_workers import RayPlacement


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

    # -- planning ---------------------------------------------------------------------------
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
            cmd, env = worker_command(
                self.cluster, i, self.python, base_env, self.admin_token, placement, pool_args
            )
            if d.active:
                self.on.add(d.name)
            url, log = f"http://{w.host}:{port}", self.log_dir / f"{d.name}.log"
            if self.ray is None:
                self.workers.append(Proc(d.name, cmd, env, url, log))
            else:
                from evenserve.cluster.ray_workers import actor_worker

                worker = actor_worker(d, cmd, env, base_env, url, log, w.host)
                self.workers.append(worker)
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

    @property
    def addresses_file(self) -> Path:
        """With ``--ray``: where each worker listens (``{name: "host:port"}``), for the
        gateway (``--worker-addresses``)."""
        return self.log_dir / "worker-addresses.json"

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

    def start(self) -> None:
        """Start everything and wait until all of it is ready (LaunchError otherwise)."""
        w = self.cluster.config.workers
        assert w is not None and self.gateway is not None and self.token is not None
        self._check_ports()
        self.write_token_file()
        if self.ray is not None:
            from evenserve.cluster.ray_workers import connect

            self.ray.started = connect(self.ray.address, self.say)
        active = [p for p in self.workers if p.name in self.on]
        for p in active:
            p.start()
        wait_ready(active, w.ready_timeout_s, lambda: self._stop)
        if self.ray is not None:
            addresses = {p.name: p.url.removeprefix("http://") for p in self.workers}
            self.addresses_file.write_text(json.dumps(addresses, indent=2) + "\n")
        self.gateway.start()
        wait_ready([self.gateway], 30.0, lambda: self._stop)

    def summary(self) -> dict[str, Any]:
        """What the ready file holds (the admin token too: it is written 0600)."""
        assert self.gateway is not None and self.token is not None
        w = self.cluster.config.workers
        assert w is not None
        actors: dict[str, dict[str, Any]] = {}
        if self.ray is not None:
            from evenserve.cluster.ray_workers import actor_summary

            actors = {p.name: actor_summary(p) for p in self.workers}
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
                    **actors.get(p.name, {}),
                }
                for p, d in zip(self.workers, w.devices, strict=True)
            ],
            "logs": str(self.log_dir),
        }

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
        """Carry out the gateway's scale requests (``scale_channel.carry_out``)."""
        w = self.cluster.config.workers
        assert w is not None
        drain_s = w.drain_timeout_s
        return scale_channel.carry_out(
            requests, self.workers, self.on, self.stopping, drain_s, self.say
        )

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
                    scale_channel.poll(client, self.gateway.url, self.admin_token, self.scale_step)
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
            from evenserve.cluster.ray_workers import stop_actors

            stop_actors(self.workers, self.ray)
        self.remove_host_pool()

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
        from evenserve.cluster.ray_workers import RayPlacement, import_ray

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
