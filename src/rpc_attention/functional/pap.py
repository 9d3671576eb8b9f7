"""Principal Attention Pursuit (PAP): the definition.

PAP treats the keys as low rank plus sparse, ``K = L + S``, and unrolls the ADMM of principal
component pursuit with the attention itself standing in for the low-rank step (docs/method.md).
Per (batch, head), with ``k, v`` of shape ``(N, d)`` and ``C`` the model width::

    L = 0; Y = 0
    mu  = N * C / (4 * sum |k|)          # one value per (batch, head)
    tau = lambd * mu                     # the official threshold
    repeat n_iter - 1 times:
        S  = shrink(k - L + Y / mu, tau)     # shrink(x, t) = sign(x) max(|x| - t, 0)
        K2 = k - S - Y / mu
        L  = softmax(s K2 K2^T) v
        Y  = Y + mu * (k - L - S)
    S   = shrink(k - L + Y / mu, tau)
    K2  = k - S - Y / mu
    out = dropout(softmax(s K2 K2^T)) v

:func:`pap_loop` below is that loop in plain autograd operations: it is the definition the rest is
tested against. :func:`pap_attention` runs it for ``return_state=True``, ``fused=False`` and under
``torch.compile``; otherwise it runs the same passes on the fused path of
:mod:`rpc_attention.functional.pap_fused` (an algebraically equal form with a hand-written backward)
or, for the dual-free hard-shrinkage options, on :mod:`rpc_attention.functional.pap_robust`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Tuple, Union, cast, overload

import numpy as np
import torch
from torch import Tensor

from .attention import attend, check_dropout, check_kv, check_tensors, normalise_mask, resolve_scale
from .pap_fused import FusedPAPOptions, fused_pap, sparse_converged
from .pap_robust import dual_free, dual_free_pap

__all__ = ["THRESHOLDS", "LOWRANKS", "SHRINKS", "MAD_TO_STD", "MU_MODES", "CAUSAL_MU_MODES", "PAPState", "PAPProblem",
           "soft_shrink", "hard_shrink", "feature_median", "robust_scale", "outlier_rows", "check_pap_options",
           "mu_from_sums", "threshold_of", "prepare_pap", "pass_keys", "pass_dual", "pap_loop", "sparse_activity",
           "sparse_term_activity", "pap_attention", "pap_decompose"]

# How tau is set (docs/method.md#threshold-rules):
#   lambda_mu        tau = lambd * mu                        (the official code)
#   lambda_over_mu   tau = lambd / mu                        (classic principal component pursuit)
#   candes           tau = lambd / (sqrt(max(N, d)) * mu)    (lambd = 1: Candes et al.'s default weight)
#   target_fraction  tau = the (1 - lambd) quantile of |k| per (batch, head): the first pass shrinks
#                    a fraction lambd of the key entries whatever the scale of the keys
#   mad              tau = lambd * 1.4826 * MAD of the keys per (batch, head): the median over tokens and
#                    features of |k - median over tokens of k|, a robust scale that sparse corruption does
#                    not inflate; lambd reads as a robust z-score (not for causal layers)
THRESHOLDS = ("lambda_mu", "lambda_over_mu", "candes", "target_fraction", "mad")
# Where the low-rank estimate L lives: "values" (official, L = softmax(s K2 K2^T) v) or "keys"
# (L = softmax(s K2 K2^T) K2, started at the per-feature median of the keys over tokens), so that
# k - L - S can go to 0 and the values need not share the keys' width.
LOWRANKS = ("values", "keys")
# How S takes the residual: "soft" (official, S = shrink(x, tau), which leaves +-tau of an outlier in
# the keys) or "hard" (S = x where |x| > tau, else 0: the whole outlier).
SHRINKS = ("soft", "hard")
# 1.4826 * MAD estimates the standard deviation of normally distributed data.
MAD_TO_STD = 1.4826
# row_lambd (the token rule, docs/method.md#robust-variants): a token whose row score (the median over
# features of |k - per-feature median|) exceeds median + row_lambd * 1.4826 * MAD of all tokens' scores
# (per batch and head) goes into S whole. A patch replaces one token's embedding: its whole key row moves.
# global: official (sum over the whole sequence, width C); causal: per-position mu, width C;
# head_dim / causal_head_dim: the same with the head width d in place of C.
MU_MODES = ("global", "causal", "head_dim", "causal_head_dim")
CAUSAL_MU_MODES = ("causal", "causal_head_dim")

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


@dataclass(frozen=True)
class PAPProblem:
    """What every PAP path needs, computed once from the inputs and options by :func:`prepare_pap`."""

    keys: Tensor              # k in the compute dtype (float32 at least; float64 stays float64)
    mask: Optional[Tensor]    # bool (True = may attend), broadcastable to (B, H, N, N), or None
    mu: Tensor                # (B, H, 1, 1) global or (B, H, N, 1) causal
    tau: Tensor               # the shrinkage threshold, shaped as mu
    scale: float              # softmax scale
    lowrank: str = "values"   # LOWRANKS
    shrink: str = "soft"      # SHRINKS
    dual_step: float = 1.0    # Y <- Y + dual_step * mu * (k - L - S)
    start: Optional[Tensor] = None  # L_0: None (0) or the per-feature median (lowrank="keys")
    rows: Optional[Tensor] = None   # bool (B, H, N, 1): tokens the row rule puts into S whole, or None

    @property
    def robust(self) -> bool:
        """True when an option beyond the official loop is set (the fused path does not run those)."""
        return (self.lowrank != "values" or self.shrink != "soft" or self.dual_step != 1.0 or self.start is not None
                or self.rows is not None)


def soft_shrink(x: Tensor, tau: Union[Tensor, float]) -> Tensor:
    """``sign(x) * max(|x| - tau, 0)`` with a (broadcastable) tensor threshold."""
    return torch.sign(x) * torch.clamp(x.abs() - tau, min=0)


def hard_shrink(x: Tensor, tau: Union[Tensor, float]) -> Tensor:
    """``x`` where ``|x| > tau``, else 0: the whole entry, not only its excess over tau."""
    return x * (x.abs() > tau).to(x.dtype)


def _lower_median(x: Tensor, dim: int) -> Tensor:
    """The lower median over ``dim`` (torch.median's convention), keeping the dimension, without
    gradient. On the CPU numpy's introselect (``np.partition``) picks the same element 4-7 times
    faster than torch's median (measured on PAP's key shapes, docs/method.md#robust-variants)."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        kth = (x.shape[dim] - 1) // 2
        picked = np.take(np.partition(x.detach().numpy(), kth, axis=dim), [kth], axis=dim)
        return torch.from_numpy(np.ascontiguousarray(picked))
    return x.median(dim=dim, keepdim=True).values


def _masked_median(x: Tensor, valid: Optional[Tensor], dim) -> Tensor:
    """Median over ``dim`` (an int or a tuple of trailing dims) of the entries of valid rows."""
    if isinstance(dim, tuple):
        flat = x.flatten(-len(dim))
        if valid is None:
            return _lower_median(flat, -1)
        # valid keeps its own leading shape (broadcast against x's later), only the reduced dims are expanded
        return _masked_median(flat, valid.expand(*valid.shape[:-len(dim)], *x.shape[-len(dim):]).flatten(-len(dim)), -1)
    if valid is None:
        return _lower_median(x, dim)
    # The invalid entries become -inf (the first a of them along dim) and +inf (the rest), with a chosen
    # so that the plain lower median of all N entries is the lower median of the n valid ones:
    # (N - 1) // 2 = a + (n - 1) // 2. The plain median runs on the fast path of _lower_median (several
    # times faster than nanmedian on the CPU); a slice without a valid entry gives NaN, as nanmedian.
    invalid = ~valid  # broadcastable to x: the counts are taken on its own (smaller) shape
    if invalid.shape[dim] != x.shape[dim]:
        invalid = invalid.expand(*invalid.shape[:dim % x.dim()], x.shape[dim], *invalid.shape[dim % x.dim() + 1:])
    total, n = x.shape[dim], (~invalid).sum(dim, keepdim=True)
    low = (total - 1) // 2 - torch.div(n - 1, 2, rounding_mode="floor")
    first = invalid & (invalid.cumsum(dim) <= low)
    filled = x.masked_fill(invalid, float("inf")).masked_fill(first, float("-inf"))
    med = _lower_median(filled, dim).to(x.device)
    return med.masked_fill(n == 0, float("nan"))


def feature_median(keys: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """The per-feature median over valid tokens, ``(B, H, 1, d)`` (0 where no token is valid).
    Computed without gradient: it is a robust centre, not a learned quantity."""
    with torch.no_grad():
        return torch.nan_to_num(_masked_median(keys, valid, -2), nan=0.0)


def robust_scale(keys: Tensor, valid: Optional[Tensor] = None, centre: Optional[Tensor] = None) -> Tensor:
    """``1.4826 * MAD`` per (batch, head), shape ``(B, H, 1, 1)``: the median over tokens and
    features of ``|k - median over tokens of k|`` (valid tokens only). Computed without gradient.
    ``centre``: the per-feature median when the caller has it already (:func:`feature_median`)."""
    with torch.no_grad():
        centre = _masked_median(keys, valid, -2) if centre is None else centre
        mad = _masked_median((keys - centre).abs(), valid, (-2, -1))
        return (MAD_TO_STD * torch.nan_to_num(mad, nan=0.0)).unsqueeze(-1).clamp_min(1e-12)


def outlier_rows(keys: Tensor, row_lambd: float, valid: Optional[Tensor] = None,
                 centre: Optional[Tensor] = None) -> Tensor:
    """The token rule: bool ``(B, H, N, 1)``, True for the valid tokens whose key row is an outlier.

    Per (batch, head) each token's row score ``r_n = median_j |k_nj - m_j|`` (the median over features
    of its distance from the per-feature median ``m``) is compared with the robust spread of those
    scores over the valid tokens: a token is flagged when ``r_n > median(r) + row_lambd *
    max(1.4826 * MAD(r), 1e-12)``. A median over features moves only when most of a row moves (a whole
    corrupted token), not for a few outlying entries, which the entrywise threshold takes; the median
    and MAD over tokens are unchanged while fewer than half of the tokens are corrupted. Computed
    without gradient."""
    with torch.no_grad():
        centre = feature_median(keys, valid) if centre is None else centre
        score = _lower_median((keys - centre).abs(), -1)  # (B, H, N, 1)
        mid = _masked_median(score, valid, -2)
        mad = _masked_median((score - mid).abs(), valid, -2)
        limit = mid + row_lambd * (MAD_TO_STD * mad).clamp_min(1e-12)
        flagged = torch.nan_to_num(score - limit, nan=-1.0) > 0
        return flagged if valid is None else flagged & valid.expand_as(flagged)


def check_pap_options(
    *,
    n_iter: int = 6,
    lambd: float = 4.0,
    threshold: str = "lambda_mu",
    mu_mode: Optional[str] = None,
    is_causal: bool = False,
    tol: Optional[float] = None,
    model_dim: Optional[int] = None,
    lowrank: str = "values",
    shrink: str = "soft",
    dual_step: float = 1.0,
    row_lambd: Optional[float] = None,
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
    if threshold == "target_fraction":
        if not 0.0 < lambd_f < 1.0:
            raise ValueError(f"threshold='target_fraction' reads lambd as the fraction of key entries to shrink; "
                             f"give lambd in (0, 1), e.g. lambd=0.05 (got {lambd!r})")
        if is_causal:
            raise ValueError("threshold='target_fraction' takes a quantile over the whole sequence, which would "
                             "leak future tokens into a causal layer; use 'candes' or 'lambda_over_mu' there")
    if threshold == "mad" and is_causal:
        raise ValueError("threshold='mad' takes medians over the whole sequence, which would leak future tokens "
                         "into a causal layer; use 'candes' or 'lambda_over_mu' there")
    _check_robust_options(n_iter, lowrank, shrink, dual_step, is_causal)
    _check_row_lambd(row_lambd, is_causal)
    if mu_mode is None:
        mu_mode = "causal" if is_causal else "global"
    if mu_mode not in MU_MODES:
        raise ValueError(f"mu_mode must be one of {MU_MODES}, got {mu_mode!r}")
    if is_causal and mu_mode not in CAUSAL_MU_MODES:
        raise ValueError(
            f"mu_mode={mu_mode!r} with is_causal=True sums |k| over the whole sequence and leaks future "
            f"tokens into past outputs; use one of {CAUSAL_MU_MODES}"
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


def _check_robust_options(n_iter: int, lowrank: str, shrink: str, dual_step: float, is_causal: bool) -> None:
    """The options beyond the official loop (docs/method.md#robust-variants)."""
    if lowrank not in LOWRANKS:
        raise ValueError(f"lowrank must be one of {LOWRANKS}, got {lowrank!r}")
    if shrink not in SHRINKS:
        raise ValueError(f"shrink must be one of {SHRINKS}, got {shrink!r}")
    if lowrank == "keys" and is_causal:
        raise ValueError("lowrank='keys' starts L at the per-feature median over the whole sequence, which would "
                         "leak future tokens into a causal layer; use lowrank='values' there")
    try:
        step = float(dual_step)
    except (TypeError, ValueError):
        raise ValueError(f"dual_step must be a number >= 0, got {dual_step!r}") from None
    if isinstance(dual_step, bool) or math.isnan(step) or not 0.0 <= step < math.inf:
        raise ValueError(f"dual_step must be a finite number >= 0, got {dual_step!r}")
    if step != 1.0 and n_iter == 1:
        raise ValueError(f"dual_step={dual_step!r} has no effect with n_iter=1 (no ADMM pass updates the dual); "
                         f"give n_iter >= 2 or leave dual_step at 1")


def _check_row_lambd(row_lambd: Optional[float], is_causal: bool) -> None:
    """The token rule (:func:`outlier_rows`): None (off) or a finite robust z-score >= 0."""
    if row_lambd is None:
        return
    try:
        value = float(row_lambd)
    except (TypeError, ValueError):
        raise ValueError(f"row_lambd must be None or a finite number >= 0, got {row_lambd!r}") from None
    if isinstance(row_lambd, bool) or math.isnan(value) or not 0.0 <= value < math.inf:
        raise ValueError(f"row_lambd must be None (no token rule) or a finite number >= 0, got {row_lambd!r}")
    if is_causal:
        raise ValueError("row_lambd takes medians of the key rows over the whole sequence, which would leak future "
                         "tokens into a causal layer; leave row_lambd=None there")


def _compute_mu(keys: Tensor, valid: Optional[Tensor], mu_mode: str, width: int) -> Tuple[Tensor, Tensor]:
    """mu = count * width / (4 * sum |k|) over valid keys, global or per position (causal).
    Returns ``(mu, count)``, count being the number of valid keys mu was taken over (at least 1)."""
    abs_rows = keys.abs().sum(dim=-1, keepdim=True)  # (B, H, N, 1): L1 norm of each key row
    if valid is not None:
        validf = valid.to(abs_rows.dtype)
        abs_rows = abs_rows * validf
        counts = validf.expand_as(abs_rows)
    else:
        counts = torch.ones_like(abs_rows)
    if mu_mode in CAUSAL_MU_MODES:
        denom, count = abs_rows.cumsum(dim=-2), counts.cumsum(dim=-2)
    else:
        denom, count = abs_rows.sum(dim=-2, keepdim=True), counts.sum(dim=-2, keepdim=True)
    return mu_from_sums(denom, count, width)


def mu_from_sums(denom: Tensor, count: Tensor, width: int) -> Tuple[Tensor, Tensor]:
    """mu = count * width / (4 * denom) from the (running) sum of valid |k| rows and their count.
    Returns ``(mu, count)`` with the count floored at 1 (also the decoding cache's mu)."""
    count = count.clamp_min(1.0)
    return count * width / (4.0 * denom.clamp_min(_MU_DENOM_FLOOR)), count


def _quantile_threshold(keys: Tensor, valid: Optional[Tensor], fraction: float) -> Tensor:
    """Per (batch, head), the value that ``ceil(fraction * n)`` of the ``n`` valid entries of |k|
    exceed (``target_fraction``). Computed without gradient: it sets a level, it is not learned."""
    with torch.no_grad():
        b, h, n, d = keys.shape
        mags = keys.abs()
        if valid is not None:  # padding rows sort last
            mags = mags.masked_fill(~valid.expand(b, h, n, 1), -1.0)
        n_valid = (torch.full((b, h, 1, 1), n * d, device=keys.device) if valid is None
                   else valid.expand(b, h, n, 1).sum(dim=-2, keepdim=True) * d)
        ranked = mags.reshape(b, h, n * d).sort(dim=-1, descending=True).values
        idx = torch.ceil(fraction * n_valid.to(keys.dtype)).long().clamp(max=n * d - 1)
        idx = torch.minimum(idx, (n_valid - 1).clamp_min(0).long())
        return ranked.gather(-1, idx.reshape(b, h, 1)).reshape(b, h, 1, 1).clamp_min(0.0)


def threshold_of(threshold: str, lambd: float, mu: Tensor, count: Tensor, keys: Tensor,
                 valid: Optional[Tensor], centre: Optional[Tensor] = None) -> Tensor:
    """tau for the chosen rule (see THRESHOLDS); ``centre``: the per-feature median, when known."""
    if math.isinf(lambd):
        # S = 0 exactly; a constant threshold keeps inf * 0 out of the gradient of mu.
        return torch.full_like(mu, math.inf).detach()
    if threshold == "lambda_mu":
        return lambd * mu
    if threshold == "lambda_over_mu":
        return lambd / mu
    if threshold == "candes":
        return lambd / (torch.sqrt(count.clamp_min(keys.shape[-1])) * mu)
    if threshold == "mad":  # global mu (causal is refused); a level set from the keys, not learned
        return lambd * robust_scale(keys, valid, centre)
    return _quantile_threshold(keys, valid, lambd)  # target_fraction: mu is global (causal is refused)


def prepare_pap(k: Tensor, v: Tensor, *, n_iter: int = 6, lambd: float = 4.0,
                attn_mask: Optional[Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
                model_dim: Optional[int] = None, threshold: str = "lambda_mu", mu_mode: Optional[str] = None,
                tol: Optional[float] = None, lowrank: str = "values", shrink: str = "soft",
                dual_step: float = 1.0, row_lambd: Optional[float] = None,
                where: str = "pap_attention") -> PAPProblem:
    """Validate PAP's inputs and options and compute the keys in the compute dtype, the bool mask,
    mu and tau (and L_0 for ``lowrank="keys"``, the flagged rows for ``row_lambd``). Keys no query may
    attend to (padding) take no part in mu, in N or in the medians. The per-feature median is taken
    once and shared by every statistic that needs it. ``where``, the public function called, starts
    the message of an input error."""
    check_kv(k, v, need_same_dim=lowrank == "values")
    check_tensors(where, (("k", k), ("v", v)), (("attn_mask", attn_mask),))
    mu_mode = check_pap_options(n_iter=n_iter, lambd=lambd, threshold=threshold, mu_mode=mu_mode,
                                is_causal=is_causal, tol=tol, model_dim=model_dim, lowrank=lowrank,
                                shrink=shrink, dual_step=dual_step, row_lambd=row_lambd)
    lambd = float(lambd)
    b, h, n, d = k.shape
    width = d if mu_mode in ("head_dim", "causal_head_dim") else (h * d if model_dim is None else model_dim)
    mask = normalise_mask(attn_mask, b, h, n, n)
    valid = None if mask is None else mask.any(dim=-2).unsqueeze(-1)  # keys some query may see
    # State and thresholds in float32 at least (bf16/fp16 inputs), float64 stays float64.
    keys = k.to(torch.promote_types(k.dtype, torch.float32))
    needs_centre = threshold == "mad" or lowrank == "keys" or row_lambd is not None
    centre = feature_median(keys, valid) if needs_centre else None
    mu, count = _compute_mu(keys, valid, mu_mode, width)
    tau = threshold_of(threshold, lambd, mu, count, keys, valid, centre=centre)
    start = centre.expand_as(keys) if lowrank == "keys" and centre is not None else None  # L_0: the per-feature median
    rows = None if row_lambd is None else outlier_rows(keys, float(row_lambd), valid, centre)
    return PAPProblem(keys=keys, mask=mask, mu=mu, tau=tau, scale=resolve_scale(scale, d), lowrank=lowrank,
                      shrink=shrink, dual_step=float(dual_step), start=start, rows=rows)


def pass_keys(k: Tensor, lowrank: Tensor, dual: Tensor, mu: Tensor, tau: Tensor,
              shrink: str = "soft", rows: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """One pass's sparse term and cleaned keys, row by row (the definition's first two lines):
    ``S = shrink(k - L + Y / mu, tau)``, ``K2 = k - S - Y / mu``, with the soft or the hard
    shrinkage; the token rule's ``rows`` (bool ``(B, H, N, 1)``) take ``S = k - L + Y / mu`` whole.
    Returns ``(S, K2)``."""
    inv_mu = 1.0 / mu
    residual = k - lowrank + dual * inv_mu
    sparse = (soft_shrink if shrink == "soft" else hard_shrink)(residual, tau)
    if rows is not None:
        sparse = torch.where(rows, residual, sparse)
    return sparse, k - sparse - dual * inv_mu


def pass_dual(k: Tensor, lowrank: Tensor, sparse: Tensor, dual: Tensor, mu: Tensor, step: float = 1.0) -> Tensor:
    """The dual update of one pass, row by row: ``Y + step mu (k - L - S)`` (``step`` 0 keeps Y)."""
    if step == 0.0:
        return dual
    return dual + (mu if step == 1.0 else step * mu) * (k - lowrank - sparse)


def pap_loop(problem: PAPProblem, v: Tensor, *, n_iter: int, is_causal: bool = False, dropout_p: float = 0.0,
             tol: Optional[float] = None, fused: bool = True, checkpoint_iters: bool = False,
             final_attention: bool = True, record_keys: Optional[List[Tensor]] = None
             ) -> Tuple[Optional[Tensor], PAPState]:
    """The PAP loop in plain autograd operations (the definition). Returns ``(out, state)``;
    ``final_attention=False`` stops after the final pass's K2 (``out`` is then None). A list given
    as ``record_keys`` receives the cleaned keys K2 of every pass, in order (the decoding cache)."""
    k, mask, mu, tau, scale = problem.keys, problem.mask, problem.mu, problem.tau, problem.scale
    in_keys = problem.lowrank == "keys"

    def admm_pass(lowrank: Tensor, dual: Tensor):
        sparse, k2 = pass_keys(k, lowrank, dual, mu, tau, problem.shrink, problem.rows)
        k2 = k2.to(v.dtype)
        if record_keys is not None:
            record_keys.append(k2)
        lowrank = attend(k2, k2, k2 if in_keys else v, mask, is_causal, 0.0, scale, fused).to(k.dtype)
        return sparse, lowrank, pass_dual(k, lowrank, sparse, dual, mu, problem.dual_step)

    if checkpoint_iters and torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        from torch.utils.checkpoint import checkpoint

        def step(lowrank, dual):
            return checkpoint(admm_pass, lowrank, dual, use_reentrant=False)
    else:
        step = admm_pass

    lowrank = torch.zeros_like(k) if problem.start is None else problem.start
    dual, sparse = torch.zeros_like(k), torch.zeros_like(k)
    n_run = 0
    for _ in range(n_iter - 1):
        new_sparse, lowrank, dual = step(lowrank, dual)
        n_run += 1
        stop = tol is not None and n_run > 1 and sparse_converged(new_sparse, sparse, tol)
        sparse = new_sparse
        if stop:
            break
    sparse, k2 = pass_keys(k, lowrank, dual, mu, tau, problem.shrink, problem.rows)
    k2 = k2.to(v.dtype)
    if record_keys is not None:
        record_keys.append(k2)
    out = attend(k2, k2, v, mask, is_causal, dropout_p, scale, fused) if final_attention else None
    return out, PAPState(sparse, lowrank, dual, mu, tau, k2, n_run + 1)


def sparse_activity(state: PAPState, keys: Tensor, valid: Optional[Tensor] = None) -> Dict[str, float]:
    """How much PAP's sparse step did in one forward (its final pass), over the valid tokens.

    Args:
        state: the :class:`PAPState` of the forward (``return_state=True`` or :func:`pap_decompose`).
        keys: the keys ``(B, H, N, d)`` the forward was given.
        valid: optional bool ``(B, N)`` or ``(B, H, N)``: True for real tokens (padding excluded).
    Returns ``frac_nonzero`` (share of S entries that are non-zero), ``frac_rows_nonzero`` (share of
    tokens with a non-zero S row), ``s_over_k`` (||S||_F / ||K||_F), ``tau_mean`` / ``tau_max`` and
    ``abs_k_median`` / ``abs_k_p99`` / ``abs_k_max`` (quantiles of |k|). When ``frac_nonzero`` is 0 the
    sparse step never fired and PAP acted as iterated attention (docs/method.md).
    """
    return sparse_term_activity(state.sparse, state.tau, keys, valid)


def sparse_term_activity(sparse: Tensor, tau: Tensor, keys: Tensor, valid: Optional[Tensor] = None) -> Dict[str, float]:
    """:func:`sparse_activity` from the sparse term S and the threshold tau themselves (for callers
    that hold them without a :class:`PAPState`, such as the analysis captures). Computed in the
    keys' precision (float32 at least)."""
    with torch.no_grad():
        dtype = torch.promote_types(keys.dtype, torch.float32)
        sparse, keys = sparse.detach().to(dtype), keys.detach().to(dtype)
        rows = torch.ones(keys.shape[:3], dtype=torch.bool, device=keys.device)
        if valid is not None:
            rows = rows & (valid[:, None, :] if valid.dim() == 2 else valid).to(keys.device)
        nonzero = (sparse != 0) & rows[..., None]
        k_valid = keys[rows]                      # (tokens, d)
        mags = k_valid.abs().flatten()
        if mags.numel() > 1 << 24:  # torch.quantile's input limit: a fixed-seed sample, global RNG untouched
            pick = torch.randperm(mags.numel(), generator=torch.Generator().manual_seed(0))[: 1 << 24]
            sample = mags[pick.to(mags.device)]
        else:
            sample = mags
        tau = tau.detach().to(dtype).expand(*keys.shape[:3], 1)[rows]
        return {
            "frac_nonzero": float(nonzero.sum()) / max(int(rows.sum()) * keys.shape[-1], 1),
            "frac_rows_nonzero": float(nonzero.any(dim=-1).sum()) / max(int(rows.sum()), 1),
            "s_over_k": float(sparse[rows].norm() / k_valid.norm().clamp_min(1e-12)),
            "tau_mean": float(tau.mean()),
            "tau_max": float(tau.max()),
            "abs_k_median": float(sample.median()),
            "abs_k_p99": float(torch.quantile(sample, 0.99)),
            "abs_k_max": float(mags.max()),
        }


# The return type follows return_state (for type checkers): the output alone, or (output, PAPState). The
# defaults are written once, on the definition below; the overloads say only that each argument has one.
@overload
def pap_attention(
    k: Tensor, v: Tensor, *, n_iter: int = ..., lambd: float = ..., attn_mask: Optional[Tensor] = ...,
    is_causal: bool = ..., dropout_p: float = ..., scale: Optional[float] = ..., model_dim: Optional[int] = ...,
    threshold: str = ..., mu_mode: Optional[str] = ..., tol: Optional[float] = ...,
    lowrank: str = ..., shrink: str = ..., dual_step: float = ..., row_lambd: Optional[float] = ...,
    return_state: Literal[False] = ..., fused: bool = ..., checkpoint_iters: bool = ...,
) -> Tensor: ...


@overload
def pap_attention(
    k: Tensor, v: Tensor, *, n_iter: int = ..., lambd: float = ..., attn_mask: Optional[Tensor] = ...,
    is_causal: bool = ..., dropout_p: float = ..., scale: Optional[float] = ..., model_dim: Optional[int] = ...,
    threshold: str = ..., mu_mode: Optional[str] = ..., tol: Optional[float] = ...,
    lowrank: str = ..., shrink: str = ..., dual_step: float = ..., row_lambd: Optional[float] = ...,
    return_state: Literal[True], fused: bool = ..., checkpoint_iters: bool = ...,
) -> Tuple[Tensor, PAPState]: ...


@overload
def pap_attention(
    k: Tensor, v: Tensor, *, n_iter: int = ..., lambd: float = ..., attn_mask: Optional[Tensor] = ...,
    is_causal: bool = ..., dropout_p: float = ..., scale: Optional[float] = ..., model_dim: Optional[int] = ...,
    threshold: str = ..., mu_mode: Optional[str] = ..., tol: Optional[float] = ...,
    lowrank: str = ..., shrink: str = ..., dual_step: float = ..., row_lambd: Optional[float] = ...,
    return_state: bool = ..., fused: bool = ..., checkpoint_iters: bool = ...,
) -> Union[Tensor, Tuple[Tensor, PAPState]]: ...


def pap_attention(
    k: Tensor, v: Tensor, *, n_iter: int = 6, lambd: float = 4.0, attn_mask: Optional[Tensor] = None,
    is_causal: bool = False, dropout_p: float = 0.0, scale: Optional[float] = None, model_dim: Optional[int] = None,
    threshold: str = "lambda_mu", mu_mode: Optional[str] = None, tol: Optional[float] = None,
    lowrank: str = "values", shrink: str = "soft", dual_step: float = 1.0, row_lambd: Optional[float] = None,
    return_state: bool = False, fused: bool = True, checkpoint_iters: bool = False,
) -> Union[Tensor, Tuple[Tensor, PAPState]]:
    """Principal Attention Pursuit: robust symmetric attention (the loop in the module docstring).

    Args:
        k, v: keys and values ``(B, H, N, d)``; PAP needs ``d_v == d_k``.
        n_iter: softmax evaluations in the layer (``n_iter - 1`` ADMM passes plus the final one).
            ``n_iter=1`` is symmetric attention on ``clamp(k, -tau, tau)``.
        lambd: sparsity weight lambda (official experiments: 4). ``inf`` makes S = 0 (for ``n_iter=1``
            plain symmetric attention); 0 is degenerate (uniform attention) but allowed; negative raises.
        attn_mask: bool (True = may attend) or additive float mask broadcastable to (B, H, N, N).
            Keys no query may attend to (padding) take no part in attention, in mu or in N.
        is_causal: apply a causal mask in every iteration (and default to the causal mu).
        dropout_p: attention dropout, applied in the final attention only (as the official code).
        scale: softmax scale, default ``1/sqrt(d)``.
        model_dim: the width C in mu = N C / (4 sum|k|); default ``heads * head_dim``.
        threshold: how tau is set: ``"lambda_mu"`` (official, tau = lambd * mu), ``"lambda_over_mu"``
            (classic PCP), ``"candes"`` (tau = lambd / (sqrt(max(N, d)) mu); lambd = 1 is the
            Candes et al. default weight), ``"target_fraction"`` (lambd in (0, 1) is the fraction of
            key entries the first pass shrinks: tau is that quantile of |k| per (batch, head); not
            for causal layers) or ``"mad"`` (tau = lambd * 1.4826 * MAD of the keys per (batch, head),
            lambd a robust z-score; not for causal layers).
        mu_mode: ``"global"`` (official), ``"causal"`` (mu_i = i C / (4 sum_{j<=i} ||k_j||_1)),
            ``"head_dim"`` / ``"causal_head_dim"`` (d instead of C). Default: ``"causal"`` when
            ``is_causal`` else ``"global"``. A global mode with ``is_causal`` raises: it would leak
            future tokens into past outputs.
        tol: stop the ADMM passes early when ``||S_t - S_{t-1}|| / ||S_{t-1}||`` falls below it
            (an inference option; the final pass always runs).
        lowrank: ``"values"`` (official: L = softmax(s K2 K2^T) v) or ``"keys"`` (L = softmax(s K2 K2^T)
            K2, started at the per-feature median of the keys; then d_v may differ from d_k).
        shrink: ``"soft"`` (official) or ``"hard"`` (S takes an entry whole where it exceeds tau).
        dual_step: the dual update ``Y += dual_step * mu * (k - L - S)`` (official: 1; 0 keeps Y = 0,
            so the final keys are ``k - S``).
        row_lambd: the token rule (:func:`outlier_rows`): None (off) or a robust z-score; a token whose
            key row is that far out puts its whole row into S in every pass (not for causal layers).
            Options beyond the official loop (docs/method.md#robust-variants) run :func:`pap_loop`,
            or :mod:`~rpc_attention.functional.pap_robust` for hard shrinkage with a dual step of 0.
        return_state: also return a :class:`PAPState` (S, L, Y, mu, ...).
        fused: run each attention on ``scaled_dot_product_attention`` (O(N d) memory) with the fused
            passes of :mod:`~rpc_attention.functional.pap_fused`; ``False`` runs :func:`pap_loop`
            with the N x N matrix materialised.
        checkpoint_iters: keep less for the backward pass and recompute each pass's attention
            there (one extra attention forward per pass). Same outputs and gradients.
    """
    problem = prepare_pap(k, v, n_iter=n_iter, lambd=lambd, attn_mask=attn_mask, is_causal=is_causal,
                          scale=scale, model_dim=model_dim, threshold=threshold, mu_mode=mu_mode, tol=tol,
                          lowrank=lowrank, shrink=shrink, dual_step=dual_step, row_lambd=row_lambd)
    dropout_p, tol = check_dropout(dropout_p), None if tol is None else float(tol)
    if fused and not return_state:
        out = _fast_path(problem, v, n_iter, bool(is_causal), dropout_p, tol, bool(checkpoint_iters))
        if out is not None:
            return out
    out, state = pap_loop(problem, v, n_iter=n_iter, is_causal=is_causal, dropout_p=dropout_p, tol=tol,
                          fused=fused, checkpoint_iters=bool(checkpoint_iters))
    return (cast(Tensor, out), state) if return_state else cast(Tensor, out)  # pap_loop ran its final attention


def _fast_path(problem: PAPProblem, v: Tensor, n_iter: int, is_causal: bool, dropout_p: float,
               tol: Optional[float], checkpoint_iters: bool) -> Optional[Tensor]:
    """PAP's output on a fast path beside the loop when one applies, else None: the fused passes of
    :mod:`.pap_fused` (the official options) or the dual-free passes of :mod:`.pap_robust`."""
    if not problem.robust and not torch.compiler.is_compiling():
        options = FusedPAPOptions(n_iter=n_iter, is_causal=is_causal, dropout_p=dropout_p, scale=problem.scale,
                                  tol=tol, checkpoint_iters=checkpoint_iters)
        return fused_pap(problem.keys, v, problem.tau, problem.mask, options)
    if tol is None and not checkpoint_iters and dual_free(problem.shrink, problem.dual_step, n_iter):
        return dual_free_pap(problem.keys, v, problem.tau, problem.start, problem.rows, problem.mask, n_iter=n_iter,
                             in_keys=problem.lowrank == "keys", is_causal=is_causal, dropout_p=dropout_p,
                             scale=problem.scale, fused=True)
    return None


# pap_decompose takes pap_attention's options: the same keywords mean the same thing in both, and
# both go through prepare_pap.
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
    lowrank: str = "values",
    shrink: str = "soft",
    dual_step: float = 1.0,
    row_lambd: Optional[float] = None,
    fused: bool = True,
) -> PAPState:
    """PAP's decomposition without its final attention: the :class:`PAPState` that
    ``pap_attention(..., return_state=True)`` returns, one softmax evaluation cheaper.

    For callers that use S (or the cleaned keys) in an attention of their own, such as the
    asymmetric extension in :mod:`rpc_attention.integrations` or the analysis tools. Options as
    :func:`pap_attention`; ``n_iter_run`` counts the final pass as if it had run, so the state
    equals ``pap_attention``'s for the same options. Differentiable (plain autograd).
    """
    problem = prepare_pap(k, v, n_iter=n_iter, lambd=lambd, attn_mask=attn_mask, is_causal=is_causal,
                          scale=scale, model_dim=model_dim, threshold=threshold, mu_mode=mu_mode, tol=tol,
                          lowrank=lowrank, shrink=shrink, dual_step=dual_step, row_lambd=row_lambd,
                          where="pap_decompose")
    return pap_loop(problem, v, n_iter=n_iter, is_causal=is_causal, tol=None if tol is None else float(tol),
                    fused=fused, final_attention=False)[1]
