"""``rpc-attention train``: train a preset (single process or under torchrun), or resume a run."""

from __future__ import annotations

import argparse

HELP = "Train a model from a preset (--preset NAME --out DIR [--set k=v ...]) or continue one (--resume DIR)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", help="preset name (see `rpc-attention presets`) or a YAML file")
    parser.add_argument("--out", help="run directory to create")
    parser.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest good checkpoint")
    parser.add_argument("--force", action="store_true", help="delete an existing run in --out and start over")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set train.epochs=3 --set model.kwargs.n_iter=4 "
                             "(repeatable; values are YAML)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args: argparse.Namespace) -> int:
    import sys

    from . import UserError

    if args.resume and args.preset:
        raise UserError("give either --preset (a new run) or --resume DIR, not both")
    if not args.resume and not args.preset:
        raise UserError("give --preset NAME --out DIR, or --resume DIR")
    if args.preset and not args.out and not args.print_config:
        raise UserError("--out DIR is required with --preset")
    if args.resume and args.out and args.out != args.resume:
        raise UserError("--resume DIR continues DIR in place; do not also give a different --out")

    from .. import kpca  # noqa: F401  (registers the jproj epoch-end callback)
    from ..train.checkpoint import CheckpointError
    from ..train.config import dump_config, resolve_config
    from ..train.trainer import RunExistsError, TrainingDiverged, run_training

    try:
        if args.print_config:
            if args.resume:
                from pathlib import Path
                from ..train.config import load_config_file
                cfg = resolve_config(base=load_config_file(Path(args.resume) / "config.yaml"), overrides=args.overrides)
            else:
                cfg = resolve_config(args.preset, args.overrides)
            print(dump_config(cfg), end="")
            return 0
        if args.resume:
            out = run_training(None, args.resume, resume=True, overrides=args.overrides)
        else:
            cfg = resolve_config(args.preset, args.overrides)
            out = run_training(cfg, args.out, force=args.force)
    except (RunExistsError, FileNotFoundError, CheckpointError) as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    except TrainingDiverged as exc:
        print(f"rpc-attention train: training diverged: {exc}", file=sys.stderr)
        return 1
    print(f"run saved in {out}")
    return 0
