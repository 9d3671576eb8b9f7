"""Capture q, k, v of attention layers with forward hooks, for any supported model.

Supported attention modules (found by type or by structure, never by copying their forward):

* ``rpc_attention.nn``: :class:`Attention`, :class:`SymmetricAttention` (q = k), :class:`RPCAttention`
  (q = k = the PAP-cleaned keys the final softmax used, read from ``last_state`` with
  ``keep_state=True``; the raw keys and the sparse part S are kept too), :class:`ScaledAttention`
  (the effective values ``(I - S) V`` or ``(I - alpha softmax(s K K^T)) V`` are kept next to V);
* timm ``Attention`` (ViT/DeiT): q, k, v recomputed in float64 from the module's ``qkv`` Linear (plus
  float64 copies of its ``q_norm``/``k_norm``) on the hooked input;
* Hugging Face self-attention with ``query``/``key``/``value`` (BERT-style) or ``q_proj``/``k_proj``/
  ``v_proj`` (ViT in transformers 5) Linear layers, recomputed on the hooked ``hidden_states``.

Each captured call becomes a :class:`LayerCapture` with float64 CPU tensors ``(B, H, N, d)``, the
softmax scale and the mask semantics (bool ``mask`` broadcastable to ``(B, H, N, N)``, True = may
attend, and ``causal``). :meth:`LayerCapture.attention_output` recomputes the head outputs from the
captured tensors and :meth:`LayerCapture.module_output` maps them to what the module returns; tests
use them to check that the capture agrees with the module's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import functional as RF
from .. import nn as rnn

__all__ = ["LayerCapture", "attention_kind", "find_attention_modules", "AttentionCapture"]


@dataclass
class LayerCapture:
    name: str
    kind: str  # asymmetric | symmetric | rpc | scaled_s | scaled_alpha | timm | hf
    q: Tensor
    k: Tensor
    v: Tensor
    scale: float
    symmetric: bool = False
    causal: bool = False
    mask: Optional[Tensor] = None  # bool, broadcastable to (B, H, N, N)
    v_eff: Optional[Tensor] = None  # re-parameterised values (Scaled Attention)
    v_eff_label: str = "V"
    k_raw: Optional[Tensor] = None  # RPC: keys before PAP
    pap: Optional[Dict[str, Tensor]] = None  # RPC: sparse, mu, tau (float64 CPU)
    output: Optional[Tensor] = None  # what the module returned (first element for tuples)
    _project: Optional[Callable[[Tensor], Tensor]] = field(default=None, repr=False)

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def tokens(self) -> int:
        return self.q.shape[2]

    def example_mask(self, b: int) -> Optional[Tensor]:
        """Bool mask of example ``b`` broadcastable to (H, N, N), or None."""
        if self.mask is None:
            return None
        m = self.mask
        return m[b if m.shape[0] > 1 else 0]

    def key_valid(self, b: int) -> Optional[Tensor]:
        """(N,) bool: keys some query of some head may attend to (False = padding); None = all."""
        m = self.example_mask(b)
        if m is None:
            return None
        valid = m.any(dim=-2).reshape(-1, m.shape[-1]).any(dim=0)
        if bool(valid.all()):
            return None
        return valid

    def values(self) -> Tensor:
        """The values the attention averages: V, or the re-parameterised ones for Scaled Attention."""
        return self.v if self.v_eff is None else self.v_eff

    def attention_output(self) -> Tensor:
        """``softmax(s q k^T + mask) values`` in float64, ``(B, H, N, dv)``."""
        scores = torch.matmul(self.q, self.k.transpose(-2, -1)) * self.scale
        n = scores.shape[-1]
        mask = self.mask
        if self.causal:
            c = torch.ones(n, n, dtype=torch.bool).tril()
            mask = c if mask is None else (mask & c)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        return torch.matmul(w, self.values())

    def module_output(self) -> Tensor:
        """The module's output recomputed from the capture (for verification)."""
        h = self.attention_output()
        b, hh, n, d = h.shape
        merged = h.transpose(1, 2).reshape(b, n, hh * d)
        return self._project(merged) if self._project is not None else merged


def _to64(t: Tensor) -> Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def _bool_mask(mask: Optional[Tensor], b: int, n: int) -> Optional[Tensor]:
    """The layer's mask as bool (True = attend), (B?, H?, N, N) on the CPU, or None when it masks nothing.

    :func:`rpc_attention.functional.as_bool_mask` reads it, so an additive attention bias is refused
    (the capture then reports the layer) instead of being taken for "attend everywhere".
    """
    if mask is None:
        return None
    m = RF.as_bool_mask(mask.detach(), ndim=4).cpu()
    m = m.expand(m.shape[0], m.shape[1], n, n) if m.shape[-2] == 1 else m
    if bool(m.all()):
        return None
    return m


