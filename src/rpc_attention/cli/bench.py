"""``rpc-attention bench``: the performance suite (see ``docs/performance.md``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from . import UserError

if TYPE_CHECKING:
    from ..bench import HeapControl

HELP = "benchmark PAP against plain attention and the official formulation (operators and models)"
EXTRA = "all"  # the extra this command needs: pip install "rpc-attention[all]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller suite, under 3 minutes on 2 CPU cores")
    size.add_argument("--smoke", action="store_true", help="toy shapes, seconds: checks the machinery only")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i] (bf16 autocast, SDPA flash)")
    parser.add_argument("--out", default="benchmarks/results", help="directory for bench-<config>-<device>.json/.md")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default: per configuration; 0: memory only)")
    parser.add_argument("--only", default=None, metavar="GROUP",
                        help="run one group of cases: ops, models (rpc_attention.bench.CASE_GROUPS lists them), or "
                             "decode, the cached-decoding benchmark (docs/performance.md)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile case (full suite)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurements")


def run(args: argparse.Namespace, heap: Optional[HeapControl] = None) -> int:
    """Run the suite; ``heap`` is the C-heap control CPU peak memory needs (``benchmarks/run.py``'s)."""
    import sys

    from .. import bench

    if args.threads is not None and args.threads < 1:
        raise UserError("--threads must be >= 1")
    if args.repeats is not None and args.repeats < 0:
        raise UserError("--repeats must be >= 0 (0: memory measurements only)")
    device = str(args.device)
    if not (device == "cpu" or device.startswith("cuda")):
        raise UserError(f"--device must be cpu or cuda[:i], got {device!r}")
    bench.setup_process(args.threads)  # before any parallel torch work: pool threads inherit it
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device here")
    if args.only == "decode":
        from ..bench.decode import main_decode

        unused = [flag for flag, given in (("--repeats", args.repeats is not None), ("--no-compile", args.no_compile),
                                           ("--no-memory", args.no_memory)) if given]
        if unused:
            raise UserError(f"{', '.join(unused)} do(es) nothing with --only decode (it times single tokens after a prefill "
                            "and reports cache sizes); leave them out")

        main_decode("smoke" if args.smoke else "quick" if args.quick else "full", device, args.out)
        return 0
    cfg = bench.config("smoke" if args.smoke else "quick" if args.quick else "full")
    if args.repeats is not None:
        cfg.repeats = args.repeats
    if args.no_compile:
        cfg.compile = False
    if args.no_memory:
        cfg.memory = False
    try:
        results = bench.run_suite(cfg, device=device, progress=sys.stderr.isatty() or not args.smoke,
                                  only=None if args.only is None else [args.only], heap=heap)
        paths = bench.write_results(results, args.out)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    print(bench.to_markdown(results))
    print(f"wrote {paths['md']} and {paths['json']}")
    return 0
