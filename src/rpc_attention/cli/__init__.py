"""``rpc-attention`` command line.

Each sub-command lives in its own module ``rpc_attention.cli.<name>`` defining::

    HELP = "one line"
    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...

and is listed in :func:`commands`. Every module is imported to build the parser, so keep heavy imports
inside ``run``. A command holds argument handling and printing only; what it does is a library
function a study stage can call too. Errors meant for users raise :class:`UserError` (one line, exit
code 2).
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import List, Optional, Tuple


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback."""


def commands() -> List[Tuple[str, ModuleType]]:
    """``(command name, module)`` of every sub-command, in the order ``--help`` lists them."""
    from . import analyze, bench, compare, eval, eval_external, generate, pap_demo, presets, reproduce, train

    return [("analyze", analyze), ("bench", bench), ("compare", compare), ("eval", eval),
            ("eval-external", eval_external), ("generate", generate), ("pap-demo", pap_demo),
            ("presets", presets), ("reproduce", reproduce), ("train", train)]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="rpc-attention",
        description="RPC-Attention: robust attention by Principal Attention Pursuit, and the kernel-PCA view of attention.",
    )
    parser.add_argument("--version", action="version", version=f"rpc-attention {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in commands():
        p = sub.add_parser(name, help=getattr(module, "HELP", ""), description=getattr(module, "HELP", None))
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    import torch

    # Before any parallel op, so that the OpenMP workers inherit it: see docs/performance.md
    # (denormals make PAP's backward 10-100x slower on x86 CPUs). No effect on GPUs.
    torch.set_flush_denormal(True)
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"rpc-attention {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
