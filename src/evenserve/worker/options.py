"""The worker's options: the device, its queues and batching, model control, the host pool,
warm-up and the admin token (the CLI and a cluster's launcher build them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.slowdown import SlowdownSchedule
from evenserve.runtime.device import DeviceTarget
from evenserve.worker.warmup import WarmupSpec


@dataclass
class WorkerOptions:
    device: DeviceTarget
    #: The worker's device name (``--name``; a cluster's launcher gives the device's, e.g.
    #: ``gpu0``): the ``device`` label of its metrics and its load report. None: the device
    #: string (``cuda:0``, ``emulated:PROFILE_SET``, which workers on one profile set share).
    name: str | None = None
    #: Instances, interference and (emulated) memory: the scenario's device options.
    run: DeviceOptions = field(default_factory=DeviceOptions)
    #: Queue bound, starvation bound, class headroom: the scenario's arm options; a model's
    #: ``max_queue_size`` overrides the bound.
    queue: QueueOptions = field(default_factory=lambda: QueueOptions(max_queue_per_model=1024))
    max_body_bytes: int = 64 * 1024 * 1024
    batching_override: Any = None
    profiles_dir: Path | None = Path("profiles")
    utilization_window_s: float = 1.0
    cpu_threads: int | None = None
    drain_timeout_s: float = 30.0
    #: Model control (Triton's ``--model-control-mode``): ``none``, the models given are
    #: served for the worker's life; ``explicit``, the repository extension's load and unload
    #: requests change them; ``poll``, the repository is rescanned every
    #: ``repository_poll_s`` (new folders load, removed ones unload, a changed model.yaml
    #: reloads).
    model_control: Literal["none", "explicit", "poll"] = "none"
    #: The model repository (model control loads from it; the index lists its folders).
    repository: Path | None = None
    repository_poll_s: float = 5.0
    #: How long an inference request for a model being loaded waits for the load to end
    #: before it is answered 503 (``--load-wait-ms``).
    load_wait_s: float = 10.0
    #: The host's warm pool (``--host-pool``, shared by the host's workers) and its capacity
    #: (``--host-pool-gb``); None: no pool, every load is from disk.
    host_pool: Path | None = None
    host_pool_bytes: float = 0.0
    #: Profiles that learn (``--learn-profiles``): each model's profile here follows its
    #: measured batch times (``core.profile_learning``), and the load report carries them.
    learn_profiles: bool = False
    #: An emulated device slower than its profiles (``--slowdown``, ``--slowdown-phases``,
    #: phases in seconds from ``slowdown_origin_unix_s``, None: the first batch).
    slowdown: SlowdownSchedule | None = None
    slowdown_origin_unix_s: float | None = None
    #: An emulated device that stages each batch's inputs for this long per item before it
    #: computes (``--staging-ms-per-item``, in seconds; the executor's compute_input).
    staging_s_per_item: float = 0.0
    #: The batch sizes each model runs after it loads, before it is ready (``--warmup``):
    #: ``all`` (1..max_batch_size), ``first`` (batch 1), ``none``, or the sizes themselves
    #: (those above a model's max_batch_size are left out); emulated models never do.
    warmup: WarmupSpec = "all"
    #: The admin API's bearer token (``--admin-token-file`` or ``$EVENSERVE_ADMIN_TOKEN``);
    #: None: ``/admin/*`` is off (404). Never shown (not in the repr).
    admin_token: str | None = field(default=None, repr=False)
