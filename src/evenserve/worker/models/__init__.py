"""The models a worker hosts: their registry (one record per model, with load/unload hooks),
building and loading them with the host's warm pool, and model control (load, unload, poll,
and waiting for a load)."""
