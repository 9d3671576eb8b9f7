"""Cached decoding for causal PAP: a per-pass cache of cleaned keys.

Under the causal mu everything PAP computes at position ``i`` (mu_i, tau_i and, in every pass t,
S_i, K2_i, L_i and Y_i) depends only on positions ``<= i``: mu_i is a prefix sum, shrinkage and
the dual update act row by row, and the attention of pass t at row i reads the cleaned keys
K2_t of rows ``<= i`` only (causal mask). So a new position needs, of the past, only

- per pass t = 1 .. n_iter: the cleaned keys K2_t of every cached position (the keys of pass t's
  attention), and the values;
- the running sum of the valid ``|k|`` rows and their count (mu of the new rows).

A decoding step then runs the n_iter passes on the new rows alone (``pass_keys`` / ``pass_dual``
of :mod:`.pap`, the definition's row-wise lines) and each pass's attention as the new K2 rows
attending to the cached K2_t rows plus themselves: n_iter single-query attentions, O(n_iter t d)
per token and head instead of re-running PAP over the prefix (O(n_iter t^2 d)).

Memory per PAP layer: ``n_iter`` tensors K2_t of shape (B, H, T, d) in the values' dtype (the
caller keeps the value cache, as for plain attention), two (B, H, 1, 1) running sums in the
compute dtype and, with padding, a (B, 1, 1, T) bool key mask. The raw keys need not be kept.
Without autograd the K2 tensors grow in place inside buffers with room for about half as many
positions again (:func:`append_rows`), so a step does not copy the whole cache; ``nbytes`` counts
the allocated buffers.

What cannot be cached exactly is refused: a global mu (a new token changes mu, hence every past
row) and ``tol`` (a sequence-wide stopping rule). ``threshold="target_fraction"`` is refused for
causal layers already (a quantile over the whole sequence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .attention import attend, check_kv, check_tensors, resolve_scale
from .pap import (
    CAUSAL_MU_MODES,
    PAPState,
    check_pap_options,
    mu_from_sums,
    pap_loop,
    pass_dual,
    pass_keys,
    prepare_pap,
    threshold_of,
)

__all__ = ["append_rows", "PAPCache", "pap_prefill"]

_GROWTH, _CHUNK = 1.5, 64


def append_rows(buffer: Tensor, length: int, new: Tensor) -> Tensor:
    """``buffer[..., :length, :]`` followed by ``new`` along the position dimension (-2).

    Returns a tensor whose first ``length + n`` rows are the result (slice it to that length). Under
    autograd this is ``torch.cat``; otherwise the rows are written in place into ``buffer`` when it
    has room, else into a new buffer with room for ``_GROWTH`` times as many positions (rounded up
    to ``_CHUNK``), so that appending one row costs O(row) amortised instead of O(cache)."""
    n = new.shape[-2]
    if torch.is_grad_enabled() and (new.requires_grad or buffer.requires_grad):
        return torch.cat([buffer[..., :length, :], new], dim=-2)
    if buffer.shape[-2] < length + n or buffer.shape[:-2] != new.shape[:-2] or buffer.dtype != new.dtype:
        cap = -(-int(_GROWTH * (length + n)) // _CHUNK) * _CHUNK
        grown = new.new_empty(*new.shape[:-2], cap, new.shape[-1])
        grown[..., :length, :] = buffer[..., :length, :]
        buffer = grown
    buffer[..., length:length + n, :] = new
    return buffer


@dataclass
class PAPCache:
    """The state one causal PAP layer keeps between decoding steps (see the module docstring).

    Made by :func:`pap_prefill`; :meth:`step` appends new positions and returns their output.
    ``keys2[t][..., :length, :]`` is K2 of pass t+1 for every cached position (the buffer may
    have room for more, see :func:`append_rows`), ``abs_sum`` / ``count`` the running
    sum of valid ``|k|`` rows and their number per (batch, head), ``key_valid`` the (B, 1, 1, T)
    mask of keys that take part (None: all of them).
    """

    n_iter: int
    lambd: float
    threshold: str
    width: int
    scale: float
    keys2: List[Tensor]
    abs_sum: Tensor
    count: Tensor
    length: int
    key_valid: Optional[Tensor] = None
    shrink: str = "soft"
    dual_step: float = 1.0

    def nbytes(self) -> int:
        """Bytes held by the cache (the caller's value cache not included)."""
        tensors = [*self.keys2, self.abs_sum, self.count]
        if self.key_valid is not None:
            tensors.append(self.key_valid)
        return sum(t.numel() * t.element_size() for t in tensors)

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place (beam search: ``index`` names the source row of each new row)."""
        def pick(t: Tensor) -> Tensor:
            return t.index_select(0, index.to(t.device))

        self.keys2 = [pick(t[..., :self.length, :]) for t in self.keys2]
        self.abs_sum, self.count = pick(self.abs_sum), pick(self.count)
        if self.key_valid is not None:
            self.key_valid = pick(self.key_valid)

    def _new_rows_mu(self, keys: Tensor, valid: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """mu and tau of the new rows from the running sums, which it advances."""
        abs_rows = keys.abs().sum(dim=-1, keepdim=True)  # (B, H, n, 1)
        counts = torch.ones_like(abs_rows)
        if valid is not None:
            validf = valid.to(abs_rows.dtype)
            abs_rows, counts = abs_rows * validf, counts * validf
        denom = self.abs_sum + abs_rows.cumsum(dim=-2)
        total = self.count + counts.cumsum(dim=-2)
        self.abs_sum, self.count = denom[..., -1:, :], total[..., -1:, :]
        mu, count = mu_from_sums(denom, total, self.width)
        return mu, threshold_of(self.threshold, self.lambd, mu, count, keys, None)

    def _key_mask(self, b: int, n: int, valid_new: Optional[Tensor], device) -> Optional[Tensor]:
        """Append the new keys' validity; the (B, 1 or H, 1, T) mask of every cached key, or None."""
        if self.key_valid is None and (valid_new is None or bool(valid_new.all())):
            return None  # every key takes part: no mask (the fast unmasked attention)
        old = (self.key_valid if self.key_valid is not None
               else torch.ones(b, 1, 1, self.length, dtype=torch.bool, device=device))
        hm = old.shape[1]
        new = (torch.ones(b, hm, 1, n, dtype=torch.bool, device=device) if valid_new is None
               else valid_new.reshape(b, 1, 1, n).to(device).expand(b, hm, 1, n))
        self.key_valid = torch.cat([old.expand(b, hm, 1, -1), new], dim=-1)
        return self.key_valid

    def step(self, k: Tensor, v_all: Tensor, *, key_valid: Optional[Tensor] = None, dropout_p: float = 0.0,
             fused: bool = True, final_attention: bool = True) -> Tuple[Optional[Tensor], Tensor, Tensor]:
        """Append new positions and run PAP's passes for them.

        Args:
            k: keys of the new positions ``(B, H, n, d)`` (any n >= 1; one per decoded token).
            v_all: values of every position, cached and new ``(B, H, T + n, d)``.
            key_valid: optional bool ``(B, n)``: False for new positions that are padding.
            dropout_p: dropout of the final attention (as :func:`~.pap.pap_attention`).
            final_attention: False stops after the final pass's K2 (as :func:`~.pap.pap_decompose`);
                the final K2 is then not cached (no later attention reads it).
        Returns ``(out, S, K2)`` of the new rows: the output ``(B, H, n, d)`` (None without the
        final attention), the final pass's sparse term and cleaned keys.
        """
        check_kv(k, v_all[..., -k.shape[-2]:, :], need_same_dim=True)
        check_tensors("PAPCache.step", (("k", k), ("v_all", v_all)))
        b, _, n, _ = k.shape
        if v_all.shape[-2] != self.length + n:
            raise ValueError(f"v_all must hold the {self.length} cached and {n} new positions, "
                             f"got {v_all.shape[-2]}")
        keys = k.to(torch.promote_types(k.dtype, torch.float32))
        valid = None if key_valid is None else key_valid.reshape(b, 1, n, 1).to(k.device)
        mu, tau = self._new_rows_mu(keys, valid)
        mask = self._key_mask(b, n, key_valid, k.device)
        old, self.length = self.length, self.length + n
        lowrank, dual = torch.zeros_like(keys), torch.zeros_like(keys)
        out = None
        n_attend = self.n_iter if final_attention else self.n_iter - 1
        for t in range(self.n_iter):
            sparse, k2 = pass_keys(keys, lowrank, dual, mu, tau, self.shrink)
            k2 = k2.to(v_all.dtype)
            if t == n_attend:
                break
            self.keys2[t] = append_rows(self.keys2[t], old, k2)
            last = t == self.n_iter - 1
            # n = 1 sees every cached key: no causal mask needed; n > 1 needs the end-aligned triangle
            out = attend(k2, self.keys2[t][..., :self.length, :], v_all, mask, n > 1, dropout_p if last else 0.0,
                         self.scale, fused)
            if not last:
                lowrank = out.to(keys.dtype)
                dual = pass_dual(keys, lowrank, sparse, dual, mu, self.dual_step)
        return (out if final_attention else None), sparse, k2


def pap_prefill(k: Tensor, v: Tensor, *, n_iter: int = 6, lambd: float = 4.0, key_valid: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None, scale: Optional[float] = None, model_dim: Optional[int] = None, threshold: str = "lambda_mu",
                mu_mode: Optional[str] = "causal", dropout_p: float = 0.0, fused: bool = True,
                final_attention: bool = True, tol: Optional[float] = None, shrink: str = "soft",
                dual_step: float = 1.0) -> Tuple[Optional[Tensor], PAPState, PAPCache]:
    """Causal PAP over a prompt (the definition, :func:`~.pap.pap_loop`) and the cache to continue it.

    Args:
        k, v: keys and values of the prompt ``(B, H, N, d)``.
        key_valid: optional bool ``(B, N)``: False for padding positions (e.g. left padding), which
            take no part in mu or in any attention (as a key-padding ``attn_mask`` in
            :func:`~.pap.pap_attention`).
        attn_mask: instead of ``key_valid``, a bool mask broadcastable to ``(B, H, N, N)`` as
            :func:`~.pap.pap_attention` takes it (the causal triangle is added); the cache keeps of
            it the keys some query may see, and later positions see every such key before them.
        n_iter, lambd, scale, model_dim, threshold, mu_mode, shrink, dual_step: as
            :func:`~.pap.pap_attention` with ``is_causal=True``; ``mu_mode`` must be causal.
        final_attention: False stops after the final K2 (:func:`~.pap.pap_decompose`).
        tol: accepted only as None: an early stop on a norm over the whole sequence cannot be
            continued position by position (ValueError otherwise).
    Returns ``(out, state, cache)``: PAP's output (None without the final attention), its
    :class:`~.pap.PAPState` and a :class:`PAPCache` holding every pass's cleaned keys.
    """
    if tol is not None:
        raise ValueError(f"tol={tol!r} stops PAP on a norm over the whole sequence, which a decoding cache cannot "
                         "continue position by position; use tol=None for cached decoding")
    mu_mode = check_pap_options(n_iter=n_iter, lambd=lambd, threshold=threshold, mu_mode=mu_mode,
                                is_causal=True, model_dim=model_dim, shrink=shrink, dual_step=dual_step)
    if mu_mode not in CAUSAL_MU_MODES:  # unreachable after the check above; kept for the reader
        raise ValueError(f"a PAP cache needs a causal mu_mode, got {mu_mode!r}")
    b, h, n, d = k.shape
    if key_valid is not None and attn_mask is not None:
        raise ValueError("give key_valid or attn_mask, not both")
    mask = attn_mask if key_valid is None else key_valid.reshape(b, 1, 1, n).to(device=k.device, dtype=torch.bool)
    problem = prepare_pap(k, v, n_iter=n_iter, lambd=lambd, attn_mask=mask, is_causal=True, scale=scale,
                          model_dim=model_dim, threshold=threshold, mu_mode=mu_mode, shrink=shrink,
                          dual_step=dual_step, where="pap_prefill")
    keys2: List[Tensor] = []
    out, state = pap_loop(problem, v, n_iter=n_iter, is_causal=True, dropout_p=dropout_p, fused=fused,
                          final_attention=final_attention, record_keys=keys2)
    if not final_attention:
        keys2 = keys2[:-1]
    valid = None if problem.mask is None else problem.mask.any(dim=-2, keepdim=True)  # (B?, H?, 1, N)
    abs_rows = problem.keys.abs().sum(dim=-1, keepdim=True)
    counts = torch.ones_like(abs_rows)
    if valid is not None:
        validf = valid.transpose(-1, -2).to(abs_rows.dtype)
        abs_rows, counts = abs_rows * validf, (counts * validf).expand_as(abs_rows)
    width = d if mu_mode == "causal_head_dim" else (h * d if model_dim is None else model_dim)
    cache = PAPCache(n_iter=n_iter, lambd=float(lambd), threshold=threshold, width=width,
                     scale=resolve_scale(scale, d), keys2=keys2,
                     abs_sum=abs_rows.cumsum(dim=-2)[..., -1:, :], count=counts.sum(dim=-2, keepdim=True),
                     length=n, key_valid=None if valid is None or bool(valid.all()) else valid.expand(b, valid.shape[1], 1, n),
                     shrink=shrink, dual_step=float(dual_step))
    return out, state, cache
