"""The processes ``evenserve up`` runs, and how it runs them.

A child runs the command line as ``python -m evenserve COMMAND ...`` (``cli_cmd``), the
launcher's own children and the workers of Ray actors alike, in a session of its own, so a
Ctrl-C at the terminal reaches only ``evenserve up``. On Linux a child also gets a signal if
its parent dies without cleaning up (PR_SET_PDEATHSIG, ``die_with_parent``): SIGTERM for the
launcher's children, SIGKILL for an actor's worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any, Protocol

import httpx

from evenserve.core.errors import EvenserveError
from evenserve.core.wire import HEALTH_READY_PATH


class LaunchError(EvenserveError):
    """A process of the local cluster could not be started or did not become ready."""


def cli_cmd(python: str, *args: str) -> list[str]:
    """The command line that runs ``evenserve ARGS...`` with the interpreter ``python``."""
    return [python, "-m", "evenserve", *args]


def _set_parent_death_signal(sig: int) -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` (only prctl, between fork and exec) that has the child get ``sig``
    when its parent dies; None off Linux."""
    return partial(_set_parent_death_signal, sig) if sys.platform.startswith("linux") else None


def without_startup_loads(argv: Sequence[str]) -> list[str]:
    """A worker's arguments without its ``--load-model M`` pairs: the worker starts with no
    model resident. The scale channel starts a device that way (the placement controller
    counts a device turned on as empty, ``device_ready``, and the simulator starts it so:
    placement then loads what it wants there, paying each load)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--load-model":
            skip = True
        else:
            out.append(a)
    return out


@dataclass
class Proc:
    """A child process of the launcher (the gateway, a local worker), its output appended to
    ``log_path``."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    url: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_file: IO[bytes] | None = None

    def start(self, *, bare: bool = False) -> None:
        """Start the child; ``bare``: without its startup loads (``without_startup_loads``)."""
        self.log_file = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        self.popen = subprocess.Popen(
            without_startup_loads(self.cmd) if bare else self.cmd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),
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

    def start(self, *, bare: bool = False) -> None: ...

    def alive(self) -> bool: ...

    def signal(self, sig: int) -> None: ...

    def exit_code(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def close_log(self) -> None: ...


def port_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` (a bind there succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(p: WorkerProc, n: int = 15) -> str:
    """The last ``n`` lines of ``p``'s log, indented ("" when it cannot be read)."""
    try:
        lines = p.log_path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines)


def wait_ready(
    procs: Sequence[WorkerProc], timeout_s: float, interrupted: Callable[[], bool]
) -> None:
    """Wait until every one of ``procs`` answers ``/v2/health/ready`` with 200; LaunchError
    when one exits first (its log's tail quoted), after ``timeout_s``, or once
    ``interrupted()``."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    with httpx.Client(timeout=1.0, trust_env=False) as client:
        while pending:
            if interrupted():
                raise LaunchError("interrupted while starting")
            for p in list(pending):
                if not p.alive():
                    code = p.exit_code()
                    raise LaunchError(
                        f"{p.name} exited with code {code} while starting "
                        f"(log {p.log_path}):\n{log_tail(p)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(p.url + HEALTH_READY_PATH).status_code == 200:
                        pending.remove(p)
            if pending and time.monotonic() > deadline:
                names = ", ".join(p.name for p in pending)
                raise LaunchError(f"not ready after {timeout_s:g} s: {names}")
            if pending:
                time.sleep(0.1)


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside the block (the launcher drains first)."""
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
