"""Which device a worker owns and host memory.

Device strings (``--device``, a cluster file's ``workers.devices[].device``):

- ``cpu``; ``cuda:N``, GPU ``N``.
- ``cuda:MIG-<uuid>`` (the MIG device UUID ``nvidia-smi -L`` prints; the legacy
  ``cuda:MIG-GPU-<uuid>/<gi>/<ci>`` form too): one MIG slice. The worker sets
  ``CUDA_VISIBLE_DEVICES=<that uuid>`` before CUDA initialises, so it sees the slice as
  ``cuda:0``; one worker serves one slice. Its memory comes from NVML for that slice (the
  handle by UUID), never the parent GPU's; NVML has no per-MIG utilization, so only the
  worker's own busy time is exported.
- ``cuda:N#share=K/M``: ``K`` of ``M`` time-sliced shares of GPU ``N`` (several workers on one
  GPU): the worker's memory cap is the GPU's total times ``K/M`` and its used memory is its
  own process's (torch's reserved bytes); its busy time counts its own batches only.
- ``emulated:PROFILE_SET``, and ``emulated:PROFILE_SET#mig=3g.20gb`` or ``#share=K/M``:
  profile-driven devices (``core.slices`` says how a slice scales speed and memory).

The emulated device has no memory of its own to read: the worker accounts it from the
profiles (resident weights plus the working memory of running batches) against a configured
total. The CPU's figures come from the kernel (cgroup limit when one is set, else
/proc/meminfo); a CUDA device's from ``torch.cuda.mem_get_info`` (``torch_common``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evenserve.core.errors import ConfigError
from evenserve.core.slices import DeviceSlice, parse_slice

DeviceKind = Literal["cpu", "cuda", "emulated"]

#: The device forms, for messages and help.
DEVICE_FORMS = (
    "cpu, cuda:N, cuda:N#share=K/M, cuda:MIG-<uuid>, emulated:PROFILE_SET, "
    "emulated:PROFILE_SET#mig=<G>g.<M>gb or emulated:PROFILE_SET#share=K/M"
)

_HEX = r"[0-9a-fA-F]"
_UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_MIG_UUID_RE = re.compile(rf"^MIG-(?:{_UUID}|GPU-{_UUID}/\d+/\d+)$")


@dataclass(frozen=True, slots=True)
class DeviceTarget:
    kind: DeviceKind
    index: int | None = None
    profile_set: str | None = None
    #: A MIG slice's UUID (``MIG-...``): the worker's only visible CUDA device.
    mig_uuid: str | None = None
    #: A share of the device or (emulated) a MIG profile.
    slice: DeviceSlice | None = None

    @property
    def name(self) -> str:
        """The device string, canonical (parses back to this target)."""
        tail = f"#{self.slice.text}" if self.slice is not None else ""
        if self.kind == "cuda":
            return f"cuda:{self.mig_uuid or self.index}{tail}"
        if self.kind == "emulated":
            return f"emulated:{self.profile_set}{tail}"
        return "cpu"

    @property
    def slice_label(self) -> str | None:
        """``mig-3g.20gb``, ``share-1of2``, ``mig-<uuid>`` (a real MIG slice) or None."""
        if self.mig_uuid is not None:
            return "mig-" + self.mig_uuid.removeprefix("MIG-")
        return self.slice.label if self.slice is not None else None

    @property
    def cuda_index(self) -> int:
        """The torch CUDA index: 0 for a MIG slice (its worker sees only it)."""
        return 0 if self.mig_uuid is not None else (self.index or 0)

    @property
    def torch_device(self) -> str:
        """The torch device string real runtimes use (``cpu`` for the emulated device)."""
        return f"cuda:{self.cuda_index}" if self.kind == "cuda" else "cpu"

    @property
    def compute_fraction(self) -> float:
        """The part of the whole device's speed an emulated slice gets (1 otherwise)."""
        return self.slice.compute_fraction if self.slice is not None else 1.0

    def memory_cap_bytes(self, device_total_bytes: float) -> float:
        """This worker's memory cap given the whole device's total (a share's part, an
        emulated MIG profile's own memory)."""
        if self.slice is None:
            return device_total_bytes
        return self.slice.memory_bytes(device_total_bytes)

    def visible_devices(self) -> str | None:
        """What ``CUDA_VISIBLE_DEVICES`` must be for this device (a MIG slice's UUID)."""
        return self.mig_uuid


def select_visible_device(
    device: DeviceTarget, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Set ``CUDA_VISIBLE_DEVICES`` for a MIG slice before CUDA initialises (the worker's
    process calls it first thing). True when it set it; ConfigError when torch has already
    initialised CUDA in this process (too late: the setting would be ignored). Never imports
    torch."""
    want = device.visible_devices()
    if want is None:
        return False
    env = environ if environ is not None else _os_environ()
    torch = sys.modules.get("torch")
    if torch is not None and env.get("CUDA_VISIBLE_DEVICES") != want:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            raise ConfigError(
                f"--device {device.name}: CUDA is already initialised in this process, "
                "CUDA_VISIBLE_DEVICES can no longer select the MIG slice"
            )
    env["CUDA_VISIBLE_DEVICES"] = want
    return True


def _os_environ() -> MutableMapping[str, str]:
    import os

    return os.environ


def parse_device(text: str) -> DeviceTarget:
    """Parse a device string (``DEVICE_FORMS``); ConfigError naming the bad part otherwise."""
    raw = text.strip()
    base, hashed, tail = raw.partition("#")

    def bad(what: str) -> ConfigError:
        return ConfigError(f"--device {raw!r}: {what} (expected {DEVICE_FORMS})")

    slice_: DeviceSlice | None = None
    if hashed:
        try:
            slice_ = parse_slice(tail)
        except ValueError as exc:
            raise bad(str(exc)) from None
    if base == "cpu":
        if slice_ is not None:
            raise bad(f"#{tail}: cpu has no slices")
        return DeviceTarget("cpu")
    if base.startswith("cuda:"):
        rest = base.removeprefix("cuda:")
        if rest.isdigit():
            if slice_ is not None and slice_.mig is not None:
                raise bad(
                    f"#{tail}: a real MIG slice is named by its UUID (cuda:MIG-<uuid>), "
                    "not by its profile"
                )
            return DeviceTarget("cuda", index=int(rest), slice=slice_)
        if rest.startswith("MIG-"):
            if not _MIG_UUID_RE.match(rest):
                raise bad(f"{rest!r} is not a MIG device UUID (MIG-<uuid>)")
            if slice_ is not None:
                raise bad(f"#{tail}: a MIG slice cannot be shared or sliced further")
            return DeviceTarget("cuda", mig_uuid=rest)
        raise bad(f"{rest!r} after cuda: is neither a GPU index nor MIG-<uuid>")
    if base.startswith("emulated:"):
        ps = base.removeprefix("emulated:")
        if not ps:
            raise bad("emulated: needs a PROFILE_SET")
        return DeviceTarget("emulated", profile_set=ps, slice=slice_)
    raise bad(f"{base!r} is not a device kind")


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
