"""The device scheduler, shared by the simulator and the live worker (see ``scheduler``)."""

from evenserve.sched.actions import Batch, SchedulerActions
from evenserve.sched.busy import BusyClock
from evenserve.sched.queue import Offer, RequestQueue
from evenserve.sched.queues import (
    DISPATCHED,
    GONE,
    NO_QUEUE_OPTIONS,
    QUEUED,
    SHUTDOWN,
    UNLOADED,
    ModelQueue,
    ModelSetup,
    QueuedRequest,
    QueueSet,
)
from evenserve.sched.scheduler import DRAINING, ONE_INSTANCE, DeviceScheduler, scheduler_for
from evenserve.sched.setup import Batching, batching_setup

__all__ = [
    "DISPATCHED",
    "DRAINING",
    "GONE",
    "NO_QUEUE_OPTIONS",
    "ONE_INSTANCE",
    "QUEUED",
    "SHUTDOWN",
    "UNLOADED",
    "Batch",
    "Batching",
    "BusyClock",
    "DeviceScheduler",
    "ModelQueue",
    "ModelSetup",
    "Offer",
    "QueueSet",
    "QueuedRequest",
    "RequestQueue",
    "SchedulerActions",
    "batching_setup",
    "scheduler_for",
]
