"""PAP (rpc_attention.functional.pap) against the float64 loop of docs/method.md#the-loop.

Tolerances: see tests/functional/reference.py.
"""

import math

import pytest
import torch

from rpc_attention import functional as RF

from .reference import rand, ref_pap, ref_shrink


@pytest.mark.parametrize("shape", [(1, 1, 5, 4), (2, 3, 7, 8), (3, 2, 16, 4)])
@pytest.mark.parametrize("n_iter", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("fused", [True, False])
def test_pap_matches_reference(shape, n_iter, fused):
    k, v = rand(*shape, seed=1), rand(*shape, seed=2)
    out = RF.pap_attention(k, v, n_iter=n_iter, lambd=4.0, fused=fused)
    ref = ref_pap(k, v, n_iter, 4.0)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("threshold", ["lambda_mu", "lambda_over_mu"])
@pytest.mark.parametrize("mu_mode", ["global", "head_dim", "causal", "causal_head_dim"])
def test_pap_options_match_reference(threshold, mu_mode):
    k, v = rand(2, 2, 9, 4, seed=3), rand(2, 2, 9, 4, seed=4)
    for lambd in (0.5, 4.0):
        out = RF.pap_attention(k, v, n_iter=4, lambd=lambd, threshold=threshold, mu_mode=mu_mode)
        ref = ref_pap(k, v, 4, lambd, threshold=threshold, mu_mode=mu_mode)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


def test_model_dim_changes_mu():
    k, v = rand(1, 2, 6, 4, seed=5), rand(1, 2, 6, 4, seed=6)
    out = RF.pap_attention(k, v, n_iter=3, model_dim=20)
    torch.testing.assert_close(out, ref_pap(k, v, 3, 4.0, C=20), rtol=0, atol=1e-10)
    assert not torch.allclose(out, RF.pap_attention(k, v, n_iter=3))


def test_sdpa_path_equals_explicit_path_float32():
    k, v = rand(4, 3, 197, 16, seed=7, dtype=torch.float32), rand(4, 3, 197, 16, seed=8, dtype=torch.float32)
    # Each attention output is a convex combination of rows of v, and float32 rounding of the d=16 score
    # dot products, the exponentials and the 197-term softmax sums moves each weight by a few tens of eps
    # relative: |fused - explicit| <= 32 eps max|v| (measured <= 6.2 over 10 seeds, 1-3 threads). PAP's four
    # passes feed each pass's rounding into the next keys (measured <= 102 eps max|v|): allow 512.
    unit = torch.finfo(torch.float32).eps * v.abs().max().item()
    for is_causal in (False, True):
        a = RF.pap_attention(k, v, n_iter=4, is_causal=is_causal, fused=True)
        b = RF.pap_attention(k, v, n_iter=4, is_causal=is_causal, fused=False)
        torch.testing.assert_close(a, b, rtol=0, atol=512 * unit)
        torch.testing.assert_close(
            RF.symmetric_attention(k, v, is_causal=is_causal, fused=True),
            RF.symmetric_attention(k, v, is_causal=is_causal, fused=False), rtol=0, atol=32 * unit)


def test_large_lambda_removes_the_sparse_part():
    """lambd -> inf: S = 0 in every pass. With n_iter = 1 that is exactly plain symmetric attention.

    With n_iter >= 2 the official update K2 = k - S - Y/mu does NOT give back plain attention (Y/mu =
    k - L after one pass, so the second pass attends with K2 = L): the large-lambda limit is plain
    attention only for n_iter = 1 (docs/method.md#the-large-lambda-limit). We reproduce the official computation and pin this behaviour down here.
    """
    k, v = rand(2, 3, 10, 8, seed=11), rand(2, 3, 10, 8, seed=12)
    plain = RF.symmetric_attention(k, v)
    torch.testing.assert_close(RF.pap_attention(k, v, n_iter=1, lambd=1e12), plain, rtol=0, atol=1e-12)
    for n_iter in (2, 6):
        out, st = RF.pap_attention(k, v, n_iter=n_iter, lambd=1e12, return_state=True)
        assert torch.count_nonzero(st.sparse) == 0
    # n_iter = 2: the final attention runs on K2 = L = softmax(s K K^T) V
    out, st = RF.pap_attention(k, v, n_iter=2, lambd=1e12, return_state=True)
    torch.testing.assert_close(st.cleaned_keys, plain, rtol=0, atol=1e-9)
    torch.testing.assert_close(out, RF.symmetric_attention(plain, v), rtol=0, atol=1e-9)
    # a small lambda really does produce a sparse part and change the output
    out, st = RF.pap_attention(k, v, n_iter=1, lambd=0.1, return_state=True)
    assert torch.count_nonzero(st.sparse) > 0 and (out - plain).abs().max() > 1e-3


def test_large_lambda_final_keys_are_the_earlier_outputs_minus_multiples_of_k():
    """With S = 0 the keys of pass n are K2_n = L_1 + ... + L_{n-1} - (n - 2) k (docs/method.md#the-
    large-lambda-limit): a sparse change of the keys that S does not catch reaches the final pass
    multiplied by -(n - 2), besides its effect through the L's (the key-corruption result of the
    `sparse` suite, docs/robustness.md#sparse-corruption). float64, so the identity holds to rounding."""
    k, v = rand(2, 3, 9, 8, seed=41), rand(2, 3, 9, 8, seed=42)
    # L_j is the last pass's output of a run with n_iter = j + 1 (the passes are deterministic)
    lowranks = [RF.pap_decompose(k, v, n_iter=j + 1, lambd=math.inf).lowrank for j in range(1, 6)]
    for n_iter in range(2, 7):
        st = RF.pap_decompose(k, v, n_iter=n_iter, lambd=math.inf)
        expected = sum(lowranks[: n_iter - 1]) - (n_iter - 2) * k
        torch.testing.assert_close(st.cleaned_keys, expected, rtol=0, atol=1e-12)


def test_one_iteration_is_symmetric_attention_on_clamped_keys():
    k, v = rand(2, 3, 10, 8, seed=13), rand(2, 3, 10, 8, seed=14)
    B, H, N, d = k.shape
    for lambd in (0.01, 0.1):
        mu = N * H * d / (4 * k.abs().sum(dim=(-2, -1), keepdim=True))
        tau = lambd * mu
        clamped = torch.maximum(torch.minimum(k, tau), -tau)
        expected = RF.symmetric_attention(clamped, v)
        torch.testing.assert_close(RF.pap_attention(k, v, n_iter=1, lambd=lambd), expected, rtol=0, atol=1e-12)
        assert (expected - RF.symmetric_attention(k, v)).abs().max() > 1e-6


def test_lambda_zero_is_uniform_attention():
    k, v = rand(1, 2, 6, 4, seed=15), rand(1, 2, 6, 4, seed=16)
    out = RF.pap_attention(k, v, n_iter=1, lambd=0.0)
    torch.testing.assert_close(out, v.mean(dim=-2, keepdim=True).expand_as(v), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mu_mode", [None, "causal", "causal_head_dim"])
@pytest.mark.parametrize("fused", [True, False])
def test_causal_outputs_do_not_depend_on_future_tokens(mu_mode, fused):
    k, v = rand(2, 3, 12, 8, seed=48), rand(2, 3, 12, 8, seed=49)
    t = 6
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t + 1:] = rand(2, 3, 12 - t - 1, 8, seed=50) * 5
    v2[:, :, t + 1:] = rand(2, 3, 12 - t - 1, 8, seed=51) * 5
    a = RF.pap_attention(k, v, n_iter=4, is_causal=True, mu_mode=mu_mode, fused=fused)
    b = RF.pap_attention(k2, v2, n_iter=4, is_causal=True, mu_mode=mu_mode, fused=fused)
    # Bit-identical by construction: same kernels on the same shapes, masked weights are exactly 0 and
    # the causal mu is a prefix sum, so later tokens add exact zeros in the same summation order.
    assert torch.equal(a[:, :, : t + 1], b[:, :, : t + 1])
    assert not torch.equal(a[:, :, t + 1:], b[:, :, t + 1:])
    # A shorter sequence gives the same outputs too (nothing about the sequence length leaks). Different
    # lengths take different blockings and summation orders, so this is float64 at rounding level (measured
    # <= 2e-14 over 10 seeds, 1-3 threads); a length leak such as a mu taken over all N keys moves them by ~0.5.
    c = RF.pap_attention(k[:, :, : t + 1], v[:, :, : t + 1], n_iter=4, is_causal=True, mu_mode=mu_mode, fused=fused)
    torch.testing.assert_close(a[:, :, : t + 1], c, rtol=0, atol=1e-12)


def test_causal_matches_reference():
    k, v = rand(2, 2, 9, 4, seed=17), rand(2, 2, 9, 4, seed=18)
    out = RF.pap_attention(k, v, n_iter=4, is_causal=True)
    torch.testing.assert_close(out, ref_pap(k, v, 4, 4.0, mu_mode="causal", causal=True), rtol=0, atol=1e-10)


def test_global_mu_with_causal_raises():
    k = torch.randn(1, 1, 4, 2)
    for mode in ("global", "head_dim"):
        with pytest.raises(ValueError, match="mu_mode"):
            RF.pap_attention(k, k, is_causal=True, mu_mode=mode)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("is_causal", [False, True])
def test_appending_padding_changes_nothing(fused, is_causal):
    B, H, N, d, P = 2, 3, 9, 8, 4
    k, v = rand(B, H, N, d, seed=19), rand(B, H, N, d, seed=20)
    base = RF.pap_attention(k, v, n_iter=5, is_causal=is_causal, fused=fused)
    kp = torch.cat([k, rand(B, H, P, d, seed=21) * 10], dim=2)
    vp = torch.cat([v, rand(B, H, P, d, seed=22) * 10], dim=2)
    key_ok = torch.cat([torch.ones(N, dtype=torch.bool), torch.zeros(P, dtype=torch.bool)])
    mask = key_ok[None, None, None, :].expand(B, 1, N + P, N + P)
    padded = RF.pap_attention(kp, vp, n_iter=5, attn_mask=mask, is_causal=is_causal, fused=fused)
    torch.testing.assert_close(padded[:, :, :N], base, rtol=0, atol=1e-10)
    # float additive masks behave the same way
    fmask = torch.zeros(B, 1, N + P, N + P, dtype=k.dtype).masked_fill(~mask, float("-inf"))
    padded_f = RF.pap_attention(kp, vp, n_iter=5, attn_mask=fmask, is_causal=is_causal, fused=fused)
    torch.testing.assert_close(padded_f[:, :, :N], base, rtol=0, atol=1e-10)


def test_per_example_padding_matches_reference():
    B, H, N, d = 3, 2, 8, 4
    k, v = rand(B, H, N, d, seed=23), rand(B, H, N, d, seed=24)
    lengths = [8, 5, 3]
    valid = torch.zeros(B, N, dtype=torch.bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = True
    mask = valid[:, None, None, :]
    out = RF.pap_attention(k, v, n_iter=3, attn_mask=mask)
    ref = ref_pap(k, v, 3, 4.0, valid=valid)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(out[b, :, :n], ref[b, :, :n], rtol=0, atol=1e-10)


def test_gradcheck_float64():
    k = rand(1, 2, 4, 3, seed=25).requires_grad_()
    v = rand(1, 2, 4, 3, seed=26).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: RF.pap_attention(a, b, n_iter=3, lambd=0.5), (k, v))
    assert torch.autograd.gradcheck(lambda a, b: RF.pap_attention(a, b, n_iter=2, lambd=0.5, is_causal=True), (k, v))


def test_gradients_flow_through_mu_and_iterations():
    """The official code does not detach mu or the iterations: the key gradient must see them."""
    k = rand(1, 1, 6, 4, seed=27).requires_grad_()
    v = rand(1, 1, 6, 4, seed=28)
    RF.pap_attention(k, v, n_iter=3, lambd=0.5).sum().backward()
    g_full = k.grad.clone()
    k.grad = None
    # a version of the same computation with mu treated as a constant gives a different gradient
    state_mu = RF.pap_attention(k.detach(), v, n_iter=3, lambd=0.5, return_state=True)[1].mu
    ref = ref_pap_const_mu(k, v, 3, 0.5, state_mu)
    ref.sum().backward()
    assert not torch.allclose(g_full, k.grad)


def ref_pap_const_mu(k, v, n_iter, lambd, mu):
    mu = mu.detach()
    tau = lambd * mu
    d = k.shape[-1]
    L = torch.zeros_like(k)
    Y = torch.zeros_like(k)
    for _ in range(n_iter - 1):
        S = ref_shrink(k - L + Y / mu, tau)
        K2 = k - S - Y / mu
        L = torch.softmax(K2 @ K2.transpose(-2, -1) / math.sqrt(d), -1) @ v
        Y = Y + mu * (k - L - S)
    S = ref_shrink(k - L + Y / mu, tau)
    K2 = k - S - Y / mu
    return torch.softmax(K2 @ K2.transpose(-2, -1) / math.sqrt(d), -1) @ v


def test_all_zero_keys_are_finite():
    k = torch.zeros(2, 3, 5, 4)
    v = torch.randn(2, 3, 5, 4)
    for threshold in ("lambda_mu", "lambda_over_mu"):
        out, state = RF.pap_attention(k, v, n_iter=6, threshold=threshold, return_state=True)
        assert torch.isfinite(out).all()
        assert torch.isfinite(state.dual).all() and torch.isfinite(state.mu).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    k32, v32 = rand(2, 3, 16, 8, seed=41).float(), rand(2, 3, 16, 8, seed=42).float()
    out, state = RF.pap_attention(k32.to(dtype), v32.to(dtype), n_iter=4, return_state=True)
    assert out.dtype == dtype
    assert state.mu.dtype == torch.float32 and state.tau.dtype == torch.float32
    assert torch.isfinite(out.float()).all()
    # Rounding the inputs and every intermediate to `dtype` costs a few eps(dtype) relative over the four
    # passes (relative Frobenius error measured <= 3.2 eps for bfloat16, <= 5.2 eps for float16, 40 seeds).
    ref = RF.pap_attention(k32, v32, n_iter=4)
    rel_err = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel_err <= 16 * torch.finfo(dtype).eps, rel_err


def test_return_state_and_tol():
    k, v = rand(2, 2, 10, 4, seed=29), rand(2, 2, 10, 4, seed=30)
    out, st = RF.pap_attention(k, v, n_iter=6, return_state=True)
    assert st.n_iter_run == 6
    assert st.sparse.shape == k.shape and st.lowrank.shape == k.shape and st.dual.shape == k.shape
    torch.testing.assert_close(st.cleaned_keys, k - st.sparse - st.dual / st.mu)
    torch.testing.assert_close(out, RF.symmetric_attention(st.cleaned_keys, v), rtol=0, atol=1e-12)
    # a generous tolerance stops early, a zero tolerance never does
    out_tol, st_tol = RF.pap_attention(k, v, n_iter=50, tol=1e9, return_state=True)
    assert 3 <= st_tol.n_iter_run < 50  # the change is first measurable after two passes
    expected = RF.pap_attention(k, v, n_iter=st_tol.n_iter_run)
    torch.testing.assert_close(out_tol, expected, rtol=0, atol=1e-12)
    assert RF.pap_attention(k, v, n_iter=6, tol=0.0, return_state=True)[1].n_iter_run == 6


@pytest.mark.parametrize("is_causal", [False, True])
def test_decompose_equals_the_state_of_pap_attention(is_causal):
    k, v = rand(2, 2, 9, 4, seed=46), rand(2, 2, 9, 4, seed=47)
    _, expected = RF.pap_attention(k, v, n_iter=4, is_causal=is_causal, return_state=True)
    state = RF.pap_decompose(k, v, n_iter=4, is_causal=is_causal)
    for name in ("sparse", "lowrank", "dual", "mu", "tau", "cleaned_keys"):
        torch.testing.assert_close(getattr(state, name), getattr(expected, name), rtol=0, atol=0)
    assert state.n_iter_run == expected.n_iter_run == 4
    with pytest.raises(ValueError, match="n_iter"):
        RF.pap_decompose(k, v, n_iter=0)


def test_dropout_only_in_final_attention():
    k, v = rand(1, 2, 8, 4, seed=31), rand(1, 2, 8, 4, seed=32)
    torch.manual_seed(0)
    a = RF.pap_attention(k, v, n_iter=4, dropout_p=0.5, fused=False)
    torch.manual_seed(0)
    b = RF.pap_attention(k, v, n_iter=4, dropout_p=0.5, fused=False)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, RF.pap_attention(k, v, n_iter=4))
    # the iterations are undisturbed: L (lowrank) does not depend on dropout
    _, s1 = RF.pap_attention(k, v, n_iter=4, dropout_p=0.5, return_state=True)
    _, s0 = RF.pap_attention(k, v, n_iter=4, return_state=True)
    torch.testing.assert_close(s1.lowrank, s0.lowrank)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_iter=0), "n_iter"),
        (dict(n_iter=2.5), "n_iter"),
        (dict(lambd=-1.0), "lambd"),
        (dict(lambd=float("nan")), "lambd"),
        (dict(threshold="lambda"), "threshold"),
        (dict(mu_mode="local"), "mu_mode"),
        (dict(tol=-1.0), "tol"),
        (dict(model_dim=0), "model_dim"),
        (dict(dropout_p=1.5), "dropout_p"),
    ],
)
def test_bad_options_raise(kwargs, match):
    k = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match=match):
        RF.pap_attention(k, k, **kwargs)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="k and v"):
        RF.pap_attention(torch.randn(1, 2, 4, 3), torch.randn(1, 2, 5, 3))
    with pytest.raises(ValueError, match="d_v == d_k"):
        RF.pap_attention(torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 5))
    with pytest.raises(ValueError, match="4-D"):
        RF.pap_attention(torch.randn(2, 4, 3), torch.randn(2, 4, 3))
    k = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match="attn_mask"):
        RF.pap_attention(k, k, attn_mask=torch.ones(1, 1, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask"):
        RF.pap_attention(k, k, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="float attn_mask"):
        RF.pap_attention(k, k, attn_mask=torch.full((4, 4), 0.5))
    with pytest.raises(ValueError, match="s_matrix"):
        RF.scaled_attention_s(k, k, k, torch.zeros(2, 3, 3))


def _pap_grads(fn, k, v):
    k, v = k.clone().requires_grad_(True), v.clone().requires_grad_(True)
    out = fn(k, v)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), k.grad, v.grad


@pytest.mark.parametrize("threshold", ["lambda_mu", "lambda_over_mu"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("is_causal", [False, True])
def test_infinite_lambda_gives_finite_gradients_of_plain_attention(threshold, fused, is_causal):
    torch.manual_seed(0)
    k, v = torch.randn(2, 1, 2, 5, 3, dtype=torch.float64).unbind(0)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    mask[..., 1] = False  # a padding key: mu counts only valid keys
    opts = dict(threshold=threshold, attn_mask=mask, is_causal=is_causal, fused=fused)
    # n_iter = 1 with S = 0 is symmetric softmax attention on the keys themselves
    got = _pap_grads(lambda a, b: RF.pap_attention(a, b, n_iter=1, lambd=math.inf, **opts), k, v)
    ref = _pap_grads(lambda a, b: RF.symmetric_attention(a, b, attn_mask=mask, is_causal=is_causal), k, v)
    for g, r in zip(got, ref):
        assert torch.isfinite(g).all()
        # float64, a handful of O(1) operations: agreement to a few hundred ulps
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    # n_iter = 3: same values and gradients as a finite lambda so large that S = 0 too (where the
    # tau branch contributes exactly 0), for pap_attention and pap_decompose alike
    huge = 1e200
    for lam_fn in (
        lambda lam: lambda a, b: RF.pap_attention(a, b, n_iter=3, lambd=lam, **opts),
        lambda lam: lambda a, b: RF.pap_decompose(a, b, n_iter=3, lambd=lam, **opts).cleaned_keys,
        lambda lam: lambda a, b: RF.pap_decompose(a, b, n_iter=3, lambd=lam, **opts).lowrank,
    ):
        got = _pap_grads(lam_fn(math.inf), k, v)
        ref = _pap_grads(lam_fn(huge), k, v)
        for g, r in zip(got, ref):
            assert torch.isfinite(g).all()
            torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    state = RF.pap_decompose(k, v, n_iter=3, lambd=math.inf, **opts)
    assert torch.count_nonzero(state.sparse) == 0



# ---------------------------------------------------------------------------------------------
# Threshold rules beyond the official lambd * mu, and the sparse-activity record.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("threshold,lambd,mu_mode,causal", [
    ("candes", 1.0, "global", False),
    ("candes", 2.5, "head_dim", False),
    ("candes", 1.0, "causal", True),
    ("target_fraction", 0.05, "global", False),
    ("target_fraction", 0.3, "head_dim", False),
])
def test_threshold_rules_match_reference(threshold, lambd, mu_mode, causal, fused):
    k, v = rand(2, 3, 11, 4, seed=61) * 2, rand(2, 3, 11, 4, seed=62)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, 8:] = False  # padding: excluded from mu, N and the quantile
    mask = valid[:, None, None, :]
    out = RF.pap_attention(k, v, n_iter=4, lambd=lambd, threshold=threshold, mu_mode=mu_mode,
                           is_causal=causal, attn_mask=mask, fused=fused)
    ref = ref_pap(k, v, 4, lambd, threshold=threshold, mu_mode=mu_mode, valid=valid, causal=causal)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(out[1, :, :8], ref[1, :, :8], rtol=0, atol=1e-10)


