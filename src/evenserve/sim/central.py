"""The ``central-queue`` reference arm: work-conserving late binding (Clockwork, Sparrow).

There is no router. Every request joins one queue per model (a QueueSet shared by all
devices); each device is a DeviceScheduler over the shared queues of the models it hosts,
with its own profiles. An arrival is offered to the shared queue (admission as on a device
with a free instance) and then the idle hosting devices, longest idle first, are told the
queues changed; a device that frees up serves the shared queues as any device serves its
own. Hopeless requests are dropped when a device next decides (there is no deadline watch:
no single device owns the queues' timers). Queue figures are the shared queues' (the
devices report none of their own).
"""

from __future__ import annotations

from evenserve.sched import DeviceScheduler, QueueSet
from evenserve.sim.device import SimHost, SimRequest


class CentralQueue:
    def __init__(self, sim: SimHost) -> None:
        self.sim = sim
        sc, arm = sim.sc, sim.arm
        specs = [d for d in sc.arm_devices(sim.arm_name) if d.active]
        profiles = {s.name: sim.loaded.profiles_for(s) for s in specs}
        # Admission reads a model's first host's profile (devices may differ).
        first = {m: next(p[m] for p in profiles.values() if m in p) for m in sc.models}
        self.queues: QueueSet[SimRequest] = QueueSet(
            [sim.model_setup(m, first[m]) for m in sc.models],
            lambda r, reason: sim.drop(r, reason, None),
            arm,
            sim.warmup_s,
            watch_deadlines=False,
        )
        for spec in specs:
            d = sim.add_device(spec.name, profiles[spec.name])
            d.trace.instances = spec.instances
            d.sched = DeviceScheduler(
                self.queues,
                d,
                models=d.models,
                device=spec,
                memory_total_bytes=spec.memory_total_bytes,
                utilization_window_s=sim.utilization_window_s,
                profiles=d.profiles,
            )

    def arrive(self, r: SimRequest) -> None:
        now = self.sim.loop.now
        reason = self.queues.offer(r, now)
        if reason is not None:
            self.sim.drop(r, reason, None)
            return
        idle = [d for d in self.sim.hosts[r.model] if d.sched.free_instances]
        idle.sort(key=lambda d: d.idle_since_s)
        queue = self.queues.queues[r.model].queue
        for d in idle:
            if not queue:
                break
            d.sched.queues_changed(now)

    def depth(self, end_s: float) -> tuple[float, float]:
        """Max and exact time-weighted mean of the shared queues' depth after the warm-up."""
        mean = self.queues.mean_depth(end_s)
        return float(self.queues.depth_max), mean
