"""The scale channel of ``evenserve up`` (``gateway.autoscaling``): the gateway's autoscaler
decides which devices are on, the launcher starts and stops their workers. A worker the
channel starts starts with no model resident (its ``--load-model`` flags left out): the
placement controller counts a device turned on as empty (``device_ready``), the simulator
starts it so, and placement loads there what it wants, each load paying its time. (Before,
a device turned off and on again came back with its configured models, its LLM awake at
once: a wake the controller never decided, and no load time paid for it.)

Every supervision round the launcher GETs the gateway's ``/admin/scale`` with the admin token
it holds (``{"requests": [{device, action: start | stop}]}``). ``start``: start that worker
(the gateway admits it once it is ready: device_ready). ``stop`` (the gateway has held it out
of routing and nothing is outstanding there): SIGTERM (the worker drains again and exits),
SIGKILL after the drain timeout, then POST ``{"device", "event": "stopped"}`` back
(device_stopped). A failed round is tried again the next time.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Sequence

import httpx

from evenserve.cluster.processes import WorkerProc

#: Carry out a round's requests; the reports to POST back.
Step = Callable[[list[dict[str, str]]], list[dict[str, str]]]


def carry_out(
    requests: list[dict[str, str]],
    workers: Sequence[WorkerProc],
    on: set[str],
    stopping: dict[str, float],
    drain_timeout_s: float,
    say: Callable[[str], None],
) -> list[dict[str, str]]:
    """Carry out the gateway's scale requests: ``on`` (the workers that should run) and
    ``stopping`` (those sent SIGTERM, with the monotonic time) are updated; returns the
    reports to POST back (``{"device", "event": "stopped"}``, once per stop)."""
    by_name = {p.name: p for p in workers}
    reports: list[dict[str, str]] = []
    for req in requests:
        p = by_name.get(req.get("device", ""))
        if p is None:
            continue
        action = req.get("action")
        if action == "start" and p.name not in on:
            on.add(p.name)
            stopping.pop(p.name, None)
            p.close_log()
            p.start(bare=True)  # empty, as the controller and the simulator count it
            say(f"scale up: started worker {p.name} (pid {p.pid})")
        elif action == "stop" and p.name in on and p.name not in stopping:
            on.discard(p.name)
            stopping[p.name] = time.monotonic()
            p.signal(signal.SIGTERM)
            say(f"scale down: stopping worker {p.name} (drained at the gateway)")
    for name, since in list(stopping.items()):
        p = by_name[name]
        if p.alive() and time.monotonic() - since > drain_timeout_s:
            say(f"{name} did not stop in {drain_timeout_s:g} s; killing it")
            p.signal(signal.SIGKILL)
        if not p.alive():
            del stopping[name]
            p.wait()
            p.close_log()
            reports.append({"device": name, "event": "stopped"})
            say(f"scale down: worker {name} stopped")
    return reports


def poll(client: httpx.Client, gateway_url: str, admin_token: str, step: Step) -> None:
    """One round over the gateway's admin API (errors: next time)."""
    auth = {"authorization": f"Bearer {admin_token}"}
    url = f"{gateway_url}/admin/scale"
    try:
        r = client.get(url, headers=auth)
        requests = r.json().get("requests", []) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        requests = []
    for report in step(requests):
        with contextlib.suppress(httpx.HTTPError):
            client.post(url, headers=auth, json=report)
