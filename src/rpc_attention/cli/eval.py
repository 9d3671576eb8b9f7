"""``rpc-attention eval``: run evaluation suites on a trained run and write ``DIR/eval/<suite>.json/.md``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

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


def load_model(args: argparse.Namespace, device: str = "cpu") -> Tuple[Any, Mapping[str, Any], Optional[str], Dict[str, Any]]:
    """The ONE place that turns command-line arguments into ``(model, cfg, run_dir, source)``.

    ``model`` is a plain classifier ``nn.Module`` (eval mode) on normalised inputs and ``cfg`` a
    config with at least ``data.mean``/``data.std`` (and ``data.name``).  Other model sources
    (``--timm NAME --checkpoint FILE``, ``--hf``) plug in here.
    """
    if not args.run:
        raise UserError("give --run DIR (a training run directory)")
    run_dir = args.run
    if not os.path.isdir(run_dir):
        raise UserError(f"run directory {run_dir!r} does not exist")
    try:
        from ..train import load_run
    except ImportError as exc:  # pragma: no cover - trainer missing from the install
        raise UserError(f"cannot import the run loader: {exc}") from None
    try:
        model, cfg = load_run(run_dir, device=device, ema=bool(getattr(args, "ema", False)))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise UserError(str(exc).splitlines()[0] if str(exc) else repr(exc)) from None
    return model, cfg, run_dir, {"kind": "run", "run_dir": os.path.abspath(run_dir), "ema": bool(args.ema)}


def _default_out(args: argparse.Namespace, run_dir: Optional[str]) -> str:
    if args.out:
        return args.out
    if run_dir:
        return os.path.join(run_dir, "eval")
    raise UserError("give --out DIR")


def run(args: argparse.Namespace) -> int:
    from ..evaluate import suites as S

    names = [n.strip() for n in str(args.suite).split(",") if n.strip()]
    if names == ["list"]:
        for n in S.list_suites():
            print(f"{n:14s} {S.get_suite(n).description}")
        return 0
    if not names:
        raise UserError("--suite is empty")
    try:
        suites = [S.get_suite(n) for n in dict.fromkeys(names)]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    sets = _parse_sets(args.sets)
    if args.limit is not None and args.limit <= 0:
        raise UserError(f"--limit must be positive, got {args.limit}")
    try:
        S.check_set_keys(suites, sets)
        opts = {s.name: S.resolve_options(s, sets, args.limit) for s in suites}
    except ValueError as exc:
        raise UserError(str(exc)) from None
    device = next(iter(opts.values()))["device"]

    model, cfg, run_dir, source = load_model(args, device=device)
    task = str(cfg.get("task") or "classification")
    for s in suites:
        if task not in s.tasks:
            raise UserError(f"suite {s.name!r} does not apply to task {task!r} (it handles: {', '.join(s.tasks)})")
        if s.check is not None:
            try:
                s.check(cfg, opts[s.name])
            except (ValueError, FileNotFoundError) as exc:
                raise UserError(f"{s.name}: {exc}") from None
    out_dir = _default_out(args, run_dir)

    for s in suites:
        print(f"[eval] {s.name} ...", file=sys.stderr, flush=True)
        try:
            record = S.run_suite(s, model, cfg, run_dir, opts[s.name], source=source)
        except (ValueError, FileNotFoundError) as exc:
            raise UserError(f"{s.name}: {exc}") from None
        jpath, _ = S.write_result(record, out_dir)  # written only once the suite has succeeded
        print(S.render_markdown(record))
        print(f"[eval] {s.name}: {record['wall_time_s']:.1f} s -> {jpath}", file=sys.stderr, flush=True)
    return 0
