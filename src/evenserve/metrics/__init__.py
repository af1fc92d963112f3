"""evenserve.metrics."""
