"""Test-time RPC attention for existing timm ViT / DeiT / EVA-style models (weights kept).

    from rpc_attention.integrations.timm import convert, revert
    convert(model, rpc_layers=[0], n_iter=6, lambd=4.0)   # in place; returns the model
    revert(model)                                         # exact original modules and outputs

``convert`` changes ``model.blocks[i].attn`` in place for the chosen blocks, keeping the module
object, its parameters and its state-dict keys:

- symmetric layers (:class:`rpc_attention.nn.SymmetricAttention`, e.g. our SymViT) become
  :class:`rpc_attention.nn.RPCAttention` (same parameters): exactly the paper's PAP layer;
- any other attention whose forward calls ``torch.nn.functional.scaled_dot_product_attention``
  (timm ``Attention``, ``AttentionRope``, EVA's ``EvaAttention``, :class:`rpc_attention.nn.Attention`)
  runs asymmetric RPC attention (:mod:`rpc_attention.integrations._core`): the q, k, v the module
  hands to SDPA (after its q/k norms and rotary embedding) go through PAP on the keys, and the
  module's queries and keys are cleaned with the recovered sparse term (self-attention, so queries
  and keys are the same tokens). The module is forced onto its fused path while converted.

Layers already running PAP (:class:`rpc_attention.nn.RPCAttention`) are rejected.

Whether PAP's sparse step fired is measured on the first forward of each converted asymmetric layer
(:func:`sparse_activity` returns the record). Where S = 0 there, the layer computes exactly the
original attention (``key_mode="sparse"``: K - S = K, Q - S = Q), so :class:`RPCInactiveWarning` says
the conversion changed nothing and how to lower the threshold.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..nn import RPCAttention, SymmetricAttention
from ._core import asymmetric_rpc_attention, check_options

__all__ = ["convert", "revert", "is_converted", "converted_layers", "sparse_activity", "RPCInactiveWarning",
           "SYMMETRIC_MODES"]

_STATE = "_rpc_convert_state"
SYMMETRIC_MODES = ("rpc", "extension")
_SUBCLASSES: Dict[type, type] = {}


class RPCInactiveWarning(UserWarning):
    """A converted layer's first forward had S = 0, so it computed exactly the original attention."""


_INACTIVE = ("RPC attention changed nothing: PAP's sparse step did not fire (S = 0, the threshold tau is above every "
             "|key| entry) in a converted layer on its first input, so with key_mode='sparse' that layer computes "
             "exactly the original attention. Lower the threshold (e.g. lambd=0.5, or threshold='lambda_over_mu'); "
             "rpc_attention.integrations.timm.sparse_activity(model) gives tau and max |k| per layer.")


def _library_dirs() -> Tuple[str, ...]:
    """The folders whose frames lie between a converted layer and the user's call: torch's (``Module.__call__``,
    containers), timm's (the model's forwards) and this one (the converted forward)."""
    # this folder as the frames spell it (a relative sys.path entry gives relative code file names)
    dirs = [os.path.dirname(torch.__file__), os.path.dirname(_library_dirs.__code__.co_filename)]
    timm_file = getattr(sys.modules.get("timm"), "__file__", None)
    if timm_file:
        dirs.append(os.path.dirname(timm_file))
    return tuple(os.path.join(d, "") for d in dirs)  # with the separator: ".../torch/" is not ".../torchvision"


def _warn_at_caller(message: str, category: type) -> None:
    """``warnings.warn`` attributed to the first frame outside :func:`_library_dirs`: the user's ``model(x)``
    (or their own model's forward), however deep the model nests its blocks. The stack level is counted
    here rather than left to ``skip_file_prefixes`` (Python >= 3.12 only), so every supported Python runs
    the same code."""
    dirs = _library_dirs()
    frame: Optional[FrameType] = sys._getframe(0)
    level = 1  # level 1 is this function's own frame, as warnings.warn counts
    while frame is not None and frame.f_code.co_filename.startswith(dirs):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _activity(state, keys: torch.Tensor) -> dict:
    """Share of non-zero S entries, mean threshold and largest |key| of one PAP call."""
    with torch.no_grad():
        return {"frac_nonzero": float((state.sparse != 0).float().mean()), "tau_mean": float(state.tau.float().mean()),
                "abs_k_max": float(keys.detach().abs().max()) if keys.numel() else 0.0}


