"""PAP's passes sharpen the attention until SDPA would form weights in float32's subnormal range, which
some CPUs (Intel Xeons) compute in microcode, several times slower. The kernel cuts, exactly to the
dtype's rounding, every weight below ``weight_floor`` of its row's largest on the CPU. These tests hold
the cut to the definition (float64 loops), count the subnormals that the computation forms, forward
and backward, and check that the caller's float mode stays as it was."""

import importlib
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rpc_attention import functional as RF

from .reference import rand, ref_pap, ref_softmax_attention

# the module, not the function of the same name that the package exports
A = importlib.import_module("rpc_attention.functional.attention")
TINY32 = torch.finfo(torch.float32).tiny


class SubnormalCounter(TorchDispatchMode):
    """Counts the subnormal entries of every floating-point tensor that an operation returns."""

    def __init__(self):
        super().__init__()
        self.subnormal = 0
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                tiny = torch.finfo(t.dtype).tiny
                with torch._C.DisableTorchFunction():
                    self.subnormal += int(((t != 0) & (t.abs() < tiny)).sum())
                self.total += t.numel()
        return out



def _count_pap_subnormals(monkeypatch, n_iter=6, n_tokens=197, std=1.0):
    original = A.attend
    monkeypatch.setattr(A, "attend", lambda q, k, v, m, c, p, s, fused: original(q, k, v, m, c, p, s, False))
    k = (rand(1, 3, n_tokens, 64, seed=1, dtype=torch.float32) * std).requires_grad_()
    v = (rand(1, 3, n_tokens, 64, seed=2, dtype=torch.float32) * std).requires_grad_()
    w = rand(1, 3, n_tokens, 64, seed=3, dtype=torch.float32)
    forward, backward = SubnormalCounter(), SubnormalCounter()
    with forward:
        out = RF.pap_attention(k, v, n_iter=n_iter)
        loss = (out * w).sum()
    with backward:
        loss.backward()
    return forward, backward


def test_pap_forms_almost_no_subnormals_forward_or_backward(monkeypatch):
    # Without the cut, a third of the weights of passes 3-6 are subnormal here (unit-scale keys, DeiT's
    # 197 tokens): about 6 % of every entry the forward computes, and as many in the backward.
    forward, backward = _count_pap_subnormals(monkeypatch)
    assert forward.total > 1e6 and backward.total > 1e6
    assert forward.subnormal / forward.total < 1e-4, (forward.subnormal, forward.total)
    assert backward.subnormal / backward.total < 1e-4, (backward.subnormal, backward.total)


def test_the_counter_sees_sdpa_s_subnormal_weights(monkeypatch):
    """The instrumented computation without the cut forms many subnormal weights: the count above
    measures the cut, not a blind counter."""
    monkeypatch.setattr(A, "may_underflow", lambda q, k, scale: False)
    forward, backward = _count_pap_subnormals(monkeypatch)
    assert forward.subnormal / forward.total > 1e-2
    assert backward.subnormal / backward.total > 1e-3


@pytest.mark.parametrize("std", [1.0, 3.0])
@pytest.mark.parametrize("kw", [dict(n_iter=6), dict(n_iter=4, is_causal=True), dict(n_iter=3, checkpoint_iters=True)])
def test_pap_with_the_cut_matches_the_definition_in_float64(monkeypatch, std, kw):
    """Values against the float64 loops of the reference; gradients against the definition in plain
    autograd (``return_state=True`` runs ``pap_loop`` on SDPA, without the cut)."""
    calls = []
    truncated = A.attend_truncated
    monkeypatch.setattr(A, "attend_truncated", lambda *a: calls.append(1) or truncated(*a))
    # DeiT-tiny's heads: 197 tokens of width 64, 3 heads (2 here)
    k = (rand(1, 2, 197, 64, seed=4) * std).requires_grad_()
    v = (rand(1, 2, 197, 64, seed=5) * std).requires_grad_()
    w = rand(1, 2, 197, 64, seed=6)
    out = RF.pap_attention(k, v, **kw)
    gk, gv = torch.autograd.grad((out * w).sum(), (k, v))
    assert calls, "the keys were meant to be sharp enough for the cut to run"
    causal = kw.get("is_causal", False)
    ref = ref_pap(k.detach(), v.detach(), kw["n_iter"], 4.0, causal=causal, mu_mode="causal" if causal else "global")
    torch.testing.assert_close(out.detach(), ref, rtol=0, atol=1e-10)
    plain, _ = RF.pap_attention(k, v, return_state=True, **kw)
    gkp, gvp = torch.autograd.grad((plain * w).sum(), (k, v))
    torch.testing.assert_close(gk, gkp, rtol=0, atol=1e-10)
    torch.testing.assert_close(gv, gvp, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_truncated_attention_equals_softmax_attention_to_the_dtype(dtype):
    n, d = 40, 16
    q = rand(2, 2, n, d, seed=7) * 6
    v = rand(2, 2, n, d, seed=8)
    valid = torch.ones(2, n, dtype=torch.bool)
    valid[1, 30:] = False
    mask = valid[:, None, None, :]
    for causal in (False, True):
        got = A.attend_truncated(q.to(dtype), q.to(dtype), v.to(dtype), mask, causal, 0.0, 0.25).double()
        for b in range(2):
            for h in range(2):
                ref = ref_softmax_attention(q[b, h], q[b, h], v[b, h], 0.25, valid[b], causal)
                # float64: the cut is below rounding; float32: the inputs' own rounding dominates
                tol = 1e-12 if dtype == torch.float64 else 50 * torch.finfo(dtype).eps * float(v.abs().max())
                torch.testing.assert_close(got[b, h], ref, rtol=0, atol=tol)


def test_weight_floor_is_derived_from_the_dtype():
    assert A.weight_floor(torch.float32) == pytest.approx(2 * math.log(torch.finfo(torch.float32).eps))
    assert A.weight_floor(torch.bfloat16) == A.weight_floor(torch.float32)  # float32 softmax range
    assert A.weight_floor(torch.float64) == pytest.approx(2 * math.log(torch.finfo(torch.float64).eps))
    # the cut weights all together stay below one rounding step for sequences up to 1/eps tokens
    assert math.exp(A.weight_floor(torch.float32)) * (1 / torch.finfo(torch.float32).eps) <= torch.finfo(torch.float32).eps


def test_may_underflow_bounds_the_score_range():
    k = rand(1, 1, 30, 8, seed=9)
    scores = (k @ k.transpose(-1, -2))[0, 0]
    span = float((scores.amax(-1) - scores.amin(-1)).max())
    scale = -A.weight_floor(torch.float64) / span  # the actual span reaches the floor at this scale
    assert A.may_underflow(k, k, scale)
    top = float(torch.linalg.vector_norm(k, dim=-1).amax())
    assert not A.may_underflow(k, k, 0.99 * -A.weight_floor(torch.float64) / (2 * top ** 2))


def test_pap_leaves_the_callers_float_mode_unchanged():
    k = (rand(1, 3, 197, 64, seed=10, dtype=torch.float32)).requires_grad_()
    v = rand(1, 3, 197, 64, seed=11, dtype=torch.float32).requires_grad_()
    RF.pap_attention(k, v, n_iter=6).sum().backward()
    assert float(torch.tensor(1e-39) * 1.0) != 0.0
    assert float(torch.tensor(TINY32) / 4) != 0.0
