"""The robust options of PAP (docs/method.md#robust-variants) against the float64 loop of
tests/functional/reference.py: ``threshold="mad"``, ``lowrank="keys"``, ``shrink="hard"``, ``dual_step``.

Tolerances: see tests/functional/reference.py (float64, atol=1e-10 for PAP's passes).
"""

import itertools
import math

import pytest
import torch

from rpc_attention import functional as RF
from rpc_attention.functional import pap_robust
from rpc_attention.functional.pap import outlier_rows, prepare_pap

from .reference import rand, ref_feature_medians, ref_pap, ref_softmax_attention

ROBUST = dict(threshold="mad", lambd=8.0, lowrank="keys", shrink="hard", dual_step=0.0)


@pytest.mark.parametrize("threshold, lambd", [("mad", 0.5), ("mad", 3.0), ("lambda_mu", 0.5), ("candes", 1.0)])
@pytest.mark.parametrize("lowrank, shrink, dual_step", list(itertools.product(["values", "keys"], ["soft", "hard"],
                                                                              [1.0, 0.5, 0.0])))
@pytest.mark.parametrize("fused", [True, False])
def test_robust_options_match_reference(threshold, lambd, lowrank, shrink, dual_step, fused):
    k, v = rand(2, 3, 9, 4, seed=41), rand(2, 3, 9, 4, seed=42)
    opts = dict(lambd=lambd, threshold=threshold, lowrank=lowrank, shrink=shrink, dual_step=dual_step)
    out = RF.pap_attention(k, v, n_iter=4, fused=fused, **opts)
    torch.testing.assert_close(out, ref_pap(k, v, 4, **opts), rtol=0, atol=1e-10)


@pytest.mark.parametrize("n_iter", [1, 2, 6])
def test_keys_lowrank_allows_other_value_width_and_matches_reference(n_iter):
    k, v = rand(2, 2, 8, 4, seed=43), rand(2, 2, 8, 6, seed=44)
    opts = dict(ROBUST, dual_step=1.0) if n_iter == 1 else ROBUST  # no dual update with one pass
    out = RF.pap_attention(k, v, n_iter=n_iter, **opts)
    assert out.shape == (2, 2, 8, 6)
    torch.testing.assert_close(out, ref_pap(k, v, n_iter, **opts), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="d_v == d_k"):
        RF.pap_attention(k, v, n_iter=n_iter, threshold="mad")


def test_robust_options_with_padding_match_reference():
    B, H, N, d = 3, 2, 8, 4
    k, v = rand(B, H, N, d, seed=45), rand(B, H, N, d, seed=46)
    k[0, :, 6:] *= 50  # padding rows with huge keys must not move the medians
    valid = torch.zeros(B, N, dtype=torch.bool)
    for b, n in enumerate([6, 5, 8]):
        valid[b, :n] = True
    out = RF.pap_attention(k, v, n_iter=3, attn_mask=valid[:, None, None, :], **ROBUST)
    ref = ref_pap(k, v, 3, valid=valid, **ROBUST)
    for b, n in enumerate([6, 5, 8]):
        torch.testing.assert_close(out[b, :, :n], ref[b, :, :n], rtol=0, atol=1e-10)


def test_reference_medians_are_medians():
    kk = torch.tensor([[1.0, -2.0], [3.0, 5.0], [2.0, 0.0]], dtype=torch.float64)
    assert ref_feature_medians(kk, torch.ones(3, dtype=torch.bool)).tolist() == [2.0, 0.0]


def test_robust_scale_is_the_mad_of_the_keys():
    k = torch.tensor([[[[0.0, 1.0], [1.0, 3.0], [2.0, 5.0], [10.0, 7.0], [4.0, 9.0]]]], dtype=torch.float64)
    # feature medians 2 and 5; |k - m|: 2, 1, 0, 8, 2 and 4, 2, 0, 2, 4 -> median of all ten = 2
    assert float(RF.robust_scale(k)) == pytest.approx(1.4826 * 2.0, abs=1e-12)


@pytest.mark.parametrize("change", [dict(threshold="lambda_mu", lambd=4.0), dict(lowrank="values"),
                                    dict(shrink="soft"), dict(dual_step=1.0), dict(lambd=3.0)])
def test_each_accepted_robust_option_changes_the_output(change):
    k, v = rand(2, 2, 12, 4, seed=47), rand(2, 2, 12, 4, seed=48)
    k[:, :, 3, 1] += 30.0  # an outlier, so the sparse step has something to take
    base = RF.pap_attention(k, v, n_iter=4, **ROBUST)
    other = RF.pap_attention(k, v, n_iter=4, **dict(ROBUST, **change))
    assert (base - other).abs().max() > 1e-6


