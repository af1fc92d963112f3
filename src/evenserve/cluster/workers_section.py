"""The cluster file's ``workers:`` section: the devices ``evenserve up`` starts a worker on."""

from __future__ import annotations

from pydantic import Field, field_validator

from evenserve.cluster.names import ModelName, Name
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.validation import Strict
from evenserve.runtime.device import parse_device


class DeviceEntry(DeviceOptions, QueueOptions):
    """One worker: its device and models, and how it runs and queues work (the scenario's
    DeviceOptions and QueueOptions, passed to the worker as its flags). How it batches each
    model the gateway learns from the worker's load reports."""

    name: Name
    device: str = Field(
        min_length=1,
        description="cpu | cuda:N | cuda:N#share=K/M | cuda:MIG-<uuid> | emulated:PROFILE_SET "
        "(#mig=<G>g.<M>gb or #share=K/M)",
    )
    models: list[ModelName] | None = Field(default=None, description="default: every repo model")
    port: int | None = Field(default=None, ge=1, le=65535)
    grpc_port: int | None = Field(
        default=None, ge=1, le=65535, description="also serve gRPC here (the gateway uses it)"
    )
    host: str | None = Field(
        default=None,
        min_length=1,
        description="where the gateway reaches this worker (default: workers.host); "
        "`evenserve up --ray` sets it to the node its actor runs on",
    )
    ray_node: str | None = Field(
        default=None,
        min_length=1,
        description="`evenserve up --ray`: the IP of the Ray node this worker must run on",
    )
    extra_args: list[str] = Field(default_factory=list, description="more worker CLI args")
    profiles: str | None = Field(
        default=None,
        description="profile set dir of a real device (cpu, cuda:N): the gateway's "
        "least-expected-work reads it, and `evenserve tune --cluster` simulates the device "
        "with it (an emulated:PROFILE_SET device has its own)",
    )
    active: bool = Field(
        default=True,
        description="false: a spare, not started by `evenserve up` until the autoscaler "
        "turns it on (needs gateway.placement and gateway.autoscaling)",
    )

    def option_flags(self) -> list[str]:
        """The worker flags for this device's options (only those the file sets)."""
        given = self.model_fields_set
        return [
            *DeviceOptions.of(self).flags(given),
            *QueueOptions.of(self).flags(given),
        ]

    @field_validator("device")
    @classmethod
    def _device_ok(cls, v: str) -> str:
        try:
            parse_device(v)
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("--device ")) from None
        return v


class WorkersSection(Strict):
    repo: str = Field(min_length=1, description="model repository (relative to the file)")
    host: str = "127.0.0.1"
    base_port: int = Field(default=8101, ge=1, le=65535)
    devices: list[DeviceEntry] = Field(min_length=1)
    ready_timeout_s: float = Field(default=120.0, gt=0)
    drain_timeout_s: float = Field(default=15.0, gt=0)
    restart: bool = Field(default=True, description="restart a worker that exits on its own")

    def port_of(self, i: int) -> int:
        d = self.devices[i]
        return d.port if d.port is not None else self.base_port + i

    def host_of(self, i: int) -> str:
        """Where the gateway reaches worker ``i``: its own ``host``, else ``workers.host``."""
        return self.devices[i].host or self.host
