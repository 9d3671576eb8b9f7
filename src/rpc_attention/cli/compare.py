"""``rpc-attention compare``: validation curves of several runs on one figure, and a table of best and
final values (the Scaled Attention study: plain vs Scaled-S vs Scaled-alpha ViT); for runs with
evaluation results (``rpc-attention eval``), their robustness side by side with paired differences; and
with ``--against``, a study's run against its published results (verdicts, digits, both machines)."""

from __future__ import annotations

import argparse

HELP = ("Compare runs: validation curves and best/final values; evaluation results (robustness) side by side "
        "with paired differences")
EXTRA = "report"  # the extra this command needs: pip install "rpc-attention[report]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", dest="run_dirs", action="append", default=[], metavar="DIR",
                        help="a run directory with metrics.jsonl (repeatable, in plot order)")
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="run directories given without --run (same meaning); a folder of evaluation results "
                             "(eval --out DIR, eval-external's RUN/eval-rpc-...) also works")
    parser.add_argument("--against", metavar="NAME|FILE",
                        help="compare one study run (its --out folder, or a results.json) with published results: "
                             "docs/results/NAME.json, or a JSON file; prints whether the verdicts are equal, how "
                             "many numbers print the same digits, the largest difference and both machines")
    parser.add_argument("--out", metavar="DIR",
                        help="writes compare.png/.md/.json (training curves, runs with metrics.jsonl) and "
                             "robustness.png/.md/.json (evaluation results, runs evaluated with rpc-attention eval)")
    parser.add_argument("--metric", action="append", default=None, metavar="KEY",
                        help="validation metric to plot (repeatable; default: accuracy-like metric and loss)")
    parser.add_argument("--label", action="append", default=None, metavar="NAME",
                        help="label per run, in order (default: the run directory name)")
    parser.add_argument("--split", default="val", help="which logged split to plot (default val)")
    parser.add_argument("--force", action="store_true", help="replace an earlier comparison in --out")
    parser.add_argument("--resamples", type=int, default=2000, metavar="N",
                        help="bootstrap resamples of the examples for the paired intervals (default 2000)")


def run(args: argparse.Namespace) -> int:
    import os

    from ..report.eval_compare import has_eval_results
    from . import UserError

    runs = list(args.run_dirs) + list(args.runs)
    if not runs:
        raise UserError("give the runs to compare: --run DIR (repeatable)")
    if args.against:
        return _against(args, runs)
    if not args.out:
        raise UserError("--out DIR is needed: where compare.png/.md/.json go (or --against NAME for a study run)")
    for name in ("compare.json", "robustness.json"):
        if os.path.exists(os.path.join(args.out, name)) and not args.force:
            raise UserError(f"{args.out} already holds a comparison ({name}); give another --out, or --force to "
                            f"replace it")
    missing = [r for r in runs if not os.path.isdir(r)]
    if missing:
        raise UserError(f"run directory {missing[0]!r} does not exist (no metrics.jsonl, no evaluation results)")
    curves = all(os.path.isfile(os.path.join(r, "metrics.jsonl")) for r in runs)
    evals = all(has_eval_results(r) for r in runs)
    if not curves and not evals:
        raise UserError("nothing to compare: give training runs (with metrics.jsonl) or runs evaluated with "
                        "`rpc-attention eval` (RUN/eval/<suite>.json) or folders of results, all of one kind")
    if args.resamples < 1:
        raise UserError(f"--resamples must be >= 1, got {args.resamples}")
    if curves:
        _curves(args, runs)
    if evals:
        _robustness(args, runs)
    return 0


def _curves(args: argparse.Namespace, runs) -> None:
    from ..report.compare import compare_runs
    from . import UserError

    try:
        table = compare_runs(runs, args.out, metrics=args.metric, labels=args.label, split=args.split)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    for row in table["runs"]:
        parts = [f"{m}: best {row[m]['best']:.4g} (ep {row[m]['best_epoch']:g}), final {row[m]['final']:.4g}"
                 for m in table["metrics"] if row[m]]
        print(f"{row['label']}: " + "; ".join(parts))
    print(f"wrote {args.out}/compare.png, compare.md, compare.json")


def _robustness(args: argparse.Namespace, runs) -> None:
    import os

    from ..report.eval_compare import compare_evals
    from . import UserError

    try:
        compare_evals(runs, args.out, labels=args.label, resamples=args.resamples)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    with open(os.path.join(args.out, "robustness.md"), encoding="utf-8") as f:
        print(f.read(), end="")
    print(f"wrote {args.out}/robustness.png, robustness.md, robustness.json")


def _against(args: argparse.Namespace, runs) -> int:
    import json
    from pathlib import Path

    from ..report.drift import agreement_lines
    from ..report.publish import RESULTS_DIR
    from . import UserError

    if len(runs) != 1 or args.out or args.metric or args.label:
        raise UserError("--against compares one study run with published results: give one run and no "
                        "--out, --metric or --label")

    def read(path: Path, what: str):
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"{what} {path} not found") from None
        except (OSError, ValueError) as exc:
            raise UserError(f"{what} {path} is not readable JSON ({exc})") from None

    run = Path(runs[0])
    res = read(run / "results.json" if run.is_dir() else run, "study results")
    name = args.against
    published = Path(name) if name.endswith(".json") else RESULTS_DIR / f"{name}.json"
    pub = read(published, "published results")
    try:
        print("\n".join(agreement_lines(res, pub, published.stem)))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return 0
