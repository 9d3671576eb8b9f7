"""Asymmetric RPC attention: PAP on the keys of a pretrained (query/key/value) attention layer.

Pretrained transformers have separate queries and keys, while PAP is defined for
symmetric attention. The extension used by every integration in this package:

1. PAP runs on the layer's own keys exactly as in :func:`rpc_attention.functional.pap_attention` (symmetric
   ``softmax(s K2 K2^T) v`` inside the loop, masks in every iteration, causal ``mu`` for causal
   layers) through :func:`rpc_attention.functional.pap_decompose` (``pap_attention`` without its
   final attention); its final sparse term ``S`` is kept.
2. Keys are cleaned as ``K_clean = K - S`` (``key_mode="sparse"``, default) or taken as PAP's final
   ``K2 = K - S - Y/mu`` (``key_mode="pap"``, the keys the symmetric RPC layer attends with).
3. Queries are cleaned with the same ``S`` (``Q_clean = Q - S``) only where queries and keys are the
   same tokens: self-attention. With a KV cache (fewer queries than keys, causal), query ``i`` is
   the token at key position ``p0 + i`` and is cleaned with row ``p0 + i`` of ``S``; since S's rows
   up to position t depend only on keys up to t (causal mask and causal ``mu`` in every pass), these
   are the rows the uncached pass uses. Never for cross-attention.
4. The output is the model's own attention ``softmax(s Q_clean K_clean^T + mask) V``.

With ``key_mode="sparse"`` and ``lambd -> inf`` (S = 0) this is exactly the layer's original
attention. ``key_mode="pap"`` does not reduce to it (for ``n_iter >= 2`` its K2 equals the previous
iteration's attention output when S = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from .. import functional as RF
from ..nn import parse_layers

KEY_MODES = ("sparse", "pap")

# Paper default "6iter/layer1": PAP with 6 softmax evaluations in block 0, lambda 4.
DEFAULT_OPTIONS: Dict[str, Any] = {
    "rpc_layers": (0,),
    "n_iter": 6,
    "lambd": 4.0,
    "threshold": "lambda_mu",
    "mu_mode": None,
    "model_dim": None,
    "tol": None,
    "lowrank": "values",
    "shrink": "soft",
    "dual_step": 1.0,
    "row_lambd": None,
    "clean_queries": True,
    "key_mode": "sparse",
}


def resolve_layers(rpc_layers):
    """Normalise ``rpc_layers`` (:func:`rpc_attention.nn.parse_layers`; the depth is not known yet).
    Returns ``"all"`` or a tuple of non-negative ints."""
    layers = parse_layers(rpc_layers)
    return layers if layers == "all" else tuple(layers)


def layer_selected(layers, idx: Optional[int]) -> bool:
    if layers == "all":
        return True
    return idx is not None and int(idx) in layers


def check_options(opts: dict) -> dict:
    """Validate a full option dict (keys of DEFAULT_OPTIONS); returns a normalised copy."""
    unknown = set(opts) - set(DEFAULT_OPTIONS)
    if unknown:
        raise ValueError(f"unknown RPC option(s) {sorted(unknown)}; known: {sorted(DEFAULT_OPTIONS)}")
    out: Dict[str, Any] = dict(DEFAULT_OPTIONS)
    out.update(opts)
    out["rpc_layers"] = resolve_layers(out["rpc_layers"])
    RF.check_pap_options(n_iter=out["n_iter"], lambd=out["lambd"], threshold=out["threshold"],
                         mu_mode=out["mu_mode"], tol=out["tol"], model_dim=out["model_dim"], lowrank=out["lowrank"],
                         shrink=out["shrink"], dual_step=out["dual_step"], row_lambd=out["row_lambd"])
    out["lambd"] = float(out["lambd"])
    out["row_lambd"] = None if out["row_lambd"] is None else float(out["row_lambd"])
    out["dual_step"] = float(out["dual_step"])
    if out["key_mode"] not in KEY_MODES:
        raise ValueError(f"key_mode must be one of {KEY_MODES}, got {out['key_mode']!r}")
    if not isinstance(out["clean_queries"], bool):
        raise ValueError(f"clean_queries must be True or False, got {out['clean_queries']!r}")
    return out


def _key_key_mask(mask: Optional[Tensor], nk: int, same_tokens: bool) -> Optional[Tensor]:
    """The (B?, H?, Nk, Nk) mask PAP runs under, derived from the (B?, H?, Nq, Nk) attention mask.

    Same tokens (self-attention, Nq == Nk): the mask itself. Otherwise the keys some query may see
    (padding, unfilled static-cache slots and, for a causal layer, keys after the last query are
    excluded); PAP adds the causal triangle itself (``is_causal``). For a causal self-attention
    layer with a cache this is the uncached pass's mask (causal and padding) restricted to the keys.
    """
    if mask is None:
        return None
    if same_tokens:
        return mask
    valid = mask.any(dim=-2)  # (B?, H?, Nk)
    return valid.unsqueeze(-2).expand(*valid.shape[:-1], nk, nk)


def _query_rows(mask: Optional[Tensor], nq: int, nk: int) -> Tensor:
    """Key positions of the queries in causal self-attention with a cache: ``p0 .. p0 + nq - 1``.

    A dynamic cache appends the queries at the end (``p0 = nk - nq``); a static cache puts them
    before its unfilled slots. Read from the mask: the last key a (non-padding) query may see is
    itself, and a padding query sees less, so ``p0 = max_i(last_visible_key_i - i)``. End-aligned
    when the mask says nothing (None, or no per-query rows). Tensor ops only (no host sync).
    """
    if mask is None or mask.shape[-2] != nq or nq == nk:
        return torch.arange(nk - nq, nk, device=None if mask is None else mask.device)
    keys = torch.arange(nk, device=mask.device)
    last = torch.where(mask, keys, -1).amax(dim=-1)  # (B?, H?, nq); -1: the query sees nothing
    rows = torch.arange(nq, device=mask.device)
    start = torch.where(last >= 0, last - rows, -1).max()
    start = torch.where(start < 0, nk - nq, start.clamp(max=nk - nq))
    return start + rows


def _repeat_heads(x: Tensor, rep: int) -> Tensor:
    if rep == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, rep, n, d).reshape(b, h * rep, n, d)


def _shared_heads(q: Tensor, k: Tensor, v: Tensor, key_mode: str, lowrank: str = "values") -> Tuple[Tensor, Tensor]:
    """``k`` and ``v`` with their heads repeated to the query heads (grouped-query attention), after the
    shape checks of :func:`asymmetric_rpc_attention`."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D (batch, heads, tokens, head_dim)")
    if key_mode not in KEY_MODES:
        raise ValueError(f"key_mode must be one of {KEY_MODES}, got {key_mode!r}")
    h, hkv = q.shape[1], k.shape[1]
    if h % hkv != 0:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({hkv})")
    if v.shape[-1] != k.shape[-1] and lowrank == "values":
        raise ValueError(f"RPC attention needs d_v == d_k (PAP's L step lives in value space), got {v.shape[-1]} vs {k.shape[-1]}")
    return _repeat_heads(k, h // hkv), _repeat_heads(v, h // hkv)


def _clean_keys(k: Tensor, sparse: Tensor, keys2: Tensor, key_mode: str) -> Tensor:
    """The keys the output attention uses: ``K - S`` (``"sparse"``) or PAP's final K2 (``"pap"``)."""
    return k - sparse.to(k.dtype) if key_mode == "sparse" else keys2.to(k.dtype)


def asymmetric_rpc_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    same_tokens: bool = True,
    # PAP options, typed and documented here; functional.check_pap_options is their one validator
    n_iter: int = 6, lambd: float = 4.0, threshold: str = "lambda_mu", mu_mode: Optional[str] = None,
    model_dim: Optional[int] = None, tol: Optional[float] = None,
    lowrank: str = "values", shrink: str = "soft", dual_step: float = 1.0, row_lambd: Optional[float] = None,
    clean_queries: bool = True,
    key_mode: str = "sparse",
    fused: bool = True,
    return_state: bool = False,
):
    """RPC attention for an asymmetric layer (see the module docstring for the definition).

    Args:
        q: queries ``(B, H, Nq, d)``; k, v: keys/values ``(B, Hkv, Nk, d)`` with ``H % Hkv == 0``
            (grouped-query attention: k/v heads are repeated as in the model's own attention).
        attn_mask: bool (True = attend) or additive 0/-inf mask broadcastable to ``(B, H, Nq, Nk)``.
        is_causal: causal layer: causal mask in every PAP iteration, causal ``mu`` by default.
        same_tokens: False for cross-attention (queries never cleaned, PAP on the encoder keys).
        clean_queries: clean queries with S where allowed (``same_tokens``, and ``Nq == Nk`` or a causal
            layer with a cache, where the rows of S at the queries' positions are used).
        key_mode: ``"sparse"`` (K - S, reduces exactly to plain attention as lambd -> inf) or
            ``"pap"`` (PAP's final K2).
        n_iter, lambd, threshold, mu_mode, model_dim, tol, lowrank, shrink, dual_step, row_lambd: as
            :func:`rpc_attention.functional.pap_attention`; ``model_dim`` defaults to ``H * d`` (query heads
            times head width).
    Returns ``(B, H, Nq, d_v)`` and, with ``return_state``, the :class:`~rpc_attention.functional.PAPState`.
    """
    k, v = _shared_heads(q, k, v, key_mode, lowrank)
    (_, h, nq, d), nk = q.shape, k.shape[2]
    mask = RF.as_bool_mask(attn_mask, ndim=4)  # bool, or additive 0/-inf; attention biases are refused
    same = bool(same_tokens) and nq == nk
    state = RF.pap_decompose(
        k, v, n_iter=n_iter, lambd=lambd, attn_mask=_key_key_mask(mask, nk, same), is_causal=is_causal,
        scale=scale, model_dim=h * d if model_dim is None else model_dim, threshold=threshold, mu_mode=mu_mode,
        tol=tol, fused=fused, lowrank=lowrank, shrink=shrink, dual_step=dual_step, row_lambd=row_lambd,
    )
    sparse = state.sparse.to(k.dtype)
    k_clean = _clean_keys(k, sparse, state.cleaned_keys, key_mode)
    q_clean = q
    if clean_queries and same:
        q_clean = q - sparse
    elif clean_queries and same_tokens and is_causal:  # decoding with a cache
        q_clean = q - sparse.index_select(-2, _query_rows(mask, nq, nk).to(sparse.device))
    # causal with nq != nk: the kernel's triangle is end-aligned (query i sees keys up to
    # nk - nq + i); a static cache's mask is stricter and wins in the intersection
    out = RF.attention(q_clean, k_clean, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p,
                       scale=scale, fused=fused)
    return (out, state) if return_state else out


