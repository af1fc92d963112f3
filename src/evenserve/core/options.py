"""How a device runs and queues work, and how one model's requests are classed: one typed
model each, shared by scenario files, cluster files, ``model.yaml`` and the worker's flags,
so every option is spelled, bounded and validated once.

- DeviceOptions: scenario ``devices[]``, cluster ``workers.devices[]``, worker flags.
- QueueOptions: scenario ``arms.*``, cluster ``workers.devices[]``, worker flags.
- ModelOptions: scenario ``models.*`` and ``model.yaml``.

A field ``some_name`` is the worker flag ``--some-name`` (``flags`` writes them, for the
launcher; ``from_flags`` reads them, errors naming the flag).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Self

from pydantic import BaseModel, Field, ValidationError, field_validator

from evenserve.core.contention import DEFAULT_INTERFERENCE
from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict
from evenserve.core.wire import PRIORITY_CLASSES


class FlagOptions(Strict):
    """Options that are also worker flags."""

    def flags(self, only: Iterable[str] | None = None) -> list[str]:
        """The worker flags that give these values (None fields left out; with ``only``,
        just those fields)."""
        out: list[str] = []
        keep = None if only is None else set(only)
        for name in type(self).model_fields:
            if keep is not None and name not in keep:
                continue
            value = getattr(self, name)
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                out += [flag] if value else []
            elif value is not None:
                out += [flag, repr(value) if isinstance(value, float) else str(value)]
        return out

    @classmethod
    def of(cls, obj: BaseModel) -> Self:
        """These options of a model that has them among its fields (a scenario device, a
        cluster device, a scenario arm)."""
        return cls.model_validate({k: getattr(obj, k) for k in cls.model_fields})

    @classmethod
    def from_flags(cls, **values: Any) -> Self:
        """Validate flag values; an error names the flag (``--starvation-ms: ...``)."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            e = exc.errors()[0]
            flag = "--" + str(e["loc"][0]).replace("_", "-") if e["loc"] else cls.__name__
            raise ConfigError(f"{flag}: {e['msg']}") from None


class DeviceOptions(FlagOptions):
    instances: int = Field(
        default=1, ge=1, le=64, description="batches the device runs at once (any models)"
    )
    interference: float = Field(
        default=DEFAULT_INTERFERENCE,
        ge=0,
        le=1,
        description="slowdown of concurrent batches (core.contention); 1/3: two at 0.75x",
    )
    memory_gb: float = Field(
        default=24.0, gt=0, description="memory of an emulated device, GiB (a real one is read)"
    )


class QueueOptions(FlagOptions):
    max_queue_per_model: int | None = Field(
        default=None, ge=1, description="requests waiting per model before refusals"
    )
    starvation_ms: float | None = Field(
        default=None, gt=0, description="a lower class waiting longer than this goes first"
    )
    class_headroom: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="lower classes run only while higher classes' demand is at most this",
    )
    ignore_priority: bool = Field(
        default=False, description="serve every class alike (FIFO baseline); figures keep classes"
    )

    @property
    def starvation_s(self) -> float | None:
        return None if self.starvation_ms is None else self.starvation_ms / 1000.0


class ModelOptions(Strict):
    slo_ms: float | None = Field(default=None, gt=0, description="latency SLO")
    priority: int | str = Field(
        default="online", description="class of requests that bring none: integer or name"
    )
    deadline_ms: float | None = Field(
        default=None, gt=0, description="default per-request deadline (hard; None: no deadline)"
    )

    @field_validator("priority")
    @classmethod
    def _known_class(cls, v: int | str) -> int | str:
        if isinstance(v, str) and v not in PRIORITY_CLASSES:
            raise ValueError(f"unknown priority class {v!r} (known: {', '.join(PRIORITY_CLASSES)})")
        return v

    @property
    def priority_value(self) -> int:
        return self.priority if isinstance(self.priority, int) else PRIORITY_CLASSES[self.priority]

    @property
    def slo_s(self) -> float | None:
        return None if self.slo_ms is None else self.slo_ms / 1000.0

    @property
    def deadline_s(self) -> float | None:
        return None if self.deadline_ms is None else self.deadline_ms / 1000.0
