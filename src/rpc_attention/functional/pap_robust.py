"""The fast path of PAP's dual-free robust options: the same passes as
:func:`rpc_attention.functional.pap.pap_loop` when the dual never moves, in fewer operations.

When it applies. ``shrink="hard"`` and either ``dual_step=0`` or ``n_iter=1`` (no pass updates the
dual): the options of the robust variants (docs/method.md#robust-variants), any threshold rule, key-
or value-space ``L``, with or without the token rule ``rows``.

Derivation. The dual update is ``Y_t = Y_{t-1} + dual_step mu (k - L_t - S_t)``, so with
``dual_step = 0`` (or no update at all) ``Y = 0`` in every pass and ``mu`` enters the passes only
through ``tau``, which the caller computes once (:func:`~.pap.prepare_pap`). With hard shrinkage
``S_t = x_t [|x_t| > tau]`` (and ``S_t = x_t`` on the token rule's rows), ``x_t = k - L_{t-1}``, so::

    hit_t = |k - L_{t-1}| > tau  or  row flagged
    K2_t  = k - S_t = where(hit_t, L_{t-1}, k)          (L_0 = the per-feature median, or 0)
    L_t   = attention(K2_t, K2_t, K2_t or v)             out = attention(K2_n, K2_n, v)

Four elementwise operations per pass instead of the loop's ten, and no ``mu`` arithmetic. In real
arithmetic ``k - (k - L) = L``; in floating point the two differ by one rounding of ``L``, below any
tolerance of the float64 comparison. Gradients: the definition's indicator ``[|x| > tau]`` has no
gradient (nor, therefore, has tau), and ``where`` routes ``dK2`` to ``L_{t-1}`` on ``hit_t`` and to
``k`` elsewhere, the derivative of ``k - x [|x| > tau]`` with ``x = k - L``; so plain autograd through
these operations is the definition's backward and nothing hand-written pays here (each pass keeps
one bool mask beside the attention's own saved tensors).
``tests/functional/test_pap_robust.py`` holds this path to :func:`~.pap.pap_loop`, values and gradients.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .attention import attend

__all__ = ["dual_free", "dual_free_pap"]


def dual_free(shrink: str, dual_step: float, n_iter: int) -> bool:
    """True when the options keep the dual at 0 with hard shrinkage (this module's path applies)."""
    return shrink == "hard" and (dual_step == 0.0 or n_iter == 1)


def dual_free_pap(keys: Tensor, v: Tensor, tau: Tensor, start: Optional[Tensor], rows: Optional[Tensor],
                  mask: Optional[Tensor], *, n_iter: int, in_keys: bool, is_causal: bool, dropout_p: float,
                  scale: float, fused: bool) -> Tensor:
    """PAP's output for dual-free hard shrinkage (see the module docstring).

    Args:
        keys: k in the compute dtype; v: the values; tau: the threshold (broadcasts against k).
        start: L_0 (the per-feature median, ``lowrank="keys"``) or None (0).
        rows: bool ``(B, H, N, 1)`` of the token rule, or None.
        mask: bool attention mask or None; n_iter: softmax evaluations; in_keys: ``lowrank="keys"``.
        is_causal, dropout_p (final attention only), scale, fused: as :func:`~.pap.pap_attention`.
    """
    lowrank = start
    for t in range(n_iter):
        hit = (keys.abs() if lowrank is None else (keys - lowrank).abs()) > tau
        if rows is not None:
            hit = hit | rows
        keys2 = torch.where(hit, 0.0 if lowrank is None else lowrank, keys).to(v.dtype)
        if t == n_iter - 1:
            return attend(keys2, keys2, v, mask, is_causal, dropout_p, scale, fused)
        lowrank = attend(keys2, keys2, keys2 if in_keys else v, mask, is_causal, 0.0, scale, fused).to(keys.dtype)
    raise ValueError(f"n_iter must be >= 1, got {n_iter}")  # unreachable: the options are checked first