def test_target_fraction_shrinks_that_fraction_in_the_first_pass_at_any_key_scale():
    """The official tau = lambd * mu grows as keys shrink (mu ~ 1 / mean|k|), so small keys are never
    shrunk; the target_fraction rule shrinks the same share of entries whatever the scale."""
    k, v = rand(2, 3, 40, 8, seed=63), rand(2, 3, 40, 8, seed=64)
    for scale in (0.01, 1.0, 100.0):
        state = RF.pap_decompose(k * scale, v, n_iter=1, lambd=0.1, threshold="target_fraction")
        share = (state.sparse != 0).double().mean(dim=(-2, -1))
        assert torch.all((share - 0.1).abs() <= 1 / (40 * 8)), share  # ceil(0.1 * 320) = 32 entries
    official = RF.pap_decompose(k * 0.01, v, n_iter=1, lambd=4.0)
    assert not official.sparse.any()  # tau = 4 mu is far above every |k| at this scale


def test_threshold_rule_options_are_checked():
    k = rand(1, 2, 5, 4, seed=65)
    with pytest.raises(ValueError, match="lambd in \\(0, 1\\)"):
        RF.pap_attention(k, k, threshold="target_fraction", lambd=4.0)
    with pytest.raises(ValueError, match="causal"):
        RF.pap_attention(k, k, threshold="target_fraction", lambd=0.1, is_causal=True)
    with pytest.raises(ValueError, match="threshold must be one of"):
        RF.pap_attention(k, k, threshold="quantile")


