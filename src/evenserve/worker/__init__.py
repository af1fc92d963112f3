"""evenserve.worker."""
