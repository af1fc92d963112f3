"""The Ray actor that runs one worker on the node Ray placed it on (``ray_workers``'s
``WorkerHost``).

Why a subprocess and not the worker's server inside the actor's process: the worker owns its
event loop, its signal handlers and (on a GPU) its CUDA context; in a subprocess those are
exactly what the local launcher runs, and a worker that crashes takes only itself down, not
the actor that reports it. The subprocess dies with its actor (PR_SET_PDEATHSIG, SIGKILL:
nothing is left holding its port).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from evenserve.cluster.processes import cli_cmd, die_with_parent, without_startup_loads


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

    def ensure_running(self, bare: bool = False) -> int:
        """Start the worker unless it runs; its pid. ``bare``: without its startup loads
        (``processes.without_startup_loads``: the scale channel's start)."""
        if self.popen is not None and self.popen.poll() is None:
            return self.popen.pid
        if self.log is not None:
            self.log.close()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.popen = subprocess.Popen(
            cli_cmd(sys.executable, *(without_startup_loads(self.argv) if bare else self.argv)),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
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
