"""Poll model control (``--model-control poll``): the repository rescanned every
``--repository-poll-secs``; new folders load, removed ones unload, and a folder whose config
(model.yaml, or a Triton folder's config.pbtxt) or variant.yaml changed reloads."""

from __future__ import annotations

import asyncio
import logging

from evenserve.core.errors import ConfigError
from evenserve.worker.models.control import ModelControl, ModelControlError, stamp
from evenserve.worker.models.registry import UNAVAILABLE, ModelState
from evenserve.worker.repository import model_folders

#: The name the worker's model lines have always been logged under (``--log-level``).
log = logging.getLogger("evenserve.worker.service")


class RepositoryPoller:
    """Rescans the repository and has model control follow it."""

    def __init__(self, control: ModelControl) -> None:
        self.control = control

    async def poll(self) -> list[tuple[str, str]]:
        """One rescan of the repository (poll model control): load new folders, unload the
        models whose folder is gone, reload those whose model.yaml (or config.pbtxt) changed.
        A folder whose load failed is tried again once its config changes. Returns what it did:
        (model, ``load`` | ``reload`` | ``unload`` | ``load failed``)."""
        repo = self.control.options.repository
        assert repo is not None
        done: list[tuple[str, str]] = []
        try:
            folders = {d.name: d for d in model_folders(repo)}
        except ConfigError as exc:
            log.warning("repository poll: %s", exc)
            return done
        for name, d in folders.items():
            mtime = stamp(d)
            loaded = name in self.control.models
            if name in self.control.mtimes and self.control.mtimes[name] == mtime:
                continue
            if not loaded and self.control.models.states.get(
                name, ModelState(UNAVAILABLE)
            ).state != (UNAVAILABLE):
                continue  # loading or unloading: the next poll looks again
            self.control.mtimes[name] = mtime
            try:
                await self.control.load_model(name)
                done.append((name, "reload" if loaded else "load"))
            except ModelControlError as exc:
                log.warning("repository poll: %s", exc)
                done.append((name, "load failed"))
        for name in [n for n in self.control.models if n not in folders]:
            try:
                await self.control.unload_model(name)
                done.append((name, "unload"))
            except ModelControlError as exc:
                log.warning("repository poll: %s", exc)
        return done

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.control.options.repository_poll_s)
            if self.control.models.draining:
                return
            try:
                await self.poll()
            except Exception:  # a poll must never end the poller
                log.exception("repository poll failed")
