"""``rpc-attention compare``: validation curves of several runs on one figure, and a table of best and
final values (the Scaled Attention study: plain vs Scaled-S vs Scaled-alpha ViT)."""

from __future__ import annotations

import argparse

HELP = "Plot validation curves of several runs on one figure and tabulate best/final values"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", dest="run_dirs", action="append", default=[], metavar="DIR",
                        help="a run directory with metrics.jsonl (repeatable, in plot order)")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run directories given without --run (same meaning)")
    parser.add_argument("--out", required=True, metavar="DIR", help="writes compare.png, compare.md, compare.json")
    parser.add_argument("--metric", action="append", default=None, metavar="KEY",
                        help="validation metric to plot (repeatable; default: accuracy-like metric and loss)")
    parser.add_argument("--label", action="append", default=None, metavar="NAME",
                        help="label per run, in order (default: the run directory name)")
    parser.add_argument("--split", default="val", help="which logged split to plot (default val)")
    parser.add_argument("--force", action="store_true", help="replace an earlier comparison in --out")


def run(args: argparse.Namespace) -> int:
    import os

    from ..report.compare import compare_runs
    from . import UserError

    runs = list(args.run_dirs) + list(args.runs)
    if not runs:
        raise UserError("give the runs to compare: --run DIR (repeatable)")
    if os.path.exists(os.path.join(args.out, "compare.json")) and not args.force:
        raise UserError(f"{args.out} already holds a comparison (compare.json); give another --out, or --force to "
                        f"replace it")

    try:
        table = compare_runs(runs, args.out, metrics=args.metric, labels=args.label, split=args.split)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    for row in table["runs"]:
        parts = [f"{m}: best {row[m]['best']:.4g} (ep {row[m]['best_epoch']:g}), final {row[m]['final']:.4g}"
                 for m in table["metrics"] if row[m]]
        print(f"{row['label']}: " + "; ".join(parts))
    print(f"wrote {args.out}/compare.png, compare.md, compare.json")
    return 0
