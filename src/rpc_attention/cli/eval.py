"""``rpc-attention eval``: run evaluation suites on a trained run and write ``DIR/eval/<suite>.json/.md``."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List

from . import UserError

HELP = "evaluate a trained run: clean, attacks (fgsm, pgd, autoattack, ...), corruptions, ood"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", metavar="DIR", help="run directory (config.yaml + model.safetensors)")
    parser.add_argument("--suite", default="clean", metavar="NAME[,NAME...]",
                        help="suites to run, comma separated (default: clean; 'list' prints them)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="suite option: 'pgd.eps=1:6/255', 'space=official' (every selected suite that "
                             "has it), 'batch_size=64', 'seed=1', 'device=cuda'; repeatable")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate the first N examples only")
    parser.add_argument("--ema", action="store_true", help="use the EMA weights (model_ema.safetensors)")
    parser.add_argument("--out", metavar="DIR", default=None, help="output directory (default: RUN/eval)")


def _parse_sets(items: List[str]) -> Dict[str, str]:
    sets: Dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        sets[key.strip()] = value.strip()
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


def run_with_loader(args: argparse.Namespace, load) -> int:
    """``rpc-attention eval`` with the model from ``load(device) -> (model, cfg, run_dir, source)``."""
    from ..evaluate import suites as S
    from ..evaluate.runner import evaluate_model, select_suites

    names = [n.strip() for n in str(args.suite).split(",") if n.strip()]
    if names == ["list"]:
        return _print_suites()
    if not names:
        raise UserError("--suite is empty")
    sets = _parse_sets(args.sets)
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
                       on_result=lambda record, path: print(S.render_markdown(record)))
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    return 0


def run(args: argparse.Namespace) -> int:
    if str(args.suite).strip() == "list":
        return _print_suites()
    return run_with_loader(args, run_model_loader(args))
