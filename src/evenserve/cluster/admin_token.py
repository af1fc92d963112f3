"""The gateway's admin bearer token: a value whose repr hides it, the variable that carries it
to the processes ``evenserve up`` starts, and how a file holding it is written (0600).
``LoadedCluster.resolve_admin_token`` says which token a cluster uses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"
#: The shortest admin token accepted (from the file or the environment); a generated one has 32.
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class AdminToken:
    """The gateway's admin bearer token and where it came from. Its repr hides the value, so
    it cannot reach a log by accident: print ``source``, never ``value``."""

    value: str = field(repr=False)
    #: ``gateway.admin.token``, ``$NAME`` (the environment variable), or ``generated``.
    source: str

    @property
    def generated(self) -> bool:
        return self.source == "generated"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600, also when the file
    existed with a wider mode); for files that hold a secret."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path
