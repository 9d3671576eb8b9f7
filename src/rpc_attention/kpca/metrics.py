"""Kernel-PCA metrics of one attention layer (docs/method.md#kernel-pca-view-of-attention), in float64, batched over heads.

Every function takes per-example tensors shaped ``(H, N, d)`` (heads, tokens, head dim); callers
loop over examples (the Gram analysis is per example by definition). Conventions:

* kernel ``k(x, y) = exp(s x.y)``, normaliser ``g(x) = sum_j k(x, k_j)`` over the keys the query may
  attend to, feature map ``varphi(x) = phi(x) / g(x)``;
* ``||varphi(q_i)||^2 = exp(s q_i.q_i) / g(q_i)^2``, always handled as its logarithm
  ``s q_i.q_i - 2 logsumexp_j(s q_i.k_j)``;
* ``K_phi[i, j] = k(k_i, k_j) / (g(k_i) g(k_j))``, centred ``K_c = H K_phi H`` with ``H = I - 1_N``;
  ``K_c a_d = N lambda_d a_d``; gamma = ``K_c a / (a N)`` (lambda_d for a true eigenvector);
* the KPCA value matrix ``V_hat = G A - G 1_N A`` with ``G = diag(1 / g(k_j))`` and ``A`` the top-Dv
  eigenvectors of ``K_c``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["standardize_tokens", "log_feature_norms", "official_log_phi2", "projection_loss",
           "per_token_relative_errors", "centred_gram", "EIG_RANKS", "EIG_SIGNS", "gram_eigen", "canonical_signs",
           "kpca_values", "recover_a_hat", "gamma_ratios", "pairwise_abs_diff_stats", "pairwise_rel_diff_stats",
           "gamma_stats", "direct_cosine", "optimal_cosine", "linear_cka", "rbf_cka", "alignment_metrics",
           "random_alignment_baseline"]

_NEG_INF = float("-inf")


def standardize_tokens(x: Tensor, eps: float = 0.0) -> Tensor:
    """Per-token standardisation over the head dimension: ``(x - mean) / (std + eps)`` with the
    unbiased std (``torch.std``'s default, ddof = 1).

    The official KPCA code (``Reconstruction/softmax.py``) applies it to q and k inside attention with
    no eps (the ``paper`` protocol, docs/analysis.md#protocols); the reproduction study's scripts use
    ``eps = 1e-8`` where they standardise.
    """
    mean = x.mean(dim=-1, keepdim=True)
    std = x.std(dim=-1, keepdim=True, unbiased=True)
    return (x - mean) / (std + eps)


def _scores_mask(n_q: int, n_k: int, causal: bool, key_valid: Optional[Tensor], device,
                 mask: Optional[Tensor] = None) -> Optional[Tensor]:
    """Bool mask broadcastable to (H, N_q, N_k), True = may attend, or None."""
    if mask is not None:
        mask = mask.to(device=device, dtype=torch.bool)
    if causal:
        causal_mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)
        mask = causal_mask if mask is None else (mask & causal_mask)
    if key_valid is not None:
        kv = key_valid.to(torch.bool).reshape(1, n_k)
        mask = kv.expand(n_q, n_k) if mask is None else (mask & kv)
    return mask


def log_feature_norms(
    q: Tensor, k: Tensor, v: Tensor, scale: float, *, causal: bool = False,
    key_valid: Optional[Tensor] = None, mask: Optional[Tensor] = None,
) -> Dict[str, Tensor]:
    """Per-token logs of the two J_proj terms.

    Args:
        q, k, v: ``(H, N, d)`` (v may have another last dim); computed in float64.
        scale: softmax scale s.
        causal: query i sees keys j <= i only (g and h both respect it).
        key_valid: optional ``(N,)`` bool, False for padding keys.
        mask: optional general bool mask broadcastable to ``(H, N, N)`` (True = may attend).

    Returns:
        ``log_phi2`` ``(H, N)``: log ||varphi(q_i)||^2; ``log_h2`` ``(H, N)``: log ||h_i||^2 with
        ``h_i = sum_j softmax(s q_i.k_j) v_j``; ``h`` ``(H, N, dv)``; ``log_g`` ``(H, N)``.
    """
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    mask = _scores_mask(q.shape[-2], k.shape[-2], causal, key_valid, q.device, mask)
    if mask is not None:
        scores = scores.masked_fill(~mask, _NEG_INF)
    log_g = torch.logsumexp(scores, dim=-1)  # (H, N)
    log_phi2 = scale * (q * q).sum(-1) - 2.0 * log_g
    weights = torch.exp(scores - log_g.unsqueeze(-1))
    weights = torch.nan_to_num(weights, nan=0.0)
    h = torch.matmul(weights, v)
    h2 = (h * h).sum(-1)
    log_h2 = torch.log(h2)  # -inf for an exactly zero output, never overflows
    return {"log_phi2": log_phi2, "log_h2": log_h2, "h": h, "log_g": log_g}


def official_log_phi2(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """Log of the official code's ``||varphi(q_i)||^2`` per token, ``(H, N)`` float64: it computes
    ``exp(q.q) / exp(2 q.k_0 - log(attn_0^2))`` with the attention ``attn = softmax(s q.k)`` but the
    numerator and ``q.k_0`` unscaled, i.e. ``q.q - 2 (1 - s) q.k_0 - 2 logsumexp_j(s q.k_j)`` (equal to
    :func:`log_feature_norms`'s ``log_phi2`` only when s = 1). Key 0 must be visible to every query
    (no causal mask; the official code is a ViT)."""
    q, k = q.double(), k.double()
    qk = torch.matmul(q, k.transpose(-2, -1))
    return (q * q).sum(-1) - 2.0 * (1.0 - scale) * qk[..., 0] - 2.0 * torch.logsumexp(scale * qk, dim=-1)


def _log_mean_exp(x: Tensor, dim: int) -> Tensor:
    return torch.logsumexp(x, dim=dim) - math.log(x.shape[dim])


def projection_loss(
    q: Tensor, k: Tensor, v: Tensor, scale: float, *, causal: bool = False,
    key_valid: Optional[Tensor] = None, query_valid: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
) -> Dict[str, Tensor]:
    """``J_proj = (1/N) sum_i ||varphi(q_i)||^2 - ||h_i||^2`` per head, with its two terms.

    Returns per-head ``(H,)`` float64 tensors: ``jproj``, ``phi2`` (mean ||varphi(q)||^2), ``h2``
    (mean ||h||^2), ``log_phi2``/``log_h2`` (logs of those means, computed by logsumexp so they are
    finite even where the means themselves would overflow); and the per-token logs of the valid
    queries, ``token_log_phi2``/``token_log_h2`` ``(H, N_valid)``.
    """
    terms = log_feature_norms(q, k, v, scale, causal=causal, key_valid=key_valid, mask=mask)
    lp, lh = terms["log_phi2"], terms["log_h2"]
    if query_valid is not None:
        sel = query_valid.to(torch.bool)
        lp, lh = lp[:, sel], lh[:, sel]
    log_phi2 = _log_mean_exp(lp, -1)
    log_h2 = _log_mean_exp(lh, -1)
    phi2, h2 = torch.exp(log_phi2), torch.exp(log_h2)
    return {"jproj": phi2 - h2, "phi2": phi2, "h2": h2, "log_phi2": log_phi2, "log_h2": log_h2,
            "token_log_phi2": lp, "token_log_h2": lh}


def per_token_relative_errors(log_phi2: Tensor, log_h2: Tensor, eps: float = 1e-8) -> Dict[str, Tensor]:
    """The reproduction study's training-time relative errors (its ``Reconstruction/softmax.py``), per
    token: ``|phi2 - h2| / (h2 + eps)`` and ``|phi2 - h2| / (phi2 + eps)`` from the per-token logs of
    ||varphi(q_i)||^2 and ||h_i||^2 (same shape out; inf where phi2 overflows float64)."""
    phi2, h2 = torch.exp(log_phi2.double()), torch.exp(log_h2.double())
    err = (phi2 - h2).abs()
    return {"wrt_h2": err / (h2 + eps), "wrt_phi2": err / (phi2 + eps)}


def centred_gram(k: Tensor, scale: float) -> Dict[str, Tensor]:
    """Normalised key Gram matrix and its centred version, ``(H, N, N)`` float64.

    ``K_phi[i, j] = exp(s k_i.k_j - log g(k_i) - log g(k_j))`` (every entry <= 1, no overflow) and
    ``K_c = K_phi - 1_N K_phi - K_phi 1_N + 1_N K_phi 1_N``. Also returns ``log_g`` ``(H, N)``.
    """
    k = k.double()
    scores = torch.matmul(k, k.transpose(-2, -1)) * scale
    log_g = torch.logsumexp(scores, dim=-1)
    k_phi = torch.exp(scores - log_g.unsqueeze(-1) - log_g.unsqueeze(-2))
    row = k_phi.mean(dim=-1, keepdim=True)
    col = k_phi.mean(dim=-2, keepdim=True)
    tot = k_phi.mean(dim=(-2, -1), keepdim=True)
    k_c = k_phi - row - col + tot
    k_c = 0.5 * (k_c + k_c.transpose(-2, -1))  # exact symmetry for eigh
    return {"k_phi": k_phi, "k_c": k_c, "log_g": log_g}


EIG_RANKS = ("value", "magnitude")
EIG_SIGNS = ("eigh", "canonical")


def gram_eigen(k_c: Tensor, n_axes: int, rank: str = "value") -> Dict[str, Tensor]:
    """Top ``n_axes`` eigenpairs of ``K_c``. ``rank="value"``: the largest eigenvalues (descending; the
    principal axes, as the study's ``eigenvalues.py`` and ``gammas.py``); ``"magnitude"``: the largest
    |eigenvalue| (its ``value_vectors.py``; differs only where rounding-level negative eigenvalues
    compete with small positive ones). ``eig`` are eigenvalues of ``K_c`` (``= N lambda``),
    ``lam = eig / N``, ``vecs`` ``(H, N, n_axes)`` unit columns with ``torch.linalg.eigh``'s signs."""
    n = k_c.shape[-1]
    if n_axes > n:
        raise ValueError(f"KPCA needs Dv <= N: {n_axes} principal axes requested from {n} tokens")
    if rank not in EIG_RANKS:
        raise ValueError(f"rank must be one of {EIG_RANKS}, got {rank!r}")
    evals, evecs = torch.linalg.eigh(k_c)
    evals, evecs = evals.flip(-1), evecs.flip(-1)  # descending by value
    if rank == "magnitude":
        order = torch.argsort(evals.abs(), dim=-1, descending=True, stable=True)
        evals = torch.gather(evals, -1, order)
        evecs = torch.gather(evecs, -1, order.unsqueeze(-2).expand_as(evecs))
    evals, evecs = evals[..., :n_axes], evecs[..., :n_axes]
    return {"eig": evals, "lam": evals / n, "vecs": evecs}


def canonical_signs(vecs: Tensor) -> Tensor:
    """Each column ``(..., N, D)`` multiplied by the sign that makes its entry of largest magnitude
    positive (the first such entry on a tie): a sign convention that does not depend on the LAPACK
    build, unlike ``eigh``'s arbitrary signs. Neither published code fixes one."""
    idx = vecs.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(torch.gather(vecs, -2, idx))
    return vecs * torch.where(sign == 0, torch.ones_like(sign), sign)


def kpca_values(log_g: Tensor, a: Tensor) -> Tensor:
    """``V_hat = G A - G 1_N A`` with ``G = diag(1/g(k_j))``: ``(H, N, Dv)``."""
    a = a.double()
    centred = a - a.mean(dim=-2, keepdim=True)
    return torch.exp(-log_g).unsqueeze(-1) * centred


def recover_a_hat(log_g: Tensor, v: Tensor) -> Tensor:
    """Invert ``V = G (I - 1_N) A`` up to the centring constant: ``a_hat = (I - 1_N) diag(g) V``."""
    a = torch.exp(log_g).unsqueeze(-1) * v.double()
    return a - a.mean(dim=-2, keepdim=True)


def gamma_ratios(k_c: Tensor, a: Tensor) -> Tensor:
    """``gamma = (K_c a) / (a N)`` elementwise per column, the reproduction study's normalisation
    (``gammas.py``): lambda_d for a true eigenvector, ``K_c a_d = N lambda_d a_d``. ``(H, N, Dv)``
    (inf/NaN where a == 0)."""
    a = a.double()
    return torch.matmul(k_c, a) / (a * k_c.shape[-1])


def pairwise_abs_diff_stats(x: Tensor) -> Dict[str, Tensor]:
    """Mean and std over pairs i < j of ``|x_i - x_j|`` along dim -2, exactly, in O(N log N).

    ``x`` is ``(..., N, D)``; returns ``mean``, ``std`` shaped ``(..., D)``. Uses
    ``sum_{i<j} |x_i - x_j| = sum_r (2r - N + 1) x_(r)`` over the sorted values and
    ``sum_{i<j} (x_i - x_j)^2 = N sum x^2 - (sum x)^2``.
    """
    x = x.double()
    n = x.shape[-2]
    if n < 2:
        raise ValueError("pairwise statistics need at least two tokens")
    pairs = n * (n - 1) / 2.0
    xs, _ = torch.sort(x, dim=-2)
    w = (2.0 * torch.arange(n, dtype=x.dtype, device=x.device) - n + 1.0).reshape(n, 1)
    mean_abs = (w * xs).sum(-2) / pairs
    # centre first for accuracy of the quadratic identity
    xc = x - x.mean(dim=-2, keepdim=True)
    sq = (n * (xc * xc).sum(-2) - xc.sum(-2) ** 2) / pairs
    var = (sq - mean_abs ** 2).clamp_min(0.0) * (pairs / (pairs - 1.0) if pairs > 1 else 0.0)
    return {"mean": mean_abs, "std": var.sqrt()}


def pairwise_rel_diff_stats(x: Tensor, eps: float = 1e-10) -> Dict[str, Tensor]:
    """Mean and std (ddof = 1) over pairs i < j of ``|x_i - x_j| / (max(|x_i|, |x_j|) + eps)`` along
    dim -2, the reproduction study's relative gamma difference (``gammas.py``); ``(..., N, D)`` ->
    ``(..., D)``. O(N^2) memory per column block."""
    x = x.double()
    n = x.shape[-2]
    if n < 2:
        raise ValueError("pairwise statistics need at least two tokens")
    i, j = torch.triu_indices(n, n, offset=1, device=x.device)
    xi, xj = x[..., i, :], x[..., j, :]
    rel = (xi - xj).abs() / (torch.maximum(xi.abs(), xj.abs()) + eps)
    std = rel.std(dim=-2) if rel.shape[-2] > 1 else torch.zeros_like(rel[..., 0, :])
    return {"mean": rel.mean(dim=-2), "std": std}


def gamma_stats(k_c: Tensor, a: Tensor) -> Dict[str, Tensor]:
    """Pair statistics of gamma per head and axis, ``(H, Dv)``; axes where some gamma is not finite
    (an exact zero in ``a``) come back as NaN and ``n_nonfinite`` counts them."""
    gam = gamma_ratios(k_c, a)
    finite = torch.isfinite(gam).all(dim=-2)
    clean = torch.where(torch.isfinite(gam), gam, torch.zeros_like(gam))
    stats = pairwise_abs_diff_stats(clean)
    rel = pairwise_rel_diff_stats(clean)
    nan = torch.full_like(stats["mean"], float("nan"))
    return {
        "mean": torch.where(finite, stats["mean"], nan),
        "std": torch.where(finite, stats["std"], nan),
        "rel_mean": torch.where(finite, rel["mean"], nan),
        "n_nonfinite": int((~finite).sum()),
    }


# ---------------------------------------------------------------- alignment (reproduction study)

def _row_normalise(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)


def direct_cosine(x: Tensor, y: Tensor) -> Tensor:
    """Mean over tokens of the row cosine between ``x`` and ``y`` (``(..., N, D)`` -> ``(...)``)."""
    return (_row_normalise(x.double()) * _row_normalise(y.double())).sum(-1).mean(-1)


def optimal_cosine(x: Tensor, y: Tensor) -> float:
    """Mean cosine of the one-to-one matching of rows of ``x`` to rows of ``y`` maximising the summed
    cosine (Hungarian algorithm, scipy ``linear_sum_assignment``). ``x``, ``y``: ``(N, D)``."""
    from scipy.optimize import linear_sum_assignment

    c = (_row_normalise(x.double()) @ _row_normalise(y.double()).T).cpu().numpy()
    r, col = linear_sum_assignment(c, maximize=True)
    return float(c[r, col].mean())


def _centre_rows(x: Tensor) -> Tensor:
    return x - x.mean(dim=-2, keepdim=True)


def linear_cka(x: Tensor, y: Tensor) -> Tensor:
    """Linear CKA with tokens as samples: ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``."""
    xc, yc = _centre_rows(x.double()), _centre_rows(y.double())
    num = torch.linalg.matrix_norm(yc.transpose(-2, -1) @ xc) ** 2
    den = torch.linalg.matrix_norm(xc.transpose(-2, -1) @ xc) * torch.linalg.matrix_norm(yc.transpose(-2, -1) @ yc)
    return num / den


def _rbf_kernel(x: Tensor) -> Tensor:
    """Gaussian kernel with sigma = sqrt(median of the non-zero squared distances) of this matrix."""
    x = x.double()
    sq = (x * x).sum(-1)
    d2 = (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * x @ x.transpose(-2, -1)).clamp_min(0.0)
    d2 = d2 * (1.0 - torch.eye(d2.shape[-1], dtype=d2.dtype, device=d2.device))  # exact zero diagonal
    # "non-zero" up to the rounding of the Gram-based distance (identical rows give ~1e-16, not 0)
    nz = d2[d2 > 1e-12 * float(d2.max().clamp_min(1e-300))]
    # numpy's median (mean of the two middle values for an even count), not torch's lower median
    sigma2 = float(np.median(nz.cpu().numpy())) if nz.numel() else 1.0
    return torch.exp(-d2 / (2.0 * sigma2))


def _hsic(kx: Tensor, ky: Tensor) -> Tensor:
    n = kx.shape[-1]
    h = torch.eye(n, dtype=kx.dtype, device=kx.device) - 1.0 / n
    return torch.trace(h @ kx @ h @ ky)


def rbf_cka(x: Tensor, y: Tensor) -> Tensor:
    """Kernel CKA with RBF kernels (sigma per matrix, see :func:`_rbf_kernel`); ``(N, D)`` inputs."""
    kx, ky = _rbf_kernel(x), _rbf_kernel(y)
    return _hsic(kx, ky) / torch.sqrt(_hsic(kx, kx) * _hsic(ky, ky))


def alignment_metrics(v: Tensor, v_hat: Tensor) -> Dict[str, Tensor]:
    """The four reproduction-study metrics per head: ``v``, ``v_hat`` ``(H, N, Dv)`` -> ``(H,)`` each."""
    heads = v.shape[0]
    out = {
        "direct_cosine": direct_cosine(v, v_hat),
        "optimal_cosine": torch.tensor([optimal_cosine(v[h], v_hat[h]) for h in range(heads)], dtype=torch.float64),
        "linear_cka": torch.stack([linear_cka(v[h], v_hat[h]) for h in range(heads)]),
        "rbf_cka": torch.stack([rbf_cka(v[h], v_hat[h]) for h in range(heads)]),
    }
    return {k: t.cpu() for k, t in out.items()}


def random_alignment_baseline(n: int, d: int, draws: int = 8, seed: int = 0) -> Dict[str, Dict[str, float]]:
    """Chance level: the four metrics between independent standard Gaussian ``(n, d)`` matrices.

    Returns ``{metric: {"mean": .., "std": ..}}`` over ``draws`` pairs (seeded, CPU float64).
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(draws, n, d, generator=gen, dtype=torch.float64)
    y = torch.randn(draws, n, d, generator=gen, dtype=torch.float64)
    m = alignment_metrics(x, y)
    return {k: {"mean": float(t.mean()), "std": float(t.std(unbiased=False))} for k, t in m.items()}
