"""Softmax attention kernels and the one attention-mask normaliser of the library.

Tensors are shaped ``(batch, heads, tokens, head_dim)``, floating point, of one dtype and on one
device (under ``torch.autocast`` the dtypes may differ); every public kernel checks that first with
:func:`check_tensors`, so a wrong input is one message naming it rather than an error inside SDPA.
Masks are bool (True = may attend) or additive float (0 = attend, ``-inf`` or the dtype minimum =
masked), broadcastable to ``(B, H, Nq, Nk)``, on the tensors' device; every caller in the library turns a mask into bool with :func:`as_bool_mask`.
Causal masks are end-aligned: query ``i`` of ``Nq`` sees keys ``0 .. Nk - Nq + i`` (a decoding
step over a cache), in the fused and the explicit path alike.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["as_bool_mask", "normalise_mask", "causal_mask", "check_qkv", "check_kv", "check_tensors", "resolve_scale",
           "check_dropout", "attend", "attention", "symmetric_attention", "scaled_attention_s", "scaled_attention_alpha"]


def as_bool_mask(attn_mask: Optional[Tensor], ndim: int = 0) -> Optional[Tensor]:
    """A bool mask (True = may attend) from a bool or an additive 0 / -inf float mask, same shape, with
    leading singleton dimensions added up to ``ndim`` dimensions (``ndim=4``: ``(B?, H?, Nq, Nk)``).

    Additive masks with other values (attention biases such as ALiBi) are rejected: PAP and the
    cleaned-key attention need to know which keys take part, not how much each one is favoured.
    """
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dim() < ndim:
        attn_mask = attn_mask.reshape((1,) * (ndim - attn_mask.dim()) + tuple(attn_mask.shape))
    if attn_mask.dtype == torch.bool:
        return attn_mask
    if not attn_mask.is_floating_point():
        raise ValueError(f"attn_mask must be bool (True = attend) or float (additive), got {attn_mask.dtype}")
    blocked = (attn_mask == float("-inf")) | (attn_mask <= torch.finfo(attn_mask.dtype).min / 2)
    if not (blocked | (attn_mask == 0)).all():
        raise ValueError(
            "a float attn_mask must be additive with 0 (attend) and -inf or the dtype minimum (masked), "
            "not an attention bias; pass a bool mask (True = attend) instead"
        )
    return ~blocked


def normalise_mask(attn_mask: Optional[Tensor], b: int, h: int, nq: int, nk: int) -> Optional[Tensor]:
    """:func:`as_bool_mask`, checked to broadcast to ``(b, h, nq, nk)`` and made 4-D."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    target = (b, h, nq, nk)
    if attn_mask.dim() > 4 or attn_mask.dim() < 2:
        raise ValueError(f"attn_mask must be 2-D to 4-D and broadcast to {target}, got shape {tuple(attn_mask.shape)}")
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    for got, want in zip(shape, target):
        if got not in (1, want):
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to {target}")
    return as_bool_mask(attn_mask, ndim=4)


def causal_mask(mask: Optional[Tensor], nq: int, nk: int, device) -> Tensor:
    """``mask`` (bool or None) and the end-aligned causal triangle."""
    causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=nk - nq)
    return causal if mask is None else (mask & causal)


def check_qkv(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D (batch, heads, tokens, head_dim), got shape {tuple(t.shape)}")


def check_kv(k: Tensor, v: Tensor, *, need_same_dim: bool) -> None:
    check_qkv("k", k)
    check_qkv("v", v)
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree in (batch, heads, tokens): k {tuple(k.shape)} vs v {tuple(v.shape)}"
        )
    if need_same_dim and k.shape[-1] != v.shape[-1]:
        raise ValueError(
            f"PAP needs d_v == d_k (its L step lives in value space): k has head_dim {k.shape[-1]}, "
            f"v has {v.shape[-1]}"
        )


def check_tensors(where: str, named: Sequence[Tuple[str, Tensor]],
                  same_device: Sequence[Tuple[str, Optional[Tensor]]] = ()) -> None:
    """Refuse inputs a kernel could only fail on deep inside: every tensor of ``named`` must be floating
    point, all on one device and of one dtype; those of ``same_device`` (masks, ``s_matrix``) need only the
    device. ``where`` (the public function's name) starts the message, which names the argument, its
    dtype and device, and what is accepted.

    Only attribute reads: no kernel, no device sync, and torch.compile reads dtypes and devices as
    constants of the graph, so it traces through without a break. Under ``torch.autocast`` on the
    tensors' device the dtypes may differ (autocast casts them to one, as it does for a model whose
    q/k norm runs in float32 beside bfloat16 values); the other rules still hold.
    """
    names = [name for name, _ in named]
    listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
    accepted = f"{listed} must be floating-point tensors (float16, bfloat16, float32 or float64) of one dtype on one device"
    first_name, first = named[0]
    for name, t in named:
        if not t.is_floating_point():
            raise TypeError(f"{where}: {name} is {t.dtype} on {t.device}; {accepted}")
    mixed_ok = torch.is_autocast_enabled(first.device.type)
    for name, t in named[1:]:
        if t.device != first.device:
            raise ValueError(f"{where}: {name} is on {t.device} but {first_name} is on {first.device}; {accepted}")
        if t.dtype != first.dtype and not mixed_ok:
            raise TypeError(f"{where}: {name} is {t.dtype} but {first_name} is {first.dtype}; {accepted}")
    for name, other in same_device:
        if isinstance(other, Tensor) and other.device != first.device:
            raise ValueError(f"{where}: {name} is on {other.device} but {first_name} is on {first.device}; "
                             f"it must be on the device of {listed}")


