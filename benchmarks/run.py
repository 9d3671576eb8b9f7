#!/usr/bin/env python
"""Run the rpc-attention benchmark suite and keep the results here (benchmarks/results/).

The suite itself lives in the package (``rpc_attention/bench/``, the ``rpc-attention bench``
command); this runner takes the same options, fixes the output directory and adds what only a
benchmark process should do: glibc heap control (``glibc_heap.py``), so CPU rows get peak memory.

    python benchmarks/run.py            # full suite (CPU: ~20-40 min on 2 cores)
    python benchmarks/run.py --quick    # < 3 min on 2 cores
    python benchmarks/run.py --device cuda
"""

import argparse
import os
import sys

from rpc_attention.cli import UserError
from rpc_attention.cli import bench as bench_command

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from glibc_heap import GlibcHeap  # noqa: E402  (this folder is not a package)


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=bench_command.HELP)
    bench_command.add_arguments(parser)
    parser.set_defaults(out=os.path.join(here, "results"))
    args = parser.parse_args(argv)
    try:
        return bench_command.run(args, heap=GlibcHeap())
    except UserError as exc:
        print(f"benchmarks/run.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