@dataclass
class AsymmetricRPCCache:
    """What a causal self-attention layer keeps between decoding steps: the PAP cache of its
    (head-repeated) keys (:class:`~rpc_attention.functional.PAPCache`, ``n_iter - 1`` cleaned-key
    tensors, as no attention reads the final pass's K2) and the keys the output attention uses
    (``K - S`` or K2, one more (B, H, T, d) tensor). The values stay in the model's own cache."""

    pap: RF.PAPCache
    clean_keys: Tensor

    @property
    def length(self) -> int:
        return self.pap.length

    def nbytes(self) -> int:
        return self.pap.nbytes() + self.clean_keys.numel() * self.clean_keys.element_size()

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place (beam search)."""
        self.clean_keys = self.clean_keys[..., :self.length, :].index_select(0, index.to(self.clean_keys.device))
        self.pap.reorder(index)


def _query_start(mask: Optional[Tensor], nq: int, nk: int) -> int:
    """Key position of the first query (:func:`_query_rows`), as a Python int."""
    return int(_query_rows(mask, nq, nk)[0])


def cached_asymmetric_rpc_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: Optional[AsymmetricRPCCache], *, attn_mask: Optional[Tensor] = None,
    scale: Optional[float] = None, n_iter: int = 6, lambd: float = 4.0, threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None, model_dim: Optional[int] = None, clean_queries: bool = True,
    key_mode: str = "sparse", fused: bool = True, lowrank: str = "values", shrink: str = "soft", dual_step: float = 1.0,
    row_lambd: Optional[float] = None,
) -> Tuple[Tensor, AsymmetricRPCCache]:
    """Causal self-attention RPC (:func:`asymmetric_rpc_attention` with ``is_causal``) over a cache.

    ``k``, ``v`` hold every position of the model's cache (dynamic: the cached ones and the new
    ones; static: also unfilled slots, which the mask excludes); ``q`` the new positions, the
    first at key position ``p0`` (read from the mask as in :func:`_query_rows`). With ``cache``
    None, or one that does not hold exactly the ``p0`` earlier positions, PAP runs over all
    ``p0 + Nq`` positions and a new cache is made; otherwise only the new rows are computed.
    Returns the output ``(B, H, Nq, d)`` and the cache. Equal to the uncached forward's rows.
    """
    b, h, nq, d = q.shape
    rep = h // k.shape[1]
    mask = RF.as_bool_mask(attn_mask, ndim=4)
    p0 = _query_start(mask, nq, k.shape[2])
    end = p0 + nq
    k, v = _repeat_heads(k[:, :, :end], rep), _repeat_heads(v[:, :, :end], rep)
    mask = None if mask is None else mask[..., :end]
    if lowrank != "values":
        raise ValueError(f"lowrank={lowrank!r} runs the low-rank step over the whole sequence; a causal layer "
                         "(and its decoding cache) takes lowrank='values'")
    if row_lambd is not None:
        raise ValueError("row_lambd compares every token with all the others; a causal layer (and its decoding "
                         "cache) takes row_lambd=None")
    opts: Dict[str, Any] = dict(n_iter=n_iter, lambd=lambd, scale=scale,
                                model_dim=h * d if model_dim is None else model_dim, threshold=threshold,
                                mu_mode=mu_mode, fused=fused, shrink=shrink, dual_step=dual_step)
    if cache is None or cache.length != p0:
        _, state, pap = RF.pap_prefill(k, v, attn_mask=_key_key_mask(mask, end, nq == end), final_attention=False,
                                       **opts)
        sparse = state.sparse[..., p0:, :].to(k.dtype)
        cache = AsymmetricRPCCache(pap, _clean_keys(k, state.sparse, state.cleaned_keys, key_mode))
    else:
        valid = None if mask is None else mask.any(dim=-2)[:, 0, p0:]
        _, sparse, keys2 = cache.pap.step(k[:, :, p0:], v, key_valid=valid, fused=fused, final_attention=False)
        sparse = sparse.to(k.dtype)
        new_keys = _clean_keys(k[:, :, p0:], sparse, keys2, key_mode)
        cache.clean_keys = RF.append_rows(cache.clean_keys, p0, new_keys)
    q_clean = q - sparse if clean_queries else q
    out = RF.attention(q_clean, cache.clean_keys[..., :end, :], v, attn_mask=mask, is_causal=True, scale=scale,
                       fused=fused)
    return out, cache
