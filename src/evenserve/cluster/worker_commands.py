"""A worker's command line and environment under ``evenserve up``.

- GPUs are pinned with CUDA_VISIBLE_DEVICES=N (the worker then sees its GPU as cuda:0; a
  share keeps its ``#share=K/M``); a MIG slice ``cuda:MIG-<uuid>`` with
  CUDA_VISIBLE_DEVICES=<uuid> (its worker sets the same itself); ``emulated:`` and ``cpu``
  workers get an empty CUDA_VISIBLE_DEVICES. An emulated device's profile set is passed as
  its folder (``LoadedCluster.profile_dir``).
- A device that hosts only some of the repository's models gets ``--models a,b``.
- With ``gateway.placement`` every worker runs with ``--model-control explicit``, its
  configured models as ``--load-model`` (so the gateway's placement view of residents
  matches; none for a spare) and ``--load-wait-ms`` from the placement section.
- The gateway's admin token (it pushes parameters to the workers with it) is in the
  environment only, as ``EVENSERVE_ADMIN_TOKEN``, never on the command line or in a log.
- A device's typed options (``DeviceEntry.option_flags``) and its ``extra_args`` come last.
"""

from __future__ import annotations

from collections.abc import Sequence

from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV
from evenserve.cluster.file import LoadedCluster
from evenserve.cluster.gateway_section import PlacementSettings
from evenserve.cluster.processes import cli_cmd
from evenserve.cluster.workers_section import DeviceEntry
from evenserve.core.errors import ConfigError
from evenserve.runtime.device import parse_device


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


def device_arg(cluster: LoadedCluster, device: str) -> str:
    """``device`` with an emulated device's profile set named by its folder, where found."""
    target = parse_device(device)
    if target.kind == "emulated" and target.profile_set is not None:
        where = cluster.profile_dir(target.profile_set)
        if where is not None:
            tail = f"#{target.slice.text}" if target.slice is not None else ""
            return f"emulated:{where}{tail}"
    return device


def models_args(cluster: LoadedCluster, i: int, d: DeviceEntry) -> list[str]:
    """``--models a,b`` for a device that hosts only some of the repository's models."""
    if d.models is None:
        return []
    all_models = cluster.repo_models()
    missing = [m for m in d.models if m not in all_models]
    if missing:
        w = cluster.config.workers
        assert w is not None
        raise ConfigError(
            f"workers.devices.{i}.models: {', '.join(missing)} not in "
            f"{cluster.resolve(w.repo)} (has: {', '.join(all_models) or 'none'})"
        )
    return ["--models", ",".join(d.models)]


def placement_args(
    cluster: LoadedCluster, i: int, d: DeviceEntry, load_wait_ms: float
) -> list[str]:
    """A worker under placement: explicit model control, its configured models loaded at
    startup (none for a spare), the placement's load-wait bound."""
    models_args(cluster, i, d)  # checks they are in the repository
    startup = [] if not d.active else d.models or cluster.repo_models()
    loads = [a for m in startup for a in ("--load-model", m)]
    return ["--model-control", "explicit", *loads, "--load-wait-ms", f"{load_wait_ms:g}"]


def worker_command(
    cluster: LoadedCluster,
    i: int,
    python: str,
    base_env: dict[str, str],
    admin_token: str,
    placement: PlacementSettings | None,
    pool_args: Sequence[str],
) -> tuple[list[str], dict[str, str]]:
    """Device ``i``'s worker: its command line (run with ``python``) and its environment
    (``base_env`` with the pinning and the admin token)."""
    w = cluster.config.workers
    assert w is not None
    d = w.devices[i]
    dev, env = worker_env(device_arg(cluster, d.device), base_env)
    env[DEFAULT_TOKEN_ENV] = admin_token
    if placement is None:
        models = models_args(cluster, i, d)
    else:
        models = placement_args(cluster, i, d, placement.load_wait_ms)
    cmd = cli_cmd(
        python, "worker",
        "--repo", str(cluster.resolve(w.repo)),
        "--device", dev,
        "--name", d.name,
        "--port", str(w.port_of(i)),
        *([] if d.grpc_port is None else ["--grpc-port", str(d.grpc_port)]),
        *models,
        *pool_args,
        *d.option_flags(),
        *d.extra_args,
    )  # fmt: skip
    return cmd, env
