"""``rpc-attention eval``: run evaluation suites on a trained run and write ``DIR/eval/<suite>.json/.md``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, Optional

from . import UserError

HELP = "evaluate a trained run: clean, attacks (fgsm, pgd, autoattack, ...), corruptions, ood"


def add_model_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """``--run``, ``--ema`` and ``--device``: which model, on which device (``eval-external`` adds to this group)."""
    g = parser.add_argument_group("model")
    g.add_argument("--run", metavar="DIR", help="training run directory (config.yaml + model.safetensors)")
    g.add_argument("--ema", action="store_true", help="use the run's EMA weights (model_ema.safetensors)")
    g.add_argument("--device", default="cpu", help="torch device to evaluate on: cpu (default), cuda, cuda:1, ...")
    return g


def add_suite_arguments(parser: argparse.ArgumentParser) -> None:
    """``--suite``, ``--set``, ``--limit`` and ``--out``."""
    g = parser.add_argument_group("evaluation")
    g.add_argument("--suite", default="clean", metavar="NAME[,NAME...]",
                   help="suites to run, comma separated (default: clean; 'list' prints them)")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="suite option, repeatable; KEY is SUITE.OPTION ('pgd.eps=1:6/255', 'pgd.steps=10') or "
                        "OPTION for every selected suite that has it ('space=official', 'batch_size=64', "
                        "'seed=1'); values are YAML, eps also fractions like 2.5/255")
    g.add_argument("--limit", type=int, default=None, metavar="N",
                   help="number of examples: evaluate the first N only (default: all)")
    g.add_argument("--out", metavar="DIR", default=None, help="output directory (default: RUN/eval)")
    g.add_argument("--force", action="store_true",
                   help="replace results in the output directory computed with other settings or another model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_suite_arguments(parser)


def parse_suite_sets(args: argparse.Namespace) -> Dict[str, Any]:
    """``--set`` items and ``--device`` as the suites' option dict; UserError when malformed."""
    from ..evaluate.suites import parse_sets

    try:
        sets = parse_sets(args.sets)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if "device" in sets:
        raise UserError(f"--set device={sets['device']}: give the device with --device {sets['device']}")
    sets["device"] = args.device
    return sets


def run_model_loader(args: argparse.Namespace):
    """The loader of ``--run DIR`` (``--ema``): ``load(device) -> (model, cfg, run_dir, source)``."""
    from ..train import run_loader

    def load(device: str):
        if not args.run:
            raise UserError("give --run DIR (a training run directory)")
        return run_loader(args.run, ema=bool(getattr(args, "ema", False)))(device)

    return load


def _print_suites() -> int:
    from ..evaluate import suites as S

    for n in S.list_suites():
        print(f"{n:14s} {S.get_suite(n).description}")
    return 0


def run_with_loader(args: argparse.Namespace, load, sets: Optional[Dict[str, Any]] = None) -> int:
    """``rpc-attention eval`` with the model from ``load(device) -> (model, cfg, run_dir, source)``;
    ``sets``: the suite options (default: :func:`parse_suite_sets` of ``args``)."""
    from ..evaluate import suites as S
    from ..evaluate.runner import evaluate_model, select_suites

    names = [n.strip() for n in str(args.suite).split(",") if n.strip()]
    if names == ["list"]:
        return _print_suites()
    if not names:
        raise UserError("--suite is empty")
    sets = parse_suite_sets(args) if sets is None else sets
    try:
        select_suites(names, sets, args.limit)  # option errors before any model is loaded
    except ValueError as exc:
        raise UserError(str(exc)) from None

    def load_or_explain(device: str):
        try:
            return load(device)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        evaluate_model(names, load_or_explain, sets, args.limit, args.out, log=log,
                       on_result=lambda record, path: print(S.render_markdown(record)), replace=args.force)
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    return 0


def run(args: argparse.Namespace) -> int:
    if str(args.suite).strip() == "list":
        return _print_suites()
    return run_with_loader(args, run_model_loader(args))