class _SDPAInterceptor(TorchFunctionMode):
    """Routes every F.scaled_dot_product_attention call made inside a converted forward through RPC;
    with ``record`` it also keeps the S activity of each call."""

    def __init__(self, options: dict, record: bool = False):
        super().__init__()
        self.options = options
        self.calls = 0
        self.record = record
        self.activity: List[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        self.calls += 1
        out = asymmetric_rpc_attention(
            bound["query"], bound["key"], bound["value"], attn_mask=bound.get("attn_mask"),
            is_causal=bool(bound.get("is_causal", False)), dropout_p=float(bound.get("dropout_p", 0.0)),
            scale=bound.get("scale"), same_tokens=True, return_state=self.record, **self.options,
        )
        if not self.record:
            return out
        out, state = out
        self.activity.append(_activity(state, bound["key"]))
        return out


def _rpc_subclass(base: type) -> type:
    """A subclass of ``base`` whose forward runs the original forward under the SDPA interceptor."""
    if base not in _SUBCLASSES:
        def forward(self, *args, **kwargs):
            state = getattr(self, _STATE)
            mode = _SDPAInterceptor(state["pap"], record="activity" not in state)
            had = hasattr(self, "fused_attn")
            old = getattr(self, "fused_attn", None)
            if had:
                self.fused_attn = True
            try:
                with mode:
                    out = base.forward(self, *args, **kwargs)
            finally:
                if had:
                    self.fused_attn = old
            if mode.calls == 0:
                raise RuntimeError(
                    f"{base.__name__}.forward made no scaled_dot_product_attention call, so RPC could not be applied; "
                    "this attention type is not supported by rpc_attention.integrations.timm.convert"
                )
            if mode.record:
                state["activity"] = mode.activity
                if state["pap"]["key_mode"] == "sparse" and all(a["frac_nonzero"] == 0 for a in mode.activity):
                    _warn_at_caller(_INACTIVE, RPCInactiveWarning)
            return out

        def extra_repr(self):
            inner = base.extra_repr(self)
            pap = getattr(self, _STATE)["pap"]
            desc = f"rpc(n_iter={pap['n_iter']}, lambd={pap['lambd']}, threshold={pap['threshold']!r})"
            return f"{inner}, {desc}" if inner else desc

        _SUBCLASSES[base] = type(f"RPCConverted{base.__name__}", (base,), {
            "forward": forward, "extra_repr": extra_repr, "__module__": __name__,
            "__doc__": f"{base.__name__} converted to asymmetric RPC attention (see rpc_attention.integrations.timm).",
        })
    return _SUBCLASSES[base]


def _blocks(model: nn.Module):
    blocks = getattr(model, "blocks", None)
    if blocks is None or not isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        raise ValueError(f"{type(model).__name__} has no `blocks` sequence; convert() supports ViT/DeiT/EVA-style timm models")
    return list(blocks)


def is_converted(module: nn.Module) -> bool:
    return hasattr(module, _STATE)


def converted_layers(model: nn.Module):
    """Indices of the blocks whose attention is currently converted."""
    return [i for i, blk in enumerate(_blocks(model)) if is_converted(getattr(blk, "attn", nn.Identity()))]


def convert(
    model: nn.Module,
    rpc_layers="all",
    # PAP options, typed and documented here; functional.check_pap_options is their one validator
    n_iter: int = 6,
    lambd: float = 4.0,
    threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None,
    model_dim: Optional[int] = None,
    tol: Optional[float] = None,
    lowrank: str = "values",
    shrink: str = "soft",
    dual_step: float = 1.0,
    row_lambd: Optional[float] = None,
    clean_queries: bool = True,
    key_mode: str = "sparse",
    symmetric: str = "rpc",
) -> nn.Module:
    """Swap the attention of ``model.blocks[i]`` (i in ``rpc_layers``: ``"all"``, list, ``"0,2"``)
    for RPC attention in place, keeping weights. Already converted blocks are re-converted with the
    new options. Returns ``model``. Raises ``ValueError`` for bad options or block indices.

    ``symmetric`` chooses what symmetric layers (:class:`~rpc_attention.nn.SymmetricAttention`)
    become: ``"rpc"`` (default) the paper's :class:`~rpc_attention.nn.RPCAttention` (final attention
    on PAP's K2 = K - S - Y/mu), ``"extension"`` the asymmetric extension with Q = K (final attention
    on K - S, which is the layer's own attention when S = 0)."""
    if symmetric not in SYMMETRIC_MODES:
        raise ValueError(f"symmetric must be one of {SYMMETRIC_MODES}, got {symmetric!r}")
    opts = check_options(dict(rpc_layers=rpc_layers, n_iter=n_iter, lambd=lambd, threshold=threshold,
                              mu_mode=mu_mode, model_dim=model_dim, tol=tol, lowrank=lowrank, shrink=shrink,
                              dual_step=dual_step, row_lambd=row_lambd, clean_queries=clean_queries,
                              key_mode=key_mode))
    layers = opts.pop("rpc_layers")
    blocks = _blocks(model)
    idxs = range(len(blocks)) if layers == "all" else layers
    bad = [i for i in idxs if i >= len(blocks)]
    if bad:
        raise ValueError(f"rpc_layers {bad} out of range: the model has {len(blocks)} blocks")
    for i in idxs:
        attn = getattr(blocks[i], "attn", None)
        if not isinstance(attn, nn.Module):
            raise ValueError(f"block {i} has no `attn` module")
        if is_converted(attn):
            _revert_module(attn)
        if type(attn) is RPCAttention:
            raise ValueError(f"block {i} already runs PAP (RPCAttention); nothing to convert")
        _convert_module(attn, opts, symmetric)
    return model


def sparse_activity(model: nn.Module) -> Dict[int, List[dict]]:
    """``{block index: [record per attention call]}`` for the converted asymmetric layers that have
    run a forward since :func:`convert`: ``frac_nonzero`` (share of non-zero S entries on that first
    input), ``tau_mean`` (PAP's threshold) and ``abs_k_max`` (the largest |key| entry). A layer whose
    ``frac_nonzero`` is 0 computed exactly the original attention (``key_mode="sparse"``)."""
    out = {}
    for i, blk in enumerate(_blocks(model)):
        attn = getattr(blk, "attn", None)
        if isinstance(attn, nn.Module) and is_converted(attn) and "activity" in getattr(attn, _STATE):
            out[i] = list(getattr(attn, _STATE)["activity"])
    return out


def _convert_module(attn: nn.Module, opts: dict, symmetric: str) -> None:
    """Swap one attention module's class (and record how to undo it): RPCAttention for a symmetric layer
    in ``"rpc"`` mode, else the module's own class with its SDPA calls routed through RPC attention."""
    state: Dict[str, Any] = {"orig_class": type(attn), "pap": dict(opts), "saved": {}}
    if type(attn) is SymmetricAttention and symmetric == "rpc":
        # Paper's symmetric PAP layer: same parameters, RPCAttention forward.
        # Attributes an RPCAttention has beyond a SymmetricAttention (its PAP options and whatever
        # else RPCAttention.__init__ sets), taken from a parameter-free prototype on "meta".
        pap = {k: opts[k] for k in ("n_iter", "lambd", "threshold", "mu_mode", "model_dim", "tol", "lowrank", "shrink",
                                    "dual_step", "row_lambd")}
        proto = RPCAttention(attn.dim, attn.num_heads, device="meta", **pap)
        extra = {k: v for k, v in proto.__dict__.items()
                 if not k.startswith("_") and (k not in attn.__dict__ or k in pap)}
        for k in extra:
            if k in attn.__dict__:
                state["saved"][k] = attn.__dict__[k]
        attn.__class__ = RPCAttention
        for k, v in extra.items():
            setattr(attn, k, v)
        state["added"] = tuple(extra)
    else:
        attn.__class__ = _rpc_subclass(type(attn))
        state["added"] = ()
    setattr(attn, _STATE, state)


def _revert_module(attn: nn.Module) -> None:
    state = getattr(attn, _STATE)
    attn.__class__ = state["orig_class"]
    for k in state["added"]:
        attn.__dict__.pop(k, None)
    attn.__dict__.update(state["saved"])
    delattr(attn, _STATE)


def revert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert` on every converted block (original classes and attributes). Returns ``model``."""
    for blk in _blocks(model):
        attn = getattr(blk, "attn", None)
        if isinstance(attn, nn.Module) and is_converted(attn):
            _revert_module(attn)
    return model
