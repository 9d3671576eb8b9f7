"""``rpc-attention reproduce``: run a whole study (train, evaluate, analyse, report) as a resumable pipeline."""

from __future__ import annotations

import argparse

HELP = "run a reproduction study as a resumable pipeline of stages and write its report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick",
                        help="study: smoke, quick (default; `make demo`), fmnist-full, imagenet, wikitext103")
    parser.add_argument("--out", default=None, metavar="DIR", help="study directory (default: runs/<preset>)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="study setting, repeatable: seeds=0,1,2, eval_limit=500, data.imagenet=PATH, ... "
                             "(--list shows each study's settings)")
    parser.add_argument("--stages", action="append", default=None, metavar="NAMES",
                        help="run only these stages: names, globs or kinds, comma separated "
                             "('train.*', 'eval.*.pgd', 'report'); a stage's unfinished dependencies must be selected too")
    parser.add_argument("--dry-run", action="store_true", help="print the plan with estimated times and exit")
    parser.add_argument("--force", action="store_true", help="rerun the selected stages even if finished")
    parser.add_argument("--stop-on-error", action="store_true",
                        help="stop at the first failed stage (default: run the stages that do not depend on it)")
    parser.add_argument("--device", default=None, help="device for training and evaluation (default: the study's; cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads for every stage, training included (default: the presets' own, "
                             "then torch's default); not part of any stage's parameters")
    parser.add_argument("--list", action="store_true", help="list the study presets and their settings")


def run(args: argparse.Namespace) -> int:
    import os
    import time

    from . import UserError

    from ..reproduce import StageSelectionError, StudyError, run_study
    from ..reproduce.studies import list_studies
    from ..report.render import format_seconds

    if args.list:
        for name, desc, defaults in list_studies():
            print(f"{name}: {desc}")
            print("  settings: " + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        return 0
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError("--threads must be >= 1")
        import torch

        torch.set_num_threads(args.threads)
    out = args.out or os.path.join("runs", args.preset)
    t0 = time.time()
    try:
        summary = run_study(args.preset, out, settings=args.sets, selection=args.stages, force=args.force,
                            dry_run=args.dry_run, keep_going=not args.stop_on_error, device=args.device,
                            threads=args.threads)
    except (StudyError, StageSelectionError) as exc:
        raise UserError(str(exc)) from None
    if args.dry_run:
        print(summary["plan"])
        if summary.get("device") not in (None, "cpu"):
            print(f"(this study runs on {summary['device']}: the estimates are CPU constants and only rank the stages)")
        return 0
    took = format_seconds(time.time() - t0)
    counts = ", ".join(f"{len(v)} {k}" for k, v in summary.items() if v)
    print(f"study {args.preset} in {out}: {counts} ({took})")
    if os.path.exists(os.path.join(out, "report.md")):
        print(f"report: {os.path.join(out, 'report.md')} and report.html")
    if summary["failed"] or summary["blocked"]:
        print("failed: " + ", ".join(summary["failed"] + summary["blocked"]) +
              f"  (see {out}/stages/*.failed.json; rerun the same command to retry)")
        return 1
    return 0
