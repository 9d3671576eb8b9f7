"""Attention kernels: symmetric attention, Principal Attention Pursuit (PAP) and Scaled Attention.

Every model family, integration and analysis tool in this library calls these functions; there is
no second copy of the PAP algorithm anywhere. Tensors are shaped ``(batch, heads, tokens, head_dim)``.

PAP (SPEC section 3) treats the keys as low rank plus sparse, ``K = L + S``, and unrolls the ADMM of
principal component pursuit with the attention itself standing in for the low-rank step::

    L = 0; Y = 0
    mu  = N * C / (4 * sum |k|)          # per (batch, head); C = heads * head_dim
    tau = lambd * mu
    repeat n_iter - 1 times:
        S  = shrink(k - L + Y / mu, tau)
        K2 = k - S - Y / mu
        L  = softmax(s K2 K2^T) v
        Y  = Y + mu * (k - L - S)
    S   = shrink(k - L + Y / mu, tau)
    K2  = k - S - Y / mu
    out = dropout(softmax(s K2 K2^T)) v
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "PAPState",
    "THRESHOLDS",
    "MU_MODES",
    "symmetric_attention",
    "attention",
    "pap_attention",
    "pap_decompose",
    "scaled_attention_s",
    "scaled_attention_alpha",
    "soft_shrink",
    "check_pap_options",
]

THRESHOLDS = ("lambda_mu", "lambda_over_mu")
# global: official (sum over the whole sequence, width C); causal: per-position mu, width C;
# head_dim / causal_head_dim: the same with the head width d in place of C.
MU_MODES = ("global", "causal", "head_dim", "causal_head_dim")
_CAUSAL_MU_MODES = ("causal", "causal_head_dim")

# Floor for sum |k| (per batch and head) so that all-zero keys give a finite mu.
_MU_DENOM_FLOOR = 1e-6


@dataclass
class PAPState:
    """Internal state of PAP after the final pass.

    ``sparse`` (S), ``lowrank`` (L) and ``dual`` (Y) have the shape of the keys; ``mu`` broadcasts
    against them (``(B, H, 1, 1)`` for global modes, ``(B, H, N, 1)`` for causal ones).
    ``n_iter_run`` counts the softmax evaluations actually performed (< n_iter when ``tol`` stopped
    early). ``cleaned_keys`` is K2 of the final pass, the keys the output attention used.
    """

    sparse: Tensor
    lowrank: Tensor
    dual: Tensor
    mu: Tensor
    tau: Tensor
    cleaned_keys: Tensor
    n_iter_run: int


def soft_shrink(x: Tensor, tau: Union[Tensor, float]) -> Tensor:
    """``sign(x) * max(|x| - tau, 0)`` with a (broadcastable) tensor threshold."""
    return torch.sign(x) * torch.clamp(x.abs() - tau, min=0)


def _check_qkv(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D (batch, heads, tokens, head_dim), got shape {tuple(t.shape)}")


def _check_kv(k: Tensor, v: Tensor, *, need_same_dim: bool) -> None:
    _check_qkv("k", k)
    _check_qkv("v", v)
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"k and v must agree in (batch, heads, tokens): k {tuple(k.shape)} vs v {tuple(v.shape)}"
        )
    if need_same_dim and k.shape[-1] != v.shape[-1]:
        raise ValueError(
            f"PAP needs d_v == d_k (its L step lives in value space): k has head_dim {k.shape[-1]}, "
            f"v has {v.shape[-1]}"
        )


def _normalise_mask(attn_mask: Optional[Tensor], b: int, h: int, nq: int, nk: int) -> Optional[Tensor]:
    """Validate a mask and return it as bool (True = may attend), broadcastable to (B, H, Nq, Nk)."""
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
    mask = attn_mask.reshape(shape)
    if mask.dtype != torch.bool:
        if not mask.is_floating_point():
            raise ValueError(f"attn_mask must be bool (True = attend) or float (additive), got {mask.dtype}")
        blocked = (mask == float("-inf")) | (mask <= torch.finfo(mask.dtype).min / 2)
        if not (blocked | (mask == 0)).all():
            raise ValueError(
                "a float attn_mask must be additive with 0 (attend) and -inf or the dtype minimum (masked); "
                "pass a bool mask (True = attend) instead"
            )
        mask = ~blocked
    return mask


def _combined_mask(mask: Optional[Tensor], is_causal: bool, nq: int, nk: int, device) -> Optional[Tensor]:
    if not is_causal:
        return mask
    causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=nk - nq)
    return causal if mask is None else (mask & causal)


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    is_causal: bool,
    dropout_p: float,
    scale: float,
    fused: bool,
) -> Tensor:
    """softmax(scale q k^T + mask) v, fused (SDPA) or explicit. ``mask`` is bool or None."""
    if fused:
        # SDPA's own is_causal aligns the triangle top-left; ours is end-aligned (query i sees
        # keys up to nk - nq + i), so build the mask ourselves whenever the two would differ.
        if is_causal and (mask is not None or q.shape[-2] != k.shape[-2]):
            mask = _combined_mask(mask, True, q.shape[-2], k.shape[-2], q.device)
            is_causal = False
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    full = _combined_mask(mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    if full is not None:
        scores = scores.masked_fill(~full, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if full is not None:
        # rows with no admissible key give 0 instead of NaN
        weights = torch.nan_to_num(weights, nan=0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return torch.matmul(weights, v)


def _resolve_scale(scale: Optional[float], d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    return scale


def _check_dropout(dropout_p: float) -> float:
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return dropout_p


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
    _check_qkv("q", q)
    _check_kv(k, v, need_same_dim=False)
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, heads and head_dim")
    mask = _normalise_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return _attend(q, k, v, mask, is_causal, _check_dropout(dropout_p), _resolve_scale(scale, q.shape[-1]), fused)


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
    _check_kv(k, v, need_same_dim=False)
    mask = _normalise_mask(attn_mask, k.shape[0], k.shape[1], k.shape[2], k.shape[2])
    return _attend(k, k, v, mask, is_causal, _check_dropout(dropout_p), _resolve_scale(scale, k.shape[-1]), fused)


def _key_validity(mask: Optional[Tensor], b: int, h: int, n: int, device) -> Optional[Tensor]:
    """(B or 1, H or 1, N, 1) float: 1 for keys some query may attend to, 0 for padding."""
    if mask is None:
        return None
    valid = mask.any(dim=-2)  # over queries -> (B?, H?, N)
    return valid.unsqueeze(-1)


def _compute_mu(
    k: Tensor, valid: Optional[Tensor], mu_mode: str, width: int
) -> Tensor:
    """mu = count * width / (4 * sum |k|) over valid keys, global or per position (causal)."""
    absk = k.abs().sum(dim=-1, keepdim=True)  # (B, H, N, 1) L1 norm of each key row
    if valid is not None:
        validf = valid.to(absk.dtype)
        absk = absk * validf
        counts = validf.expand_as(absk)
    else:
        counts = torch.ones_like(absk)
    if mu_mode in _CAUSAL_MU_MODES:
        denom = absk.cumsum(dim=-2)
        count = counts.cumsum(dim=-2)
    else:
        denom = absk.sum(dim=-2, keepdim=True)
        count = counts.sum(dim=-2, keepdim=True)
    count = count.clamp_min(1.0)
    return count * width / (4.0 * denom.clamp_min(_MU_DENOM_FLOOR))


def check_pap_options(
    *,
    n_iter: int = 6,
    lambd: float = 4.0,
    threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None,
    is_causal: bool = False,
    tol: Optional[float] = None,
    model_dim: Optional[int] = None,
) -> str:
    """Validate PAP options up front; returns the resolved ``mu_mode``. Raises ``ValueError``."""
    if isinstance(n_iter, bool) or not isinstance(n_iter, int):
        raise ValueError(f"n_iter must be an integer >= 1, got {n_iter!r}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be >= 1 (it counts softmax evaluations), got {n_iter}")
    try:
        lambd_f = float(lambd)
    except (TypeError, ValueError):
        raise ValueError(f"lambd must be a number >= 0, got {lambd!r}") from None
    if math.isnan(lambd_f) or lambd_f < 0:
        raise ValueError(f"lambd must be >= 0 and not NaN, got {lambd!r}")
    if threshold not in THRESHOLDS:
        raise ValueError(f"threshold must be one of {THRESHOLDS}, got {threshold!r}")
    if mu_mode is None:
        mu_mode = "causal" if is_causal else "global"
    if mu_mode not in MU_MODES:
        raise ValueError(f"mu_mode must be one of {MU_MODES}, got {mu_mode!r}")
    if is_causal and mu_mode not in _CAUSAL_MU_MODES:
        raise ValueError(
            f"mu_mode={mu_mode!r} with is_causal=True sums |k| over the whole sequence and leaks future "
            f"tokens into past outputs; use one of {_CAUSAL_MU_MODES}"
        )
    if tol is not None:
        try:
            tol_ok = float(tol) >= 0
        except (TypeError, ValueError):
            tol_ok = False
        if not tol_ok:
            raise ValueError(f"tol must be a non-negative number or None, got {tol!r}")
    if model_dim is not None and (isinstance(model_dim, bool) or not isinstance(model_dim, int) or model_dim < 1):
        raise ValueError(f"model_dim must be a positive integer, got {model_dim!r}")
    return mu_mode


def pap_attention(
    k: Tensor,
    v: Tensor,
    *,
    n_iter: int = 6,
    lambd: float = 4.0,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    model_dim: Optional[int] = None,
    threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None,
    tol: Optional[float] = None,
    return_state: bool = False,
    fused: bool = True,
    checkpoint_iters: bool = False,
) -> Union[Tensor, Tuple[Tensor, PAPState]]:
    """Principal Attention Pursuit: robust symmetric attention (SPEC section 3).

    Args:
        k, v: keys and values ``(B, H, N, d)``; PAP needs ``d_v == d_k``.
        n_iter: softmax evaluations in the layer (``n_iter - 1`` ADMM passes plus the final one).
            ``n_iter=1`` is symmetric attention on ``clamp(k, -tau, tau)``.
        lambd: sparsity weight lambda (official experiments: 4). ``lambd -> inf`` gives plain
            symmetric attention; 0 is degenerate (uniform attention) but allowed; negative raises.
        attn_mask: bool (True = may attend) or additive float mask broadcastable to (B, H, N, N).
            Keys no query may attend to (padding) take no part in attention, in mu or in N.
        is_causal: apply a causal mask in every iteration (and default to the causal mu).
        dropout_p: attention dropout, applied in the final attention only (as the official code).
        scale: softmax scale, default ``1/sqrt(d)``.
        model_dim: the width C in mu = N C / (4 sum|k|); default ``heads * head_dim``.
        threshold: ``"lambda_mu"`` (official, tau = lambd * mu) or ``"lambda_over_mu"`` (classic PCP).
        mu_mode: ``"global"`` (official), ``"causal"`` (mu_i = i C / (4 sum_{j<=i} ||k_j||_1)),
            ``"head_dim"`` / ``"causal_head_dim"`` (d instead of C). Default: ``"causal"`` when
            ``is_causal`` else ``"global"``. A global mode with ``is_causal`` raises: it would leak
            future tokens into past outputs.
        tol: stop the ADMM passes early when ``||S_t - S_{t-1}|| / ||S_{t-1}||`` falls below it
            (an inference option; the final pass always runs).
        return_state: also return a :class:`PAPState` (S, L, Y, mu, ...).
        fused: run each attention on ``scaled_dot_product_attention`` (O(N d) memory); ``False``
            materialises the N x N matrix.
        checkpoint_iters: keep less for the backward pass: only the cleaned keys and a 1-byte
            shrinkage pattern per ADMM pass; each pass's attention is recomputed during backward
            (one extra attention forward per pass). Same outputs and gradients.

    Implementation (``fused=True``, the default): the passes run in the scaled-dual form
    ``U = Y / mu``, in which mu enters only through tau and ``U`` and ``K2`` need two fused
    elementwise updates each (``U_t = L_{t-1} - L_t + C_t``, ``K2_t = L_{t-1} - 2 U_{t-1} + C_t``
    with ``C_t = clamp(k - L_{t-1} + U_{t-1}, -tau, tau)``). When gradients are needed the passes run
    inside one :class:`torch.autograd.Function` whose backward walks them in reverse with
    hand-derived elementwise gradients, so the autograd graph holds per pass only what the
    attention kernel saves plus one int8 tensor. ``return_state=True``, ``fused=False`` and code
    traced by ``torch.compile`` use the plain autograd formulation (the SPEC loop), which gives the
    same values.
    """
    kc, mask, mu, tau, scale, tol = _pap_setup(k, v, n_iter, lambd, attn_mask, is_causal, scale, model_dim,
                                               threshold, mu_mode, tol)
    dropout_p = _check_dropout(dropout_p)
    if fused and not return_state and not _is_compiling():
        if torch.is_grad_enabled() and (kc.requires_grad or v.requires_grad):
            return _PAPFunction.apply(kc, v, tau, mask, n_iter, is_causal, dropout_p, scale, tol,
                                      bool(checkpoint_iters))
        with torch.no_grad():
            return _pap_loop(kc, v, tau, mask, n_iter, is_causal, dropout_p, scale, tol, None)[0]
    return _pap_autograd(kc, v, mu, tau, mask, n_iter, is_causal, dropout_p, scale, tol, return_state,
                         fused, bool(checkpoint_iters))


def pap_decompose(
    k: Tensor,
    v: Tensor,
    *,
    n_iter: int = 6,
    lambd: float = 4.0,
    attn_mask: Optional[Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    model_dim: Optional[int] = None,
    threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None,
    tol: Optional[float] = None,
    fused: bool = True,
) -> PAPState:
    """PAP's decomposition without its final attention: the :class:`PAPState` that
    ``pap_attention(..., return_state=True)`` returns, one softmax evaluation cheaper.

    For callers that use S (or the cleaned keys) in an attention of their own, such as the
    asymmetric extension in :mod:`rpc_attention.integrations` or the analysis tools. Options as
    :func:`pap_attention`; ``n_iter_run`` counts the final pass as if it had run, so the state
    equals ``pap_attention``'s for the same options. Differentiable (plain autograd).
    """
    kc, mask, mu, tau, scale, tol = _pap_setup(k, v, n_iter, lambd, attn_mask, is_causal, scale, model_dim,
                                               threshold, mu_mode, tol)
    return _pap_autograd(kc, v, mu, tau, mask, n_iter, is_causal, 0.0, scale, tol, True, fused, False,
                         final_attention=False)[1]


def _pap_setup(k, v, n_iter, lambd, attn_mask, is_causal, scale, model_dim, threshold, mu_mode, tol):
    """Validate PAP's options and compute what every path needs: keys in the compute dtype, the
    normalised mask, mu and tau (SPEC section 3)."""
    _check_kv(k, v, need_same_dim=True)
    mu_mode = check_pap_options(n_iter=n_iter, lambd=lambd, threshold=threshold, mu_mode=mu_mode,
                                is_causal=is_causal, tol=tol, model_dim=model_dim)
    lambd = float(lambd)
    b, h, n, d = k.shape
    scale = _resolve_scale(scale, d)
    if model_dim is None:
        model_dim = h * d
    width = d if mu_mode in ("head_dim", "causal_head_dim") else model_dim

    mask = _normalise_mask(attn_mask, b, h, n, n)
    valid = _key_validity(mask, b, h, n, k.device)

    # State and thresholds in float32 at least (bf16/fp16 inputs), float64 stays float64.
    cdtype = torch.promote_types(k.dtype, torch.float32)
    kc = k.to(cdtype)
    mu = _compute_mu(kc, valid, mu_mode, width)
    if math.isinf(lambd):
        # S = 0 exactly. A constant tau: through lambd * mu (or lambd / mu) its zero gradient would
        # reach mu as inf * 0 = NaN.
        tau = torch.full_like(mu, math.inf)
    else:
        tau = lambd * mu if threshold == "lambda_mu" else lambd / mu
    tol = None if tol is None else float(tol)
    return kc, mask, mu, tau, scale, tol


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def _tol_stop(new_sparse: Tensor, sparse: Tensor, tol: float) -> bool:
    new_sparse, sparse = new_sparse.detach(), sparse.detach()
    change = torch.linalg.vector_norm(new_sparse - sparse)
    ref = torch.linalg.vector_norm(sparse).clamp_min(1e-12)
    return float(change / ref) < tol


def _pap_autograd(kc, v, mu, tau, mask, n_iter, is_causal, dropout_p, scale, tol, return_state, fused,
                  checkpoint_iters, final_attention=True):
    """The SPEC loop in plain autograd ops (explicit path, ``return_state``, ``torch.compile``).
    ``final_attention=False`` stops after the final pass's K2 (the output is then None)."""
    inv_mu = 1.0 / mu

    def admm_pass(lowrank: Tensor, dual: Tensor):
        new_sparse = soft_shrink(kc - lowrank + dual * inv_mu, tau)
        k2 = kc - new_sparse - dual * inv_mu
        lowrank = _attend(k2.to(v.dtype), k2.to(v.dtype), v, mask, is_causal, 0.0, scale, fused).to(kc.dtype)
        dual = dual + mu * (kc - lowrank - new_sparse)
        return new_sparse, lowrank, dual

    use_ckpt = checkpoint_iters and torch.is_grad_enabled() and (kc.requires_grad or v.requires_grad)
    lowrank = torch.zeros_like(kc)
    dual = torch.zeros_like(kc)
    sparse = torch.zeros_like(kc)
    n_run = 0
    for _ in range(n_iter - 1):
        if use_ckpt:
            from torch.utils.checkpoint import checkpoint

            new_sparse, lowrank, dual = checkpoint(admm_pass, lowrank, dual, use_reentrant=False)
        else:
            new_sparse, lowrank, dual = admm_pass(lowrank, dual)
        n_run += 1
        stop = tol is not None and n_run > 1 and _tol_stop(new_sparse, sparse, tol)
        sparse = new_sparse
        if stop:
            break
    sparse = soft_shrink(kc - lowrank + dual * inv_mu, tau)
    k2 = (kc - sparse - dual * inv_mu).to(v.dtype)
    out = _attend(k2, k2, v, mask, is_causal, dropout_p, scale, fused) if final_attention else None
    n_run += 1
    if return_state:
        return out, PAPState(sparse, lowrank, dual, mu, tau, k2, n_run)
    return out


