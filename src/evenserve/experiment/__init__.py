"""Experiments: what turns a scenario into live runs and back, between the CLI and the edges.

- ``scaling``: time scale K (the scenario K times slower, policies unchanged).
- ``load``: a scaled scenario's arrivals and the load generator's spec for one run.
- ``cluster``: one arm compiled into a local emulated cluster (profile sets, model
  repository, cluster YAML) and started with the ``evenserve up`` Launcher.
- ``stats``: figures across repeats; ``fidelity``: live against simulated.
- ``tables``, ``report``: the printed tables, ``summary.json``, plots and ``report.html``;
  ``report.rebuild_report`` is ``evenserve report``.
- ``scenario_bench`` (``evenserve bench --scenario``) and ``target_bench`` (``evenserve bench
  URL``): the runs, returning result objects; they print through the consoles passed in.

The CLI parses options and calls these; ``bench/`` scripts import them, never the CLI.
"""
