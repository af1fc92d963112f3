"""The ``evenserve`` command line."""
