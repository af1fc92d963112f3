"""evenserve: keep every GPU of a shared pool usefully busy inside the latency SLO."""

__version__ = "0.1.0"
