"""``rpc-attention eval``: run evaluation suites on a trained run and write ``DIR/eval/<suite>.json/.md``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, Optional

from . import UserError

HELP = "evaluate a trained run: clean, attacks (fgsm, pgd, autoattack, ...), corruptions, ood"
EXTRA = "eval"  # the extra this command needs: pip install "rpc-attention[eval]"


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
    g = add_model_arguments(parser)
    g.add_argument("--model-set", dest="model_sets", action="append", default=[], metavar="KEY=VALUE",
                   help="model keyword set on top of the run's model.kwargs, repeatable, for options without weights "
                        "(e.g. key_control=clip, key_control_level=4: a key control in block 0 of a trained SymViT); "
                        "needs --out (results of the changed model are kept apart from RUN/eval)")
    add_suite_arguments(parser)


def model_keywords(args: argparse.Namespace) -> Dict[str, Any]:
    """``--model-set`` items as ``{keyword: value}``; UserError when malformed, dotted or without ``--out``."""
    from ..overrides import parse_assignments

    items = list(getattr(args, "model_sets", None) or [])
    if not items:
        return {}
    try:
        pairs = parse_assignments(items, flag="--model-set")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    dotted = [k for k, _ in pairs if "." in k]
    if dotted:
        raise UserError(f"--model-set {dotted[0]}=...: give a model keyword (e.g. key_control=clip), not a dotted key")
    if not getattr(args, "out", None):
        raise UserError("--model-set changes the model: give --out DIR for its results (RUN/eval holds the run's own)")
    return dict(pairs)


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

    keywords = model_keywords(args)

    def load(device: str):
        if not args.run:
            raise UserError("give --run DIR (a training run directory)")
        return run_loader(args.run, ema=bool(getattr(args, "ema", False)), model_kwargs=keywords)(device)

    return load


def _register_suites() -> None:
    """Add the suites of the floors above the registry (the analysis toolkit's ``kpca``)."""
    from ..kpca import register_suites

    register_suites()


def _print_suites() -> int:
    from ..evaluate import suites as S

    _register_suites()
    for n in S.list_suites():
        print(f"{n:14s} {S.get_suite(n).description}")
    return 0


LONG_SUITE_S = 60.0  # suites expected to take longer are announced with their estimate


def _forward_factor(model, cfg, device: str) -> float:
    """How much slower one forward pass of ``model`` is here than the estimates' calibration (a tiny
    Fashion-MNIST ViT on 2 CPU cores, at batch 128): the faster of two timed passes over 128 test
    images, after a warm-up pass."""
    import time

    import torch

    from ..evaluate.inputs import load_eval_data
    from ..reproduce.estimates import FWD_S_PER_1K

    x, _ = load_eval_data(cfg, "test", 128)
    x = x.to(device)
    seconds = []
    with torch.no_grad():
        model(x)
        for _ in range(2):
            t0 = time.perf_counter()
            model(x)
            seconds.append(time.perf_counter() - t0)
    return max(min(seconds) / len(x) * 1000.0 / FWD_S_PER_1K, 0.1)


def announce_cost(suites, opts: Dict[str, Dict[str, Any]], model, cfg, log) -> None:
    """Before a classification evaluation starts, one line per suite expected to run over a minute:
    its estimated time (the study estimates scaled by a timed forward pass) and how to shorten it."""
    if str(cfg.get("task") or "classification") != "classification":
        return
    from ..evaluate.inputs import eval_indices
    from ..report.render import format_seconds
    from ..reproduce.estimates import eval_estimate

    factor = None
    for s in suites:
        o = opts[s.name]
        n = len(eval_indices(cfg, "test", o.get("limit")))
        if factor is None:
            factor = _forward_factor(model, cfg, str(o.get("device") or "cpu"))
        eps = o.get("eps")
        copies = len(o.get("names") or []) * s.study.copies if s.study.names else 1
        est = eval_estimate(s.cost, n, factor, copies=copies, n_eps=len(eps) if isinstance(eps, list) else None,
                            steps=o.get("steps") if s.cost.per_eps is not None else None)
        if est > LONG_SUITE_S:
            log(f"[eval] {s.name}: about {format_seconds(est)} for {n} examples (estimated; "
                f"--limit N evaluates the first N only)")


def run_with_loader(args: argparse.Namespace, load, sets: Optional[Dict[str, Any]] = None) -> int:
    """``rpc-attention eval`` with the model from ``load(device) -> (model, cfg, run_dir, source)``;
    ``sets``: the suite options (default: :func:`parse_suite_sets` of ``args``)."""
    from ..evaluate import suites as S
    from ..evaluate.runner import evaluate_model, select_suites
    _register_suites()
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

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def load_or_explain(device: str):
        try:
            return load(device)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None

    def estimate(suites, opts, model, cfg) -> None:
        try:
            announce_cost(suites, opts, model, cfg, log)
        except (FileNotFoundError, ValueError, KeyError, RuntimeError):
            pass  # an estimate is a courtesy: data the estimate cannot read is the suite's to report

    try:
        evaluate_model(names, load_or_explain, sets, args.limit, args.out, log=log,
                       on_result=lambda record, path: print(S.render_markdown(record)), replace=args.force,
                       before_run=estimate)
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    return 0


def resume_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C: finished suites are on disk; rerun the others."""
    return ("each suite that finished is already written (its .json and .md); run the command again with "
            "--suite naming the others")


def run(args: argparse.Namespace) -> int:
    if str(args.suite).strip() == "list":
        return _print_suites()
    return run_with_loader(args, run_model_loader(args))
