"""``evenserve``: the command line (each command lives in a module named for what it runs)."""

from __future__ import annotations

from evenserve.cli import (
    bench_cmd,
    diagnose_cmd,
    gateway_cmd,
    optimize_cmd,
    params_cmd,
    record_cmd,
    sim_cmd,
    tune_cmd,
    worker_cmd,
)
from evenserve.cli.app import app

#: Every command, in the order ``evenserve --help`` lists them.
COMMANDS = (
    sim_cmd.simulate,
    sim_cmd.compare,
    sim_cmd.policies,
    tune_cmd.tune,
    diagnose_cmd.diagnose,
    bench_cmd.bench,
    bench_cmd.report,
    gateway_cmd.gateway,
    gateway_cmd.up,
    record_cmd.record,
    worker_cmd.worker,
    worker_cmd.profile,
    optimize_cmd.optimize,
)
for _command in COMMANDS:
    app.command()(_command)
app.add_typer(params_cmd.params_app, name="params")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
