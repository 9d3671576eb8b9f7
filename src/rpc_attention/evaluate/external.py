"""Test-time RPC for evaluation: load external models and switch layers to RPC attention.

Used by ``rpc-attention eval`` (``--rpc-layers``, ``--timm NAME --checkpoint FILE``, ``--hf PATH``):

- :func:`add_arguments` adds those options to an argparse parser;
- :func:`load_external` builds a timm or Hugging Face classifier (plus the data config the suites need);
- :func:`apply_test_time_rpc` converts an already built model (a training run's model, a timm
  model, a Hugging Face model) in place, without retraining, and returns a record of what it did.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from ..functional import LOWRANKS, MU_MODES, SHRINKS, THRESHOLDS
from ..integrations import DEFAULT_OPTIONS, check_options

__all__ = ["PAP_FLAGS", "add_arguments", "rpc_options_from_args", "apply_test_time_rpc", "load_external", "HFClassifier"]


def _optional(kind):
    """An argparse type that reads ``none`` as None (an option whose default is None)."""
    def parse(text: str):
        return None if str(text).lower() in ("none", "null") else kind(text)
    parse.__name__ = kind.__name__
    return parse


# Every PAP option of the kernel (functional.check_pap_options) as a --rpc-NAME flag: (type or choices, help).
# tests/integrations check this table against check_pap_options' signature, so a new kernel option
# cannot be missing from the command line.
PAP_FLAGS: Dict[str, Tuple[Any, str]] = {
    "n_iter": (int, "PAP softmax evaluations per RPC layer"),
    "lambd": (float, "PAP sparsity weight lambda (with threshold=target_fraction: the fraction of key entries)"),
    "threshold": (THRESHOLDS, "shrink threshold: lambda*mu (official), lambda/mu (classic PCP), candes "
                              "(lambda/(sqrt(max(N, d)) mu)), target_fraction (lambda = fraction of key entries) "
                              "or mad (lambda x 1.4826 x the keys' median absolute deviation)"),
    "mu_mode": (MU_MODES, "mu over width C (global/causal) or head width d (head_dim variants); default "
                          "global, causal for causal layers"),
    "model_dim": (_optional(int), "the width C in mu's formula (default: the layer's heads x head width)"),
    "tol": (_optional(float), "stop PAP early when the relative change of S falls below this (default: never)"),
    "lowrank": (LOWRANKS, "the low-rank step on the values (official) or in key space"),
    "shrink": (SHRINKS, "soft or hard shrinkage of the sparse step"),
    "dual_step": (float, "the step of the dual update Y (1: official, 0: no dual)"),
    "row_lambd": (_optional(float), "the token rule: a token whose key row is a robust outlier by this many robust "
                                    "std goes into S whole (default: off; not in causal layers)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model-source and test-time RPC options (a separate argument group)."""
    g = parser.add_argument_group("external models and test-time RPC (rpc_attention.integrations)")
    g.add_argument("--timm", metavar="NAME", default=None,
                   help="evaluate a timm model NAME (with --checkpoint FILE and --data-config) instead of --run")
    g.add_argument("--checkpoint", metavar="FILE", default=None, help="weights for --timm (.safetensors or .pth)")
    g.add_argument("--model-kwargs", metavar="JSON", default=None,
                   help="alias of --set model.kwargs.NAME=VALUE: keyword arguments for timm.create_model as "
                        "one JSON object, e.g. '{\"img_size\": 28, \"in_chans\": 1}'")
    g.add_argument("--hf", metavar="PATH_OR_CONFIG", default=None,
                   help="evaluate a Hugging Face image classifier: a saved model directory or a config.json "
                        "(random weights)")
    g.add_argument("--data-config", metavar="RUN_DIR_OR_YAML", default=None,
                   help="run directory or YAML whose 'data' section describes the evaluation data (with --timm/--hf)")
    g.add_argument("--rpc-layers", metavar="all|I,J", default=None,
                   help="test-time RPC: run PAP in these blocks of the loaded model (no retraining)")
    for name, (kind, helptext) in PAP_FLAGS.items():
        flag = "--rpc-" + name.replace("_", "-")
        default = DEFAULT_OPTIONS[name]
        text = helptext if "default" in helptext else f"{helptext} (default {default})"
        if isinstance(kind, tuple):
            g.add_argument(flag, dest=f"rpc_{name}", default=default, choices=kind, help=text)
        else:
            g.add_argument(flag, dest=f"rpc_{name}", default=default, type=kind, metavar=name.upper(), help=text)
    g.add_argument("--rpc-no-clean-queries", action="store_true",
                   help="asymmetric layers: clean only the keys, never the queries")
    g.add_argument("--rpc-key-mode", default=DEFAULT_OPTIONS["key_mode"], choices=("sparse", "pap"),
                   help="asymmetric layers: keys K - S (default) or PAP's final K2")
    g.add_argument("--rpc-symmetric", default="rpc", choices=("rpc", "extension"),
                   help="symmetric layers become the paper's RPCAttention (rpc, default) or run the "
                        "asymmetric extension with Q = K (extension: attention on K - S)")