def test_mad_threshold_leaves_clean_keys_alone_and_takes_outliers_whole():
    g = torch.Generator().manual_seed(0)
    low = torch.randn(1, 2, 24, 2, generator=g, dtype=torch.float64) @ torch.randn(1, 2, 2, 8, generator=g,
                                                                                     dtype=torch.float64)
    v = rand(1, 2, 24, 8, seed=49)
    sym = RF.symmetric_attention(low, v)
    out, state = RF.pap_attention(low, v, n_iter=6, return_state=True, **ROBUST)
    assert not state.sparse.any()  # no entry 8 robust standard deviations out: S = 0, plain attention
    torch.testing.assert_close(out, sym, rtol=0, atol=1e-12)
    hit = torch.zeros_like(low, dtype=torch.bool)
    hit[0, 0, 5, 3] = hit[0, 1, 17, 0] = True
    corrupted = low + 100.0 * hit
    _, state = RF.pap_attention(corrupted, v, n_iter=6, return_state=True, **ROBUST)
    assert torch.equal(state.sparse != 0, hit)
    # hard shrinkage takes the whole entry: the cleaned key is the low-rank estimate there
    torch.testing.assert_close(state.cleaned_keys[hit], state.lowrank[hit], rtol=0, atol=1e-12)


def test_zero_dual_step_keeps_the_dual_at_zero_and_final_keys_k_minus_s():
    k, v = rand(1, 2, 10, 4, seed=50), rand(1, 2, 10, 4, seed=51)
    _, state = RF.pap_attention(k, v, n_iter=5, return_state=True, **ROBUST)
    assert not state.dual.any()
    torch.testing.assert_close(state.cleaned_keys, k - state.sparse, rtol=0, atol=0)


def test_decompose_and_gradients_with_robust_options():
    k, v = rand(1, 2, 10, 4, seed=52).requires_grad_(), rand(1, 2, 10, 4, seed=53).requires_grad_()
    out, state = RF.pap_attention(k, v, n_iter=4, return_state=True, **ROBUST)
    dec = RF.pap_decompose(k, v, n_iter=4, **ROBUST)
    torch.testing.assert_close(dec.cleaned_keys, state.cleaned_keys, rtol=0, atol=0)
    out.square().sum().backward()
    assert torch.isfinite(k.grad).all() and k.grad.abs().sum() > 0 and v.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lowrank="svd"), "lowrank"),
        (dict(shrink="firm"), "shrink"),
        (dict(dual_step=-0.5), "dual_step"),
        (dict(dual_step=float("nan")), "dual_step"),
        (dict(dual_step=float("inf")), "dual_step"),
        (dict(dual_step="half"), "dual_step"),
        (dict(dual_step=0.0, n_iter=1), "dual_step=0.0 has no effect with n_iter=1"),
        (dict(threshold="mad", is_causal=True), "threshold='mad'.*causal"),
        (dict(lowrank="keys", is_causal=True), "lowrank='keys'.*causal"),
    ],
)
def test_bad_robust_options_raise(kwargs, match):
    k = torch.randn(1, 2, 4, 3)
    with pytest.raises(ValueError, match=match):
        RF.pap_attention(k, k, **kwargs)
    with pytest.raises(ValueError, match=match):
        RF.check_pap_options(**{key: val for key, val in kwargs.items()})


def test_one_iteration_keys_lowrank_shrinks_around_the_median():
    # n_iter = 1 with L_0 = the per-feature median: S = hard(k - median, tau), one attention on k - S
    k, v = rand(1, 1, 9, 3, seed=54), rand(1, 1, 9, 3, seed=55)
    k[0, 0, 2, 1] = 40.0
    out = RF.pap_attention(k, v, n_iter=1, **dict(ROBUST, dual_step=1.0))
    cleaned = k.clone()
    cleaned[0, 0, 2, 1] = ref_feature_medians(k[0, 0], torch.ones(9, dtype=torch.bool))[1]
    ref = ref_softmax_attention(cleaned[0, 0], cleaned[0, 0], v[0, 0], 1 / math.sqrt(3))
    torch.testing.assert_close(out[0, 0], ref, rtol=0, atol=1e-12)


# --- the token rule (row_lambd): whole outlier rows into S -------------------------------------------
TOKEN = dict(ROBUST, lambd=6.0, row_lambd=3.0)


