"""The fused fast path of PAP: the same passes as :func:`rpc_attention.functional.pap.pap_loop`,
rewritten so that each pass costs one fused attention plus a few in-place elementwise updates,
with a hand-written backward that keeps per pass only what the attention kernel saves.

Derivation. Write the scaled dual ``U = Y / mu`` and ``C = clamp(A, -tau, tau)``, so that
``shrink(A, tau) = A - C``. One pass of the definition becomes::

    A_t  = k - L_{t-1} + U_{t-1}          (A_1 = k: L_0 = U_0 = 0)
    C_t  = clamp(A_t, -tau, tau)           S_t = A_t - C_t
    K2_t = k - S_t - U_{t-1}  = L_{t-1} - 2 U_{t-1} + C_t
    L_t  = attention(K2_t)
    U_t  = U_{t-1} + k - L_t - S_t  = L_{t-1} - L_t + C_t

mu now enters only through tau. Backward of one pass, given ``G_L = dLoss/dL_t`` and
``G_U = dLoss/dU_t`` (``G_U = 0`` after the final pass, whose output is the attention itself)::

    gK2 = attention_backward(G_L - G_U)      gC = gK2 + G_U
    gA  = gC * [|A_t| < tau]                 gtau += gC * sign(S_t)
    dk += gA     dL_{t-1} = gC - gA          dU_{t-1} = gA - 2 gK2

The backward therefore needs, per pass, the attention's own saved tensors and ``sign(S_t)``
(one byte per entry in the checkpointed variant, which recomputes the attention instead).
``tests/functional/test_pap_fused.py`` holds this path to the definition, values and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .attention import attend

__all__ = ["FusedPAPOptions", "sparse_converged", "fused_pap"]


@dataclass(frozen=True)
class FusedPAPOptions:
    """Everything but the tensors that the fused passes need."""

    n_iter: int                   # softmax evaluations: n_iter - 1 ADMM passes plus the final one
    is_causal: bool = False
    dropout_p: float = 0.0        # final attention only
    scale: float = 1.0
    tol: Optional[float] = None   # early stop on the relative change of S (inference)
    checkpoint_iters: bool = False


def sparse_converged(new_sparse: Tensor, sparse: Tensor, tol: float) -> bool:
    """``||S_t - S_{t-1}|| / ||S_{t-1}|| < tol`` (the ``tol`` early stop)."""
    new_sparse, sparse = new_sparse.detach(), sparse.detach()
    change = torch.linalg.vector_norm(new_sparse - sparse)
    return float(change / torch.linalg.vector_norm(sparse).clamp_min(1e-12)) < tol


@dataclass
class _Scratch:
    """Buffers reused by every pass: on CPU these elementwise passes are memory bound and a fresh
    allocation costs about as much as the pass itself. A buffer is used only where nothing that
    outlives the pass (the autograd graph, S for ``tol``) refers to it."""

    like: Tensor
    shifted: Optional[Tensor] = None   # A_t
    clamped: Optional[Tensor] = None   # C_t (needed until U_t is formed)
    keys2: Optional[Tensor] = None     # K2_t, only when no backward will read it

    def get(self, name: str) -> Tensor:
        if getattr(self, name) is None:
            setattr(self, name, torch.empty_like(self.like))
        return getattr(self, name)


@dataclass
class _Pass:
    """The quantities of one pass: C_t, K2_t and S_t (S_t only when asked for)."""

    clamped: Tensor
    keys2: Tensor
    sparse: Optional[Tensor]


def _shrink_step(k: Tensor, tau: Tensor, neg_tau: Tensor, lowrank: Optional[Tensor], dual: Optional[Tensor],
                 scratch: _Scratch, want_sparse: bool, keys2_private: bool) -> _Pass:
    """A_t, C_t, K2_t (and S_t = A_t - C_t when ``want_sparse``) from L_{t-1} and U_{t-1}."""
    if lowrank is None:  # t = 1: A_1 = k, K2_1 = C_1
        clamped = torch.maximum(k, neg_tau)
        torch.minimum(clamped, tau, out=clamped)
        return _Pass(clamped, clamped, torch.sub(k, clamped) if want_sparse else None)
    assert dual is not None  # U_{t-1} exists from pass 2 on, as L_{t-1} does
    shifted = torch.sub(k, lowrank, out=None if want_sparse else scratch.get("shifted")).add_(dual)
    clamped = torch.maximum(shifted, neg_tau, out=scratch.get("clamped"))
    torch.minimum(clamped, tau, out=clamped)
    keys2 = torch.add(lowrank, dual, alpha=-2.0, out=None if keys2_private else scratch.get("keys2")).add_(clamped)
    return _Pass(clamped, keys2, shifted.sub_(clamped) if want_sparse else None)


def _run_passes(k: Tensor, v: Tensor, tau: Tensor, mask: Optional[Tensor], opts: FusedPAPOptions,
                record: Optional[str], v_leaf: Optional[Tensor] = None) -> Tuple[Tensor, list]:
    """Run the passes. ``record``: None (values only), ``"graph"`` (keep each attention's autograd
    graph on a detached leaf K2) or ``"ckpt"`` (keep K2 and a 1-byte sign(S) only).
    Returns ``(out, steps)`` with one ``[K2 leaf, attention output or None, sign(S)]`` per pass."""
    need_tol = opts.tol is not None
    scratch = _Scratch(k)
    neg_tau = -tau
    steps: List[list] = []
    # L_{t-1}, U_{t-1}, S_{t-1}; None stands for 0 before pass 1
    lowrank: Optional[Tensor] = None
    dual: Optional[Tensor] = None
    sparse: Optional[Tensor] = None

    def attend_pass(p: _Pass, final: bool) -> Tensor:
        keys2 = p.keys2.to(v.dtype)
        dropout_p = opts.dropout_p if final else 0.0
        sign: Optional[Tensor] = None
        if record is not None:  # S_t is needed afterwards only by tol, and never after the final pass
            assert p.sparse is not None  # want_sparse is set whenever record is
            sign = torch.sign(p.sparse) if need_tol and not final else p.sparse.sign_()
        if record == "graph" or (record == "ckpt" and final):
            assert v_leaf is not None  # _FusedPAPFunction.forward passes it with every record
            leaf = keys2.detach().requires_grad_(True)
            with torch.enable_grad():
                att = attend(leaf, leaf, v_leaf, mask, opts.is_causal, dropout_p, opts.scale, True)
            steps.append([leaf, att, sign])
            return att.detach()
        att = attend(keys2, keys2, v, mask, opts.is_causal, dropout_p, opts.scale, True)
        if record == "ckpt":
            assert sign is not None
            steps.append([keys2, None, sign.to(torch.int8)])
        return att

    n_run = 0
    for _ in range(opts.n_iter - 1):
        p = _shrink_step(k, tau, neg_tau, lowrank, dual, scratch, want_sparse=need_tol or record is not None,
                         keys2_private=record is not None)
        new_sparse = p.sparse if need_tol else None
        new_lowrank = attend_pass(p, final=False).to(k.dtype)
        # U_t = L_{t-1} - L_t + C_t, written into U_{t-1}'s buffer (U_1 = C_1 - L_1)
        dual = torch.sub(p.clamped, new_lowrank) if lowrank is None else \
            torch.sub(lowrank, new_lowrank, out=dual).add_(p.clamped)
        lowrank = new_lowrank
        n_run += 1
        stop = (opts.tol is not None and n_run > 1 and new_sparse is not None and sparse is not None
                and sparse_converged(new_sparse, sparse, opts.tol))
        sparse = new_sparse
        if stop:
            break
    p = _shrink_step(k, tau, neg_tau, lowrank, dual, scratch, want_sparse=record is not None,
                     keys2_private=record is not None)
    return attend_pass(p, final=True), steps


class _FusedPAPFunction(torch.autograd.Function):
    """The fused passes with the hand-written elementwise backward derived in the module docstring."""

    @staticmethod
    def forward(ctx, k, v, tau, mask, opts: FusedPAPOptions):
        v_leaf = v.detach().requires_grad_(v.requires_grad)
        out, steps = _run_passes(k.detach(), v.detach(), tau.detach(), mask, opts,
                                 "ckpt" if opts.checkpoint_iters else "graph", v_leaf)
        # save_for_backward (not ctx attributes): the engine frees these after a backward without
        # retain_graph, together with the attention graphs hanging off the saved outputs.
        ctx.save_for_backward(v_leaf, *[t for step in steps for t in step])
        ctx.mask, ctx.opts, ctx.kdtype, ctx.tau_shape = mask, opts, k.dtype, tau.shape
        return out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out):
        v_leaf, *flat = ctx.saved_tensors
        steps = [flat[i:i + 3] for i in range(0, len(flat), 3)]
        del flat
        opts, cdtype, need_v = ctx.opts, ctx.kdtype, v_leaf.requires_grad
        g_k = g_v = g_tau = None
        g_lowrank, g_dual = g_out, None  # dLoss/dL_t and dLoss/dU_t (no U after the final pass)
        outside = None                   # scratch for gC outside the clamp, reused by every pass
        for t in range(len(steps) - 1, -1, -1):
            keys2, att, sign = steps[t]
            steps[t] = None
            g_att = g_lowrank if g_dual is None else g_lowrank.sub_(g_dual)
            if att is None:  # checkpointed pass: recompute its attention
                keys2 = keys2.detach().requires_grad_(True)
                with torch.enable_grad():
                    att = attend(keys2, keys2, v_leaf, ctx.mask, opts.is_causal, 0.0, opts.scale, True)
            inputs = (keys2, v_leaf) if need_v else (keys2,)
            grads = torch.autograd.grad(att, inputs, g_att.to(att.dtype), retain_graph=True)
            del att, g_att
            if need_v:
                g_v = grads[1].to(cdtype) if g_v is None else g_v.add_(grads[1])
            g_keys2 = grads[0].to(cdtype)
            del grads
            sign = sign.to(cdtype)
            if g_dual is None:  # final pass: dLoss/dC = gK2 (copied when gK2 is needed below)
                g_clamped = g_keys2.clone() if t > 0 else g_keys2
            else:
                g_clamped = g_dual.add_(g_keys2)
            g_tau = torch.mul(g_clamped, sign) if g_tau is None else g_tau.addcmul_(g_clamped, sign)
            # sign^2 is 1 outside the clamp: that part of gC goes to L_{t-1}, the rest to A_t
            outside = torch.mul(g_clamped, sign, out=outside).mul_(sign)
            g_shifted = g_clamped.sub_(outside)
            if t > 0:
                g_lowrank = outside
            if g_k is None:
                g_k = g_shifted
                if t > 0:
                    g_dual = torch.add(g_shifted, g_keys2, alpha=-2.0)  # dU_{t-1} = gA - 2 gK2
            else:
                g_k.add_(g_shifted)
                if t > 0:
                    g_dual = g_shifted.add_(g_keys2, alpha=-2.0)
        g_tau = g_tau.sum_to_size(ctx.tau_shape)
        g_v = g_v.to(v_leaf.dtype) if g_v is not None else None
        return g_k, g_v, g_tau, None, None


def fused_pap(k: Tensor, v: Tensor, tau: Tensor, mask: Optional[Tensor], opts: FusedPAPOptions) -> Tensor:
    """PAP's output on the fused path. ``k``: keys in the compute dtype; ``tau``: the threshold
    (its gradient flows back to mu); ``mask``: bool or None. Inputs are checked by the caller."""
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or tau.requires_grad):
        return _FusedPAPFunction.apply(k, v, tau, mask, opts)
    with torch.no_grad():
        return _run_passes(k, v, tau, mask, opts, None)[0]