def rpc_options_from_args(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The RPC options given on the command line, or None without ``--rpc-layers``. ValueError if bad."""
    if getattr(args, "rpc_layers", None) is None:
        return None
    return check_options(dict(
        rpc_layers=args.rpc_layers, clean_queries=not args.rpc_no_clean_queries, key_mode=args.rpc_key_mode,
        **{name: getattr(args, f"rpc_{name}") for name in PAP_FLAGS},
    ))


class HFClassifier(nn.Module):
    """Wraps a Hugging Face image classifier so that ``forward(x) -> logits`` (what the suites call)."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hf(pixel_values=x).logits


def _is_hf(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    return cfg is not None and hasattr(cfg, "_attn_implementation") and hasattr(model, "set_attn_implementation")


def apply_test_time_rpc(model: nn.Module, options: Mapping[str, Any], symmetric: str = "rpc") -> Dict[str, Any]:
    """Switch ``model`` to RPC attention in place per ``options`` (keys of ``DEFAULT_OPTIONS``).

    Hugging Face models (or :class:`HFClassifier`) get ``attn_implementation="rpc"`` via
    :func:`rpc_attention.integrations.transformers.configure`; models with ``blocks[i].attn``
    (timm ViT/DeiT/EVA, our SymViT and Symlm) go through :func:`rpc_attention.integrations.timm.convert`.
    Returns a JSON-able description. Raises ValueError for models it cannot convert.
    """
    opts = check_options(dict(options))
    layers = opts["rpc_layers"]
    record = {k: (list(v) if isinstance(v, tuple) else v) for k, v in opts.items()}
    target = model.hf if isinstance(model, HFClassifier) else model
    if _is_hf(target):
        from ..integrations import transformers as rpc_hf

        rpc_hf.configure(target, **opts)
        record["via"] = "transformers attn_implementation='rpc'"
        return record
    if hasattr(target, "blocks"):
        from ..integrations import timm as rpc_timm

        rpc_timm.convert(target, symmetric=symmetric, **opts)
        record["via"] = "rpc_attention.integrations.timm.convert"
        record["symmetric"] = symmetric
        record["converted_blocks"] = rpc_timm.converted_layers(target)
        if layers != "all" and not record["converted_blocks"]:
            raise ValueError("no block was converted")
        return record
    raise ValueError(f"test-time RPC does not know how to convert a {type(target).__name__} "
                     "(needs a Hugging Face model or a `blocks[i].attn` layout)")


def _read_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """The weights of ``path`` (the EMA ones of a training checkpoint that has them), read by the
    library's one checkpoint reader: a missing file is a FileNotFoundError, an unreadable one a
    one-line ValueError naming it."""
    from ..models.vision import read_checkpoint

    return read_checkpoint(path, prefer_ema=True)


def _data_cfg(path: Optional[str]) -> Dict[str, Any]:
    if not path:
        raise ValueError("--timm/--hf need --data-config RUN_DIR_OR_YAML (its 'data' section names the evaluation data)")
    from ..files import read_yaml_mapping

    cfg_path = os.path.join(path, "config.yaml") if os.path.isdir(path) else path
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"data config {cfg_path!r} does not exist")
    cfg = read_yaml_mapping(cfg_path)
    if not isinstance(cfg.get("data"), dict):
        raise ValueError(f"{cfg_path} has no 'data' section")
    return cfg


def load_external(
    *,
    timm_name: Optional[str] = None,
    checkpoint: Optional[str] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    hf: Optional[str] = None,
    data_config: Optional[str] = None,
    device: str = "cpu",
) -> Tuple[nn.Module, Dict[str, Any], Dict[str, Any]]:
    """Build a classifier from timm (``timm_name`` + ``checkpoint``) or Hugging Face (``hf``).

    Returns ``(model, cfg, source)``: the model in eval mode taking normalised images, the config
    whose ``data`` section comes from ``data_config`` (and whose ``task`` is ``classification``),
    and a JSON-able description. Raises ValueError / FileNotFoundError with one-line messages.
    """
    if bool(timm_name) == bool(hf):
        raise ValueError("give exactly one of --timm NAME or --hf PATH_OR_CONFIG")
    cfg = _data_cfg(data_config)
    cfg = dict(cfg, task="classification")
    if timm_name:
        from ..models.factory import create_model  # (importing models registers ours in timm)

        if not checkpoint:
            raise ValueError("--timm needs --checkpoint FILE (no hub downloads)")
        kwargs = dict(model_kwargs or {})
        try:
            model = create_model(timm_name, pretrained=False, **kwargs)
        except RuntimeError as exc:
            raise ValueError(f"timm cannot build {timm_name!r}: {exc}") from None
        sd = _read_state_dict(checkpoint)
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"{checkpoint} does not fit {timm_name}: {str(exc).splitlines()[0]}") from None
        source = {"kind": "timm", "name": timm_name, "checkpoint": os.path.abspath(checkpoint), "kwargs": kwargs}
    else:
        import transformers

        if os.path.isdir(hf):
            model = transformers.AutoModelForImageClassification.from_pretrained(hf, local_files_only=True)
            what = "pretrained"
        elif os.path.isfile(hf):
            config = transformers.AutoConfig.from_pretrained(hf, local_files_only=True)
            model = transformers.AutoModelForImageClassification.from_config(config)
            what = "config (random weights)"
        else:
            raise FileNotFoundError(f"--hf {hf!r} is neither a model directory nor a config file")
        model = HFClassifier(model)
        source = {"kind": "hf", "path": os.path.abspath(hf), "weights": what}
    return model.to(device).eval(), cfg, source


def parse_model_kwargs(text: Optional[str]) -> Dict[str, Any]:
    if not text:
        return {}
    try:
        out = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--model-kwargs is not valid JSON: {exc}") from None
    if not isinstance(out, dict):
        raise ValueError("--model-kwargs must be a JSON object")
    return out
