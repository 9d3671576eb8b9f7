#!/usr/bin/env python
"""Run the rpc-attention benchmark suite and keep the results here (benchmarks/results/).

The suite itself lives in the package (``rpc_attention/bench.py``) so that the installed command
``rpc-attention bench`` finds it; this script is the same command with the output directory fixed:

    python benchmarks/run.py            # full suite (CPU: ~20-40 min on 2 cores)
    python benchmarks/run.py --quick    # < 3 min on 2 cores
    python benchmarks/run.py --device cuda
"""

import os
import sys

from rpc_attention.cli import main

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", os.path.join(here, "results")]
    sys.exit(main(["bench", *args]))
