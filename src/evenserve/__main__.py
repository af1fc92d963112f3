"""``python -m evenserve`` runs the command line."""

from evenserve.cli.main import main

main()