def resolve_scale(scale: Optional[float], d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale


def check_dropout(dropout_p: float) -> float:
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return dropout_p


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool, dropout_p: float,
           scale: float, fused: bool) -> Tensor:
    """``softmax(scale q k^T + mask) v`` for checked inputs, fused (SDPA) or explicit. ``mask``: bool or None."""
    if fused:
        # SDPA's own is_causal aligns the triangle top-left; ours is end-aligned, so build the
        # mask ourselves whenever the two would differ.
        if is_causal and (mask is not None or q.shape[-2] != k.shape[-2]):
            mask = causal_mask(mask, q.shape[-2], k.shape[-2], q.device)
            is_causal = False
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    full = causal_mask(mask, q.shape[-2], k.shape[-2], q.device) if is_causal else mask
    if full is not None:
        scores = scores.masked_fill(~full, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if full is not None:
        # rows with no admissible key give 0 instead of NaN
        weights = torch.nan_to_num(weights, nan=0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return torch.matmul(weights, v)


# The public kernels below share their keyword options (mask, causal, dropout, scale, fused); each
# signature lists them, typed and documented where users read it.
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    fused: bool = True,
) -> Tensor:
    """Plain (asymmetric) softmax attention ``softmax(s Q K^T) V``.

    ``attn_mask`` is bool (True = may attend) or additive float (0 / -inf), broadcastable to
    ``(B, H, Nq, Nk)``. ``fused=False`` materialises the attention matrix.
    """
    check_qkv("q", q)
    check_kv(k, v, need_same_dim=False)
    check_tensors("attention", (("q", q), ("k", k), ("v", v)), (("attn_mask", attn_mask),))
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads and head_dim")
    mask = normalise_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return attend(q, k, v, mask, is_causal, check_dropout(dropout_p), resolve_scale(scale, q.shape[-1]), fused)


def symmetric_attention(
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    fused: bool = True,
) -> Tensor:
    """Symmetric attention ``softmax(s K K^T) V``: the keys serve as queries (no W_Q)."""
    check_kv(k, v, need_same_dim=False)
    check_tensors("symmetric_attention", (("k", k), ("v", v)), (("attn_mask", attn_mask),))
    mask = normalise_mask(attn_mask, k.shape[0], k.shape[1], k.shape[2], k.shape[2])
    return attend(k, k, v, mask, is_causal, check_dropout(dropout_p), resolve_scale(scale, k.shape[-1]), fused)


def _check_s_matrix(s_matrix: Tensor, h: int, n: int) -> None:
    if not isinstance(s_matrix, Tensor):
        raise TypeError("s_matrix must be a tensor")
    ok = s_matrix.dim() in (2, 3) and tuple(s_matrix.shape[-2:]) == (n, n)
    if ok and s_matrix.dim() == 3:
        ok = s_matrix.shape[0] in (1, h)
    if not ok:
        raise ValueError(f"s_matrix must have shape (N, N) or (heads, N, N) = ({h}, {n}, {n}), got {tuple(s_matrix.shape)}")


def scaled_attention_s(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s_matrix: Tensor,
    *,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    fused: bool = True,
) -> Tensor:
    """Scaled Attention S: ``softmax(s Q K^T) (I_N - S) V`` with a learnable ``S`` (heads, N, N)."""
    check_qkv("q", q)
    check_kv(k, v, need_same_dim=False)
    _check_s_matrix(s_matrix, k.shape[1], k.shape[2])
    check_tensors("scaled_attention_s", (("q", q), ("k", k), ("v", v)),
                  (("s_matrix", s_matrix), ("attn_mask", attn_mask)))
    v_scaled = v - torch.matmul(s_matrix.to(v.dtype), v)
    return attention(q, k, v_scaled, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale, fused=fused)


def scaled_attention_alpha(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: Union[Tensor, float],
    *,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    fused: bool = True,
) -> Tensor:
    """Scaled Attention alpha: ``softmax(s Q K^T) (I_N - alpha softmax(s K K^T)) V``."""
    check_qkv("q", q)
    check_kv(k, v, need_same_dim=False)
    check_tensors("scaled_attention_alpha", (("q", q), ("k", k), ("v", v)), (("attn_mask", attn_mask),))
    kk = symmetric_attention(k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, fused=fused)
    if isinstance(alpha, Tensor):
        alpha = alpha.to(v.dtype)
    return attention(q, k, v - alpha * kk, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale, fused=fused)
