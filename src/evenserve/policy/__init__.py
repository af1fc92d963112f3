"""Pure policies: routing and batching decisions as functions of a snapshot.

Nothing here sleeps, does I/O or reads the wall clock; drivers pass ``now``. The same objects
run in the live gateway/worker and in the simulator.
"""
