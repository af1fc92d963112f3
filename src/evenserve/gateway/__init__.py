"""evenserve.gateway."""
