"""``rpc-attention presets``: list the training presets, one per line."""

from __future__ import annotations

import argparse

HELP = "List training presets (name and one-line description)"
EXTRA = "train"  # the extra this command needs: pip install "rpc-attention[train]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--show", metavar="NAME", help="print one preset's resolved config instead")


def run(args: argparse.Namespace) -> int:
    from ..train.config import dump_config, list_presets, resolve_config
    from . import UserError

    if args.show:
        try:
            print(dump_config(resolve_config(args.show)), end="")
        except (ValueError, FileNotFoundError) as exc:
            raise UserError(str(exc)) from None
        return 0
    items = list_presets()
    width = max((len(n) for n, _ in items), default=0)
    for name, desc in items:
        print(f"{name:<{width}}  {desc}".rstrip())
    return 0