def test_sparse_activity_counts_the_final_sparse_term():
    k, v = rand(2, 2, 6, 4, seed=66), rand(2, 2, 6, 4, seed=67)
    _, state = RF.pap_attention(k, v, n_iter=3, lambd=0.2, threshold="target_fraction", return_state=True)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    act = RF.sparse_activity(state, k, valid)
    rows = valid[:, None, :].expand(2, 2, 6)
    s, kk = state.sparse[rows], k[rows]  # (tokens, d) over valid tokens, float64
    assert act["frac_nonzero"] == pytest.approx(float((s != 0).double().mean()), abs=1e-12)
    assert act["frac_rows_nonzero"] == pytest.approx(float((s != 0).any(-1).double().mean()), abs=1e-12)
    assert act["s_over_k"] == pytest.approx(float(s.norm() / kk.norm()), rel=1e-6)  # computed in float32
    assert act["abs_k_max"] == pytest.approx(float(kk.abs().max()), rel=1e-6)
    assert act["abs_k_median"] <= act["abs_k_p99"] <= act["abs_k_max"]
    silent = RF.sparse_activity(RF.pap_decompose(k * 0.01, v, n_iter=3), k * 0.01)
    assert silent["frac_nonzero"] == 0.0 and silent["s_over_k"] == 0.0 and silent["tau_mean"] > silent["abs_k_max"]
