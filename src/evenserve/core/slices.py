"""Parts of a GPU a worker or a simulated device may own: a MIG slice or a time-sliced share.

Syntax (after ``#`` in a device string, or a scenario device's ``slice`` field):

- ``mig=<G>g.<M>gb`` (an NVIDIA MIG profile name such as ``3g.20gb``, optionally with
  ``+me``): ``G`` of the GPU's 7 compute slices and ``M`` GiB of memory. Assumption (the
  emulated device and the simulator): a slice runs a batch in the profile's latency divided
  by its compute fraction ``G/7`` (a 3g slice takes 7/3 of the full GPU's time), and its
  memory cap is ``M`` GiB whatever ``memory_gb`` says.
- ``share=K/M``: ``K`` of ``M`` equal time-sliced shares of one GPU. Its memory cap is the
  device's memory times ``K/M``; its speed is the full device's. Several shares of one GPU are
  modelled as independent devices with their part of the memory each: the slowdown their
  batches cause each other by time slicing is not modelled (a worker's busy time counts its
  own batches only).

Core: the worker (``runtime.device``) and the simulator (``core.scenario``) both parse here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Compute slices of a whole MIG-capable GPU (A100, H100, H200: 7).
MIG_COMPUTE_SLICES = 7

_MIG_RE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")
_SHARE_RE = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile: ``compute`` slices of 7 and ``memory_gib`` GiB."""

    compute: int
    memory_gib: int
    media: bool = False

    @property
    def name(self) -> str:
        return f"{self.compute}g.{self.memory_gib}gb" + ("+me" if self.media else "")

    @property
    def compute_fraction(self) -> float:
        return self.compute / MIG_COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class Share:
    """``part`` of ``of`` equal time-sliced shares of one device."""

    part: int
    of: int

    @property
    def fraction(self) -> float:
        return self.part / self.of

    @property
    def text(self) -> str:
        return f"{self.part}/{self.of}"


@dataclass(frozen=True, slots=True)
class DeviceSlice:
    """A MIG slice (``mig``) or a time-sliced share (``share``): exactly one is set."""

    mig: MigProfile | None = None
    share: Share | None = None

    @property
    def text(self) -> str:
        """As written: ``mig=3g.20gb`` or ``share=1/2``."""
        if self.mig is not None:
            return f"mig={self.mig.name}"
        assert self.share is not None
        return f"share={self.share.text}"

    @property
    def label(self) -> str:
        """For names and metric labels: ``mig-3g.20gb`` or ``share-1of2``."""
        if self.mig is not None:
            return f"mig-{self.mig.name}"
        assert self.share is not None
        return f"share-{self.share.part}of{self.share.of}"

    @property
    def compute_fraction(self) -> float:
        """The part of the whole device's speed a batch gets (a share runs at full speed)."""
        return self.mig.compute_fraction if self.mig is not None else 1.0

    def memory_bytes(self, device_total_bytes: float) -> float:
        """The slice's memory cap, given the whole device's (a MIG profile names its own)."""
        if self.mig is not None:
            return self.mig.memory_gib * 1024.0**3
        assert self.share is not None
        return device_total_bytes * self.share.fraction


def parse_mig_profile(text: str) -> MigProfile:
    """``3g.20gb`` (``+me`` allowed); ValueError naming the bad text otherwise."""
    m = _MIG_RE.match(text)
    if m is None:
        raise ValueError(
            f"mig={text!r}: not a MIG profile (expected <G>g.<M>gb with G in 1..7, e.g. 3g.20gb)"
        )
    if int(m.group(2)) < 1:
        raise ValueError(f"mig={text!r}: the memory must be at least 1 GiB")
    return MigProfile(int(m.group(1)), int(m.group(2)), media=m.group(3) is not None)


def parse_share(text: str) -> Share:
    """``K/M`` with 1 <= K <= M; ValueError naming the bad text otherwise."""
    m = _SHARE_RE.match(text)
    if m is None:
        raise ValueError(f"share={text!r}: expected K/M (e.g. 1/2)")
    part, of = int(m.group(1)), int(m.group(2))
    if of < 1 or part < 1 or part > of:
        raise ValueError(f"share={text!r}: expected 1 <= K <= M")
    return Share(part, of)


def parse_slice(text: str) -> DeviceSlice:
    """``mig=<profile>`` or ``share=K/M``; ValueError naming the bad part otherwise."""
    key, sep, value = text.strip().partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected mig=<G>g.<M>gb or share=K/M")
    if key == "mig":
        return DeviceSlice(mig=parse_mig_profile(value))
    if key == "share":
        return DeviceSlice(share=parse_share(value))
    raise ValueError(f"{key!r} in {text!r}: unknown slice kind (expected mig= or share=)")
