"""``rpc-attention eval-external``: ``rpc-attention eval`` on external models and/or with test-time RPC.

Everything ``rpc-attention eval`` accepts (``--run``, ``--device``, ``--suite``, ``--set``, ``--limit``,
``--out``) plus ``--rpc-layers`` (switch the loaded model's attention to RPC without retraining),
``--timm NAME --checkpoint FILE`` and ``--hf PATH_OR_CONFIG`` (with ``--data-config``). Keyword
arguments of ``timm.create_model`` are settings too: ``--set model.kwargs.img_size=28`` (the older
``--model-kwargs JSON`` is an alias). Every PAP option of the kernel is a flag ``--rpc-NAME``
(:data:`rpc_attention.evaluate.external.PAP_FLAGS`). The suites,
options and result files are those of ``rpc-attention eval``; results with test-time RPC go to
``RUN/eval-rpc-<layers>-<n_iter>it-l<lambd>/`` by default so the run's own ``RUN/eval`` is untouched.
"""

from __future__ import annotations

import argparse
import os

from . import UserError
from . import eval as base

HELP = "eval with test-time RPC (--rpc-layers) and/or an external model (--timm NAME --checkpoint FILE, --hf PATH)"
EXTRA = "eval"  # the extra this command needs: pip install "rpc-attention[eval]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..evaluate.external import add_arguments as add_external

    base.add_arguments(parser)
    add_external(parser)


def _tag(opts, symmetric: str = "rpc") -> str:
    from ..evaluate import external as ext

    layers = opts["rpc_layers"]
    lay = "all" if layers == "all" else ("none" if not layers else "-".join(str(i) for i in layers))
    tag = f"eval-rpc-{lay}-{opts['n_iter']}it-l{opts['lambd']:g}"
    if opts["threshold"] == "lambda_over_mu":
        tag += "-over-mu"
    elif opts["threshold"] != "lambda_mu":
        tag += f"-{opts['threshold']}"
    for name in ("mu_mode", "model_dim", "tol", "lowrank", "shrink", "dual_step", "row_lambd"):  # each non-default option
        value = opts[name]
        if value != ext.DEFAULT_OPTIONS[name]:
            tag += f"-{name.replace('_', '')}{value:g}" if isinstance(value, float) else f"-{name.replace('_', '')}{value}"
    if not opts["clean_queries"]:
        tag += "-keysonly"
    if opts["key_mode"] != "sparse":
        tag += f"-{opts['key_mode']}"
    if symmetric != "rpc":
        tag += f"-sym-{symmetric}"
    return tag


def run(args: argparse.Namespace) -> int:
    from ..evaluate import external as ext

    try:
        rpc = ext.rpc_options_from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    sets = base.parse_suite_sets(args)
    model_kwargs = _model_kwargs(args, sets)
    external = bool(args.timm or args.hf)
    if external and args.run:
        raise UserError("give either --run DIR or --timm/--hf, not both")
    if not external and rpc is None and args.suite != "list":
        raise UserError("nothing external to do: give --rpc-layers and/or --timm/--hf (plain runs: rpc-attention eval)")
    if args.out is None:
        if external:
            raise UserError("--timm/--hf need --out DIR")
        if args.run and rpc is not None:
            args.out = os.path.join(args.run, _tag(rpc, args.rpc_symmetric))

    base_load = base.run_model_loader(args)

    def load(device: str):
        if external:
            try:
                model, cfg, source = ext.load_external(timm_name=args.timm, checkpoint=args.checkpoint,
                                                       model_kwargs=model_kwargs, hf=args.hf,
                                                       data_config=args.data_config, device=device)
            except (ValueError, FileNotFoundError, OSError) as exc:
                raise UserError(str(exc).splitlines()[0]) from None
            run_dir = None
        else:
            model, cfg, run_dir, source = base_load(device)
        if rpc is not None:
            try:
                source = dict(source, test_time_rpc=ext.apply_test_time_rpc(model, rpc, args.rpc_symmetric))
            except ValueError as exc:
                raise UserError(str(exc)) from None
        return model, cfg, run_dir, source

    return base.run_with_loader(args, load, sets)


def _model_kwargs(args: argparse.Namespace, sets: dict) -> dict:
    """The ``model.kwargs.*`` settings (taken out of ``sets``) merged with the ``--model-kwargs`` JSON alias."""
    from ..evaluate import external as ext

    try:
        kwargs = ext.parse_model_kwargs(args.model_kwargs)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for key in [k for k in sets if k.startswith("model.")]:
        name = key[len("model.kwargs."):] if key.startswith("model.kwargs.") else ""
        if not name or "." in name:
            raise UserError(f"--set {key}: the model takes settings as model.kwargs.NAME=VALUE")
        if name in kwargs:
            raise UserError(f"model keyword {name!r} given twice (--set {key} and --model-kwargs)")
        kwargs[name] = sets.pop(key)
    if kwargs and not args.timm:
        raise UserError("model.kwargs settings apply to --timm models only")
    return kwargs
