"""Which device a worker owns (``cpu``, ``cuda:N``, ``emulated:PROFILE_SET``) and host memory.

The emulated device has no memory of its own to read: the worker accounts it from the
profiles (resident weights plus the working memory of running batches) against a configured
total. The CPU's figures come from the kernel (cgroup limit when one is set, else
/proc/meminfo); a CUDA device's from ``torch.cuda.mem_get_info`` (``torch_common``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evenserve.core.errors import ConfigError

DeviceKind = Literal["cpu", "cuda", "emulated"]

_DEVICE_RE = re.compile(r"^(?:(cpu)|cuda:(\d+)|emulated:(.+))$")


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    kind: DeviceKind
    index: int | None = None
    profile_set: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "cuda":
            return f"cuda:{self.index}"
        if self.kind == "emulated":
            return f"emulated:{self.profile_set}"
        return "cpu"

    @property
    def torch_device(self) -> str:
        """The torch device string real runtimes use (``cpu`` for the emulated device)."""
        return f"cuda:{self.index}" if self.kind == "cuda" else "cpu"


def parse_device(text: str) -> DeviceTarget:
    """Parse ``cpu``, ``cuda:N`` or ``emulated:PROFILE_SET``; ConfigError otherwise."""
    m = _DEVICE_RE.match(text.strip())
    if m is None:
        raise ConfigError(
            f"--device: {text!r} is not a device (expected cpu, cuda:N or emulated:PROFILE_SET)"
        )
    if m.group(1):
        return DeviceTarget("cpu")
    if m.group(2) is not None:
        return DeviceTarget("cuda", index=int(m.group(2)))
    return DeviceTarget("emulated", profile_set=m.group(3))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_memory_bytes() -> tuple[float, float]:
    """(used, total) bytes of host memory available to this process.

    Inside a cgroup with a memory limit, the limit and the cgroup's usage; otherwise
    MemTotal and MemTotal - MemAvailable from /proc/meminfo.
    """
    limit = _read_int(Path("/sys/fs/cgroup/memory.max"))
    usage = _read_int(Path("/sys/fs/cgroup/memory.current"))
    info: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                info[key] = int(parts[0]) * 1024
    except OSError:
        pass
    total = info.get("MemTotal")
    if limit is not None and usage is not None and (total is None or limit < total):
        return float(usage), float(limit)
    if total is None:
        raise OSError("cannot read host memory from /proc/meminfo")
    available = info.get("MemAvailable", info.get("MemFree", 0))
    return float(total - available), float(total)
