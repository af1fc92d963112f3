"""evenserve.loadgen."""
