"""Cluster tooling: the cluster file, ``evenserve up`` (local processes or Ray actors). Not on
the request path; imports neither the gateway nor the worker."""