def _linear64(layer: nn.Linear, x: Tensor) -> Tensor:
    w = layer.weight.detach().double().cpu()
    bias = None if layer.bias is None else layer.bias.detach().double().cpu()
    return torch.nn.functional.linear(_to64(x), w, bias)


def _heads(t: Tensor, h: int) -> Tensor:
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


def _get(args: tuple, kwargs: dict, pos: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    if len(args) > pos:
        return args[pos]
    return default


# ---------------------------------------------------------------------------- adapters

def attention_kind(module: nn.Module) -> Optional[str]:
    """The adapter name for a module, or None if it is not a supported attention module."""
    if isinstance(module, rnn.RPCAttention):
        return "rpc"
    if isinstance(module, rnn.ScaledAttention):
        return "scaled_s" if module.mode == "s" else "scaled_alpha"
    if isinstance(module, rnn.SymmetricAttention):
        return "symmetric"
    if isinstance(module, rnn.Attention):
        return "asymmetric"
    if type(module).__module__.startswith("timm.") and isinstance(getattr(module, "qkv", None), nn.Linear) \
            and hasattr(module, "num_heads") and hasattr(module, "head_dim"):
        if getattr(module, "gate", None) is not None:
            return None
        heads_dim = module.num_heads * module.head_dim
        if module.qkv.out_features == 3 * heads_dim:
            return "timm"
        return None
    if type(module).__module__.startswith("transformers."):
        if getattr(module, "is_cross_attention", False):
            return None
        names = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))
        for trio in names:
            if all(isinstance(getattr(module, a, None), nn.Linear) for a in trio):
                if _hf_heads(module) is not None:
                    return "hf"
    return None


def _hf_heads(module: nn.Module) -> Optional[Tuple[int, int]]:
    h = getattr(module, "num_attention_heads", None) or getattr(module, "num_heads", None)
    d = getattr(module, "attention_head_size", None) or getattr(module, "head_dim", None)
    if h is None or d is None:
        return None
    return int(h), int(d)


def find_attention_modules(model: nn.Module) -> List[Tuple[str, nn.Module, str]]:
    """``(qualified name, module, kind)`` for every supported attention module, in forward order."""
    found = []
    for name, mod in model.named_modules():
        kind = attention_kind(mod)
        if kind is not None:
            found.append((name, mod, kind))
    return found


