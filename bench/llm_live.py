"""An LLM scenario's arms live on an emulated worker beside the simulator: the same as
``evenserve bench --scenario scenarios/llm-mix.yaml`` (see ``evenserve.experiment.llm_live``
for what it runs, the time scale and the bounds).

    python bench/llm_live.py --arm continuous-chunked --arm colocated \\
        --duration 20 --warmup 4 --time-scale 10 [--json out/llm-live.json]
"""

from __future__ import annotations

import sys

from evenserve.experiment.llm_live import main

if __name__ == "__main__":
    sys.exit(main())
