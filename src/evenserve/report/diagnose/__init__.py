"""Findings from one run's summary: a named cause, its evidence and severity, and the changes
that might fix it (pure: reads the summary dict that ``report.summary.summarize`` writes, or a
live collection of the same shape; docs/design/0012-diagnose.md).

Each detector reads figures the run measured and stays quiet when a figure is missing (None):
a live run without a figure cannot show the cause, and a finding is never made of a 0 that
was not measured. One cause is reported once: a device slower than its profile (or stalled
on input staging) is not also reported hot or imbalanced, a compute-bound model that waits
is not also "window too long".

A finding's ``candidates`` are concrete changes (a partial parameter set, a placement change,
or a device change) that ``experiment.diagnose`` tries in the simulator on the same
arrivals; the best one becomes the finding's ``recommendation``.

The package: ``findings`` (what a finding is: kinds, severities, thresholds, candidates),
``readings`` (one arm's summary as the detectors read it, and the changes several of them
propose), ``devices`` (the findings about devices and the cluster: slow, hot, imbalanced,
shedding, stalled on staging, short of memory), ``batching`` (the findings about a model's
batching on a device) and ``arm`` (every finding of one arm, one cause reported once, and
the SLO outcome that takes the causes' changes).
"""

from evenserve.report.diagnose.arm import diagnose_arm
from evenserve.report.diagnose.findings import (
    DEFAULT,
    KINDS,
    SEVERITIES,
    Candidate,
    Finding,
    Thresholds,
    window_of,
)
from evenserve.report.diagnose.readings import per_item_ratio

__all__ = [
    "DEFAULT",
    "KINDS",
    "SEVERITIES",
    "Candidate",
    "Finding",
    "Thresholds",
    "diagnose_arm",
    "per_item_ratio",
    "window_of",
]
