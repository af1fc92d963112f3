"""The device scheduler, shared by the simulator and the live worker (see ``scheduler``)."""

from evenserve.sched.actions import Batch, SchedulerActions
from evenserve.sched.busy import BusyClock
from evenserve.sched.queue import Offer, RequestQueue
from evenserve.sched.queues import (
    DISPATCHED,
    GONE,
    QUEUED,
    SHUTDOWN,
    ModelQueue,
    ModelSetup,
    QueuedRequest,
    QueueSet,
)
from evenserve.sched.scheduler import DRAINING, DeviceScheduler, scheduler_for

__all__ = [
    "DISPATCHED",
    "DRAINING",
    "GONE",
    "QUEUED",
    "SHUTDOWN",
    "Batch",
    "BusyClock",
    "DeviceScheduler",
    "ModelQueue",
    "ModelSetup",
    "Offer",
    "QueueSet",
    "QueuedRequest",
    "RequestQueue",
    "SchedulerActions",
    "scheduler_for",
]