def _capture_rpc_nn(name: str, kind: str, mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> LayerCapture:
    x = _get(args, kwargs, 0, "x")
    attn_mask = _get(args, kwargs, 1, "attn_mask")
    is_causal = bool(_get(args, kwargs, 2, "is_causal", False))
    b, n, c = x.shape
    parts = _linear64(mod.qkv, x).reshape(b, n, mod.n_proj, mod.num_heads, mod.head_dim).permute(2, 0, 3, 1, 4)
    mask = _bool_mask(attn_mask, b, n)
    proj = _projector(mod.proj)
    common = dict(name=name, kind=kind, scale=float(mod.scale), causal=is_causal, mask=mask,
                  output=_to64(output), _project=proj)
    if kind == "asymmetric":
        q, k, v = parts.unbind(0)
        return LayerCapture(q=q, k=k, v=v, **common)
    if kind in ("scaled_s", "scaled_alpha"):
        q, k, v = parts.unbind(0)
        if kind == "scaled_s":
            s_mat = _to64(mod.s_matrix)
            v_eff, label = v - torch.matmul(s_mat, v), "(I-S)V"
        else:
            kk = RF.symmetric_attention(k, v, attn_mask=None if mask is None else mask, is_causal=is_causal,
                                        scale=float(mod.scale), fused=False)
            v_eff, label = v - float(mod.alpha.detach()) * kk, "(I-alpha softmax(sKK^T))V"
        return LayerCapture(q=q, k=k, v=v, v_eff=v_eff, v_eff_label=label, **common)
    k, v = parts.unbind(0)
    if kind == "symmetric":
        return LayerCapture(q=k, k=k, v=v, symmetric=True, **common)
    # rpc: the final attention used the cleaned keys K2
    state = mod.last_state
    if state is None:
        raise RuntimeError(f"{name}: RPCAttention did not record its PAP state (keep_state was off)")
    k2 = _to64(state.cleaned_keys)
    pap = {"sparse": _to64(state.sparse), "mu": _to64(state.mu), "tau": _to64(state.tau),
           "n_iter_run": state.n_iter_run}
    return LayerCapture(q=k2, k=k2, v=v, symmetric=True, k_raw=k, pap=pap, **common)


def _projector(layer: nn.Module, pre: Optional[nn.Module] = None) -> Callable[[Tensor], Tensor]:
    def project(merged: Tensor) -> Tensor:
        with torch.no_grad():
            dtype = next(layer.parameters()).dtype
            dev = next(layer.parameters()).device
            y = merged.to(device=dev, dtype=dtype)
            if pre is not None:
                y = pre(y)
            return _to64(layer(y))
    return project


def _module64(module: nn.Module, x64: Tensor) -> Tensor:
    """``module(x64)`` in float64 on the CPU: an identity passes through; any other module (timm's
    ``q_norm``/``k_norm``: LayerNorm, RmsNorm) runs as a float64 copy, so nothing is rounded to float32."""
    if isinstance(module, nn.Identity):
        return x64
    import copy

    return copy.deepcopy(module).to(device="cpu", dtype=torch.float64)(x64)


def _capture_timm(name: str, mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> LayerCapture:
    """q, k, v recomputed in float64 from the hooked input and the layer's weights (``qkv``, then
    ``q_norm``/``k_norm``), not the module's float32 projection cast afterwards."""
    x = _get(args, kwargs, 0, "x")
    attn_mask = _get(args, kwargs, 1, "attn_mask")
    is_causal = bool(_get(args, kwargs, 2, "is_causal", False))
    b, n, _ = x.shape
    qkv = _linear64(mod.qkv, x).reshape(b, n, 3, mod.num_heads, mod.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = _module64(mod.q_norm, q), _module64(mod.k_norm, k)
    return LayerCapture(
        name=name, kind="timm", q=q, k=k, v=v, scale=float(mod.scale), causal=is_causal,
        mask=_bool_mask(attn_mask, b, n), output=_to64(output),
        _project=_projector(mod.proj, getattr(mod, "norm", None)),
    )


def _capture_hf(name: str, mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> LayerCapture:
    impl = getattr(getattr(mod, "config", None), "_attn_implementation", None)
    if impl == "rpc":
        raise ValueError("attn_implementation='rpc' (rpc_attention.integrations.transformers) does not expose "
                         "its PAP state; this layer is not analysed (its softmax is not softmax(s q k^T))")
    x = _get(args, kwargs, 0, "hidden_states")
    attn_mask = _get(args, kwargs, 1, "attention_mask")
    h, d = _hf_heads(mod)
    if isinstance(getattr(mod, "query", None), nn.Linear):
        lq, lk, lv = mod.query, mod.key, mod.value
    else:
        lq, lk, lv = mod.q_proj, mod.k_proj, mod.v_proj
    q, k, v = (_heads(_linear64(l, x), h) for l in (lq, lk, lv))
    scale = getattr(mod, "scaling", None)
    scale = float(scale) if scale is not None else d ** -0.5
    out = output[0] if isinstance(output, (tuple, list)) else output
    b, n, _ = x.shape
    mask = _bool_mask(attn_mask, b, n)
    causal = bool(getattr(mod, "is_causal", False)) and attn_mask is None
    proj = None
    if isinstance(getattr(mod, "o_proj", None), nn.Linear):
        proj = _projector(mod.o_proj)
    return LayerCapture(name=name, kind="hf", q=q, k=k, v=v, scale=scale, causal=causal, mask=mask,
                        output=_to64(out), _project=proj)


class AttentionCapture:
    """Context manager: hooks every supported attention module of ``model`` and records each call.

    ``captures`` lists :class:`LayerCapture` in call order (one per module call). RPC modules get
    ``keep_state=True`` for the duration (restored afterwards). Modules can be restricted with
    ``names``. Hooks never change the module's output.
    """

    def __init__(self, model: nn.Module, names: Optional[List[str]] = None) -> None:
        self.model = model
        mods = find_attention_modules(model)
        if names is not None:
            mods = [m for m in mods if m[0] in set(names)]
        self.modules = mods
        self.captures: List[LayerCapture] = []
        self.errors: List[Dict[str, str]] = []
        self._handles: list = []
        self._saved_state: Dict[str, bool] = {}

    def __enter__(self) -> AttentionCapture:
        for name, mod, kind in self.modules:
            if kind == "rpc":
                self._saved_state[name] = mod.keep_state
                mod.keep_state = True
            self._handles.append(mod.register_forward_hook(self._make_hook(name, kind), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles.clear()
        for name, mod, _kind in self.modules:
            if name in self._saved_state:
                mod.keep_state = self._saved_state[name]
                mod.last_state = None
        self._saved_state.clear()

    def clear(self) -> None:
        self.captures.clear()
        self.errors.clear()

    def _make_hook(self, name: str, kind: str):
        def hook(mod, args, kwargs, output):
            try:
                with torch.no_grad():
                    if kind == "timm":
                        cap = _capture_timm(name, mod, args, kwargs, output)
                    elif kind == "hf":
                        cap = _capture_hf(name, mod, args, kwargs, output)
                    else:
                        out = output[0] if isinstance(output, (tuple, list)) else output
                        cap = _capture_rpc_nn(name, kind, mod, args, kwargs, out)
                self.captures.append(cap)
            except Exception as exc:  # reported, never silently dropped
                self.errors.append({"layer": name, "stage": "capture", "error": f"{type(exc).__name__}: {exc}"})
            return None

        return hook
