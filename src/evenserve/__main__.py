"""``python -m evenserve`` runs the command line (``evenserve up`` starts its children so)."""

from evenserve.cli.main import main

if __name__ == "__main__":  # not when multiprocessing's spawn imports it as __mp_main__
    main()