# ---------------------------------------------------------------------------------------------
# Fused PAP (the default path). Scaled dual U = Y / mu, C = clamp(A, -tau, tau) = A - S:
#   A_t  = k - L_{t-1} + U_{t-1}          (A_1 = k: L_0 = U_0 = 0)
#   C_t  = clamp(A_t, -tau, tau)           S_t = A_t - C_t
#   K2_t = k - S_t - U_{t-1} = L_{t-1} - 2 U_{t-1} + C_t
#   L_t  = attention(K2_t)
#   U_t  = U_{t-1} + k - L_t - S_t = L_{t-1} - L_t + C_t
# Backward of one pass, given G_L = dLoss/dL_t and G_U = dLoss/dU_t (both 0 after the final pass):
#   gK2 = attention_backward(G_L - G_U);  gC = gK2 + G_U
#   gA  = gC * [|A_t| < tau];             gtau += gC * sign(S_t)
#   dk += gA;  dL_{t-1} = gC - gA;        dU_{t-1} = gA - 2 gK2
# ---------------------------------------------------------------------------------------------


def _pap_loop(kc, v, tau, mask, n_iter, is_causal, dropout_p, scale, tol, record, v_leaf=None):
    """Run the passes in the scaled-dual form. ``record``: None (values only), ``"graph"`` (keep
    each attention's autograd graph on detached leaves) or ``"ckpt"`` (keep only the cleaned keys).
    Returns ``(out, steps)``; ``steps`` holds ``(k2, attention_output_or_None, sign(S))`` per pass.

    Written with in-place updates into fresh or recycled buffers: on CPU these elementwise passes
    are memory bound, and every avoided allocation or read counts next to the attention kernel.
    """
    neg_tau = -tau
    steps = []
    lowrank = u = sparse = None
    keep_sign = record is not None
    # Scratch buffers reused across passes (fresh allocations cost as much as a pass on CPU):
    # "a" unless it becomes S (kept for tol) or sign(S) (kept for backward); "c" after the first
    # pass (where it is K2 itself); "k2" unless the attention keeps it for backward.
    spare = {}

    k2_reusable = True

    def buf(name, reuse):
        if not reuse:
            return None
        if name not in spare:
            spare[name] = torch.empty_like(kc)
        return spare[name]

    def one_pass(lowrank, u, final, need_sparse):
        if lowrank is None:  # A_1 = k
            c = torch.maximum(kc, neg_tau)
            torch.minimum(c, tau, out=c)
            k2 = c
            s = torch.sub(kc, c) if (need_sparse or keep_sign) else None
        else:
            a = torch.sub(kc, lowrank, out=buf("a", not (need_sparse or keep_sign))).add_(u)
            c = torch.maximum(a, neg_tau, out=buf("c", True))
            torch.minimum(c, tau, out=c)
            k2 = torch.add(lowrank, u, alpha=-2.0, out=buf("k2", record is None and k2_reusable)).add_(c)
            s = a.sub_(c) if (need_sparse or keep_sign) else None
        sign = None
        if keep_sign:
            sign = torch.sign(s) if need_sparse else s.sign_()
        k2a = k2.to(v.dtype)
        p = dropout_p if final else 0.0
        if record == "graph" or (record == "ckpt" and final):
            k2a = k2a.detach().requires_grad_(True)
            with torch.enable_grad():
                att = _attend(k2a, k2a, v_leaf, mask, is_causal, p, scale, True)
            steps.append((k2a, att, sign))
            new_l = att.detach()
        else:
            new_l = _attend(k2a, k2a, v, mask, is_causal, p, scale, True)
            if record == "ckpt":  # 1 byte per element for the shrinkage pattern
                steps.append((k2a, None, sign.to(torch.int8)))
        return c, s, new_l

    n_run = 0
    for _ in range(n_iter - 1):
        c, new_sparse, att = one_pass(lowrank, u, False, tol is not None)
        new_l = att.to(kc.dtype)
        # U_t = L_{t-1} - L_t + C_t, written into U_{t-1}'s buffer (U_1 = C_1 - L_1)
        u = torch.sub(c, new_l) if lowrank is None else torch.sub(lowrank, new_l, out=u).add_(c)
        lowrank = new_l
        n_run += 1
        stop = tol is not None and n_run > 1 and _tol_stop(new_sparse, sparse, tol)
        sparse = new_sparse
        if stop:
            break
    _, _, out = one_pass(lowrank, u, True, False)
    return out, steps