@pytest.mark.parametrize("row_lambd", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("lowrank, shrink, dual_step", [("keys", "hard", 0.0), ("values", "soft", 1.0),
                                                         ("keys", "soft", 0.5), ("values", "hard", 0.0)])
@pytest.mark.parametrize("fused", [True, False])
def test_token_rule_matches_reference(row_lambd, lowrank, shrink, dual_step, fused):
    k, v = rand(2, 3, 11, 4, seed=60), rand(2, 3, 11, 4, seed=61)
    k[0, :, 4] += 9.0  # one corrupted token (every head), so the rule has a row to flag
    k[1, 1, 7] -= 5.0
    opts = dict(threshold="mad", lambd=4.0, lowrank=lowrank, shrink=shrink, dual_step=dual_step, row_lambd=row_lambd)
    out = RF.pap_attention(k, v, n_iter=3, fused=fused, **opts)
    torch.testing.assert_close(out, ref_pap(k, v, 3, **opts), rtol=0, atol=1e-10)


def test_token_rule_with_padding_matches_reference():
    B, H, N, d = 3, 2, 9, 4
    k, v = rand(B, H, N, d, seed=62), rand(B, H, N, d, seed=63)
    k[0, :, 7:] *= 80  # huge padding rows are neither flagged nor counted in the medians
    k[2, :, 1] += 12.0
    valid = torch.zeros(B, N, dtype=torch.bool)
    for b, n in enumerate([7, 6, 9]):
        valid[b, :n] = True
    out, state = RF.pap_attention(k, v, n_iter=2, attn_mask=valid[:, None, None, :], return_state=True, **TOKEN)
    ref = ref_pap(k, v, 2, valid=valid, **TOKEN)
    for b, n in enumerate([7, 6, 9]):
        torch.testing.assert_close(out[b, :, :n], ref[b, :, :n], rtol=0, atol=1e-10)
    flagged = outlier_rows(k, 3.0, valid[:, None, :, None])
    assert not flagged[0, :, 7:].any() and flagged[2, :, 1].all()


def test_token_rule_takes_a_corrupted_row_whole_and_leaves_clean_keys_alone():
    clean, v = rand(1, 2, 24, 8, seed=68), rand(1, 2, 24, 8, seed=64)
    rule = dict(TOKEN, lambd=8.0, row_lambd=6.0)
    out = RF.pap_attention(clean, v, n_iter=2, **rule)  # no entry 8 and no row 6 robust deviations out
    torch.testing.assert_close(out, RF.symmetric_attention(clean, v), rtol=0, atol=1e-12)
    corrupted = clean.clone()
    corrupted[0, :, 9] += 4.0 * torch.sign(rand(2, 8, seed=65))  # every entry of token 9 moves, in both heads
    _, state = RF.pap_attention(corrupted, v, n_iter=2, return_state=True, **rule)
    assert (state.sparse[0, :, 9] != 0).all()  # no single entry is 8 robust deviations out, the row is
    assert not state.sparse[0, :, :9].any() and not state.sparse[0, :, 10:].any()
    # the cleaned row is the low-rank estimate: K2 = k - S = L there (dual step 0)
    torch.testing.assert_close(state.cleaned_keys[0, :, 9], state.lowrank[0, :, 9], rtol=0, atol=1e-12)
    without = RF.pap_attention(corrupted, v, n_iter=2, return_state=True, **dict(rule, row_lambd=None))[1]
    assert not (without.sparse[0, :, 9] != 0).all()


def test_token_rule_changes_the_output_and_has_gradients():
    k, v = rand(1, 2, 10, 4, seed=66).requires_grad_(), rand(1, 2, 10, 4, seed=67).requires_grad_()
    with torch.no_grad():
        k[0, :, 2] += 3.0  # out by about 6 robust deviations of the row distances, not by tau per entry
    base = RF.pap_attention(k, v, n_iter=2, **dict(TOKEN, row_lambd=None))
    out = RF.pap_attention(k, v, n_iter=2, **TOKEN)
    assert (out - base).abs().max() > 1e-3
    out.square().sum().backward()
    assert torch.isfinite(k.grad).all() and k.grad.abs().sum() > 0 and v.grad.abs().sum() > 0


@pytest.mark.parametrize("row_lambd, causal, match", [(-1.0, False, "row_lambd"), (float("inf"), False, "row_lambd"),
                                                      (float("nan"), False, "row_lambd"), ("x", False, "row_lambd"),
                                                      (True, False, "row_lambd"), (3.0, True, "row_lambd.*causal")])
def test_bad_token_rule_raises(row_lambd, causal, match):
    with pytest.raises(ValueError, match=match):
        RF.check_pap_options(row_lambd=row_lambd, is_causal=causal, mu_mode="causal" if causal else None)


# --- the dual-free fast path (rpc_attention.functional.pap_robust) against the loop ---------------------
@pytest.mark.parametrize("threshold, lambd", [("mad", 3.0), ("lambda_mu", 0.5), ("target_fraction", 0.1)])
@pytest.mark.parametrize("lowrank", ["keys", "values"])
@pytest.mark.parametrize("n_iter, dual_step", [(1, 1.0), (2, 0.0), (4, 0.0)])
@pytest.mark.parametrize("row_lambd", [None, 2.0])
def test_dual_free_fast_path_matches_the_loop_values_and_gradients(threshold, lambd, lowrank, n_iter, dual_step,
                                                                   row_lambd):
    k = rand(2, 3, 10, 4, seed=70)
    k[0, :, 3] += 6.0
    k[1, 2, 5, 1] -= 20.0
    k.requires_grad_()
    v = rand(2, 3, 10, 4, seed=71).requires_grad_()
    opts = dict(threshold=threshold, lambd=lambd, lowrank=lowrank, shrink="hard", dual_step=dual_step,
                row_lambd=row_lambd)
    assert pap_robust.dual_free("hard", dual_step, n_iter)
    fast = RF.pap_attention(k, v, n_iter=n_iter, **opts)           # the fast path
    loop = RF.pap_attention(k, v, n_iter=n_iter, fused=False, **opts)  # the definition
    torch.testing.assert_close(fast, loop, rtol=0, atol=1e-10)
    torch.testing.assert_close(fast.detach(), ref_pap(k.detach(), v.detach(), n_iter, **opts), rtol=0, atol=1e-10)
    w = rand(*fast.shape, seed=72)
    g_fast = torch.autograd.grad((fast * w).sum(), (k, v))
    g_loop = torch.autograd.grad((loop * w).sum(), (k, v))
    for a, b in zip(g_fast, g_loop):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_dual_free_fast_path_runs_and_matches_with_a_mask():
    B, H, N, d = 2, 2, 8, 4
    k, v = rand(B, H, N, d, seed=73), rand(B, H, N, d, seed=74)
    valid = torch.ones(B, N, dtype=torch.bool)
    valid[0, 6:] = False
    mask = valid[:, None, None, :]
    opts = dict(TOKEN, row_lambd=2.0)
    problem = prepare_pap(k, v, n_iter=2, attn_mask=mask, **opts)
    direct = pap_robust.dual_free_pap(problem.keys, v, problem.tau, problem.start, problem.rows, problem.mask, n_iter=2, in_keys=True,
                  is_causal=False, dropout_p=0.0, scale=problem.scale, fused=True)
    out = RF.pap_attention(k, v, n_iter=2, attn_mask=mask, **opts)
    torch.testing.assert_close(out, direct, rtol=0, atol=0)  # pap_attention took the fast path
    loop = RF.pap_attention(k, v, n_iter=2, attn_mask=mask, fused=False, **opts)
    torch.testing.assert_close(out[1], loop[1], rtol=0, atol=1e-10)
    torch.testing.assert_close(out[0, :, :6], loop[0, :, :6], rtol=0, atol=1e-10)
    assert not pap_robust.dual_free("soft", 0.0, 2) and not pap_robust.dual_free("hard", 0.5, 2)


def test_the_masked_median_is_the_median_of_the_valid_entries():
    from rpc_attention.functional.pap import _masked_median

    gen = torch.Generator().manual_seed(4)
    for shape in ((7, 3, 17, 16), (9, 2, 6, 5), (9, 2, 5, 4)):
        x = torch.randn(*shape, dtype=torch.float64, generator=gen)
        for p in (0.0, 0.1, 0.5, 0.9, 1.0):
            valid = torch.rand(shape[0], 1, shape[2], 1, generator=gen) < p
            for dim in (-2, (-2, -1)):
                got = _masked_median(x, valid, dim)
                for b in range(shape[0]):
                    for h in range(shape[1]):
                        rows = x[b, h][valid[b, 0, :, 0]]
                        if dim == -2:
                            want = rows.sort(0).values[(len(rows) - 1) // 2] if len(rows) else None
                            got_bh = got[b, h, 0]
                        else:
                            flat = rows.flatten()
                            want = flat.sort().values[(len(flat) - 1) // 2] if len(flat) else None
                            got_bh = got[b, h, 0]
                        if want is None:
                            assert torch.isnan(got_bh).all()
                        else:
                            assert torch.equal(got_bh, want)
