"""What a client connection may ask of the server (``Limits``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection may ask of the server (the package's docstring)."""

    max_message_bytes: int = 4 * 1024 * 1024
    max_header_list_bytes: int = 16 * 1024
    max_concurrent_streams: int = 256
    #: The MAX_FRAME_SIZE advertised (frames up to it are read).
    max_frame_bytes: int = 1 << 20
    #: The window given to each stream and to the connection.
    window_bytes: int = 16 * 1024 * 1024
    preface_timeout_s: float = 10.0
    max_connections: int = 4096

    @property
    def hard_header_list_bytes(self) -> int:
        """A header block over this (compressed or decoded) is a connection error."""
        return max(4 * self.max_header_list_bytes, 64 * 1024)