class _PAPFunction(torch.autograd.Function):
    """PAP passes with a hand-written elementwise backward (see the derivation above)."""

    @staticmethod
    def forward(ctx, kc, v, tau, mask, n_iter, is_causal, dropout_p, scale, tol, checkpoint_iters):
        v_leaf = v.detach().requires_grad_(v.requires_grad)
        out, steps = _pap_loop(kc.detach(), v.detach(), tau.detach(), mask, n_iter, is_causal, dropout_p,
                               scale, tol, "ckpt" if checkpoint_iters else "graph", v_leaf)
        # save_for_backward (not ctx attributes): the engine frees these after a backward without
        # retain_graph, together with the attention graphs hanging off the saved outputs.
        flat = [t for step in steps for t in step]
        ctx.save_for_backward(v_leaf, *flat)
        ctx.attend_args = (mask, is_causal, scale)
        ctx.kdtype = kc.dtype
        ctx.tau_shape = tau.shape
        return out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out):
        v_leaf, *flat = ctx.saved_tensors
        steps = [flat[i:i + 3] for i in range(0, len(flat), 3)]
        del flat
        mask, is_causal, scale = ctx.attend_args
        cdtype = ctx.kdtype
        need_v = v_leaf.requires_grad
        gk = gv = gtau = None
        g_l, g_u = g_out, None  # gradients w.r.t. L_t and U_t (U: none after the final pass)
        tmp = None
        for t in range(len(steps) - 1, -1, -1):
            k2a, att, sign = steps[t]
            steps[t] = None
            g_att = g_l if g_u is None else g_l.sub_(g_u)
            if att is None:  # checkpointed pass: recompute its attention
                k2a = k2a.detach().requires_grad_(True)
                with torch.enable_grad():
                    att = _attend(k2a, k2a, v_leaf, mask, is_causal, 0.0, scale, True)
            inputs = (k2a, v_leaf) if need_v else (k2a,)
            grads = torch.autograd.grad(att, inputs, g_att.to(att.dtype), retain_graph=True)
            del att, g_att
            if need_v:
                gv = grads[1].to(cdtype) if gv is None else gv.add_(grads[1])
            gk2 = grads[0].to(cdtype)
            del grads
            if sign.dtype != cdtype:
                sign = sign.to(cdtype)
            if g_u is None:  # final pass: dLoss/dC = gK2 (copied when gK2 is needed below)
                gc = gk2.clone() if t > 0 else gk2
            else:
                gc = g_u.add_(gk2)
            gtau = torch.mul(gc, sign) if gtau is None else gtau.addcmul_(gc, sign)
            # gC outside the clamp -> dL_{t-1}; one scratch buffer serves every pass (the previous
            # pass's dL has been consumed by the attention backward above)
            tmp = torch.mul(gc, sign, out=tmp)
            g_outside = tmp.mul_(sign)
            g_a = gc.sub_(g_outside)  # gC inside the clamp -> dA_t
            if t > 0:
                g_l = g_outside
            if gk is None:
                gk = g_a
                if t > 0:
                    g_u = torch.add(g_a, gk2, alpha=-2.0)  # dU_{t-1} = gA - 2 gK2
            else:
                gk.add_(g_a)
                if t > 0:
                    g_u = g_a.add_(gk2, alpha=-2.0)
        gtau = gtau.sum_to_size(ctx.tau_shape)
        gv = gv.to(v_leaf.dtype) if gv is not None else None
        return gk, gv, gtau, None, None, None, None, None, None, None


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
    _check_kv(k, v, need_same_dim=False)
    _check_s_matrix(s_matrix, k.shape[1], k.shape[2])
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
    _check_kv(k, v, need_same_dim=False)
    kk = symmetric_attention(k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, fused=fused)
    if isinstance(alpha, Tensor):
        alpha = alpha.to(v.dtype)
    return attention(q, k, v - alpha * kk, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale, fused=fused)
