"""``rpc-attention train``: train a preset (single process or under torchrun), or resume a run."""

from __future__ import annotations

import argparse

HELP = "Train a model from a preset (--preset NAME --run DIR [--set k=v ...]) or continue one (--run DIR --resume)"
EXTRA = "train"  # the extra this command needs: pip install "rpc-attention[train]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("run")
    g.add_argument("--preset", help="trainer preset name (see `rpc-attention presets`) or a YAML file")
    g.add_argument("--run", metavar="DIR", help="the run directory: created with --preset, continued with --resume")
    g.add_argument("--out", metavar="DIR",
                   help="alias of --run; under torchrun write --out DIR (torchrun's own parser rejects --run as "
                        "an abbreviation of its --run-path) and --resume DIR")
    g.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                   help="continue the run (--run DIR) from its newest good checkpoint; `--resume DIR` also works")
    g.add_argument("--force", action="store_true", help="delete an existing run in --run and start over")
    c = parser.add_argument_group("config")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.epochs=3 --set model.kwargs.n_iter=4 "
                        "(repeatable; dotted keys, YAML values)")
    c.add_argument("--device", default=None,
                   help="torch device: auto, cpu, cuda, cuda:1, ... (default: the config's train.device, auto)")
    c.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _run_dirs(args: argparse.Namespace):
    """``(new run dir or None, run dir to resume or None)`` from --run/--out/--resume; UserError if they clash."""
    from . import UserError

    if args.run and args.out and args.run != args.out:
        raise UserError("--out is an alias of --run: give one run directory")
    run_dir = args.run or args.out
    if args.resume is None:
        return run_dir, None
    resume = run_dir if args.resume is True else args.resume
    if not resume:
        raise UserError("--resume continues a run: give its directory with --run DIR")
    if run_dir and run_dir != resume:
        raise UserError("--resume continues DIR in place; do not also give a different --run/--out")
    return None, resume


def resume_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C: the command that continues the run from its last checkpoint."""
    run_dir = args.resume if isinstance(args.resume, str) else (args.run or args.out)
    if not run_dir:
        return ""
    return f"continue from the last checkpoint with: rpc-attention train --resume {run_dir}"


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from . import UserError

    new_dir, resume = _run_dirs(args)
    if resume and args.preset:
        raise UserError("give either --preset (a new run) or --resume (continue --run DIR), not both")
    if not resume and not args.preset:
        raise UserError("give --preset NAME --run DIR, or --run DIR --resume")
    if args.preset and not new_dir and not args.print_config:
        raise UserError("--run DIR is required with --preset")
    overrides = list(args.overrides) + ([f"train.device={args.device}"] if args.device else [])

    from ..kpca import register_callbacks
    from ..train.checkpoint import CheckpointError
    from ..train.config import dump_config, resolve_config
    from ..train.rundir import RunExistsError
    from ..train.trainer import TrainingDiverged, run_training

    register_callbacks()
    try:
        if args.print_config:
            if resume:
                from pathlib import Path

                from ..train.config import load_config_file
                cfg = resolve_config(base=load_config_file(Path(resume) / "config.yaml"), overrides=overrides)
            else:
                cfg = resolve_config(args.preset, overrides)
            print(dump_config(cfg), end="")
            return 0
        if resume:
            out = run_training(None, resume, resume=True, overrides=overrides)
        else:
            cfg = resolve_config(args.preset, overrides)
            out = run_training(cfg, new_dir, force=args.force)
    except (RunExistsError, FileNotFoundError, CheckpointError) as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    except TrainingDiverged as exc:
        print(f"rpc-attention train: training diverged: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") == "0":  # under torchrun only global rank 0 speaks
        print(f"run saved in {out}")
    return 0
