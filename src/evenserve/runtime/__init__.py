"""evenserve.runtime."""
