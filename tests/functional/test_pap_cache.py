"""Cached causal PAP decoding (functional.pap_cache) against the uncached forward.

Tolerances (tests/functional/reference.py): float64 results of the same passes computed in another
order differ by ~1e-15 per pass, fed from pass to pass; atol=1e-10 is far above that and far below
any real discrepancy (a wrong row, mask or mu moves outputs by >1e-3). The float32 check derives its
tolerance from float32's epsilon (see the test)."""

import itertools

import pytest
import torch

import rpc_attention.functional as RF

from .reference import ref_pap

ATOL64 = 1e-10
RULES = {"lambda_mu": 4.0, "lambda_over_mu": 1.0, "candes": 1.0}


def _kv(b=2, h=3, n=11, d=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, h, n, d, generator=g, dtype=dtype) * 2
    v = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    return k, v


def _decode(k, v, prompt, chunk=1, key_valid=None, **opts):
    """Prefill ``prompt`` positions, then steps of ``chunk`` positions; the outputs of every position."""
    kv = None if key_valid is None else key_valid[:, :prompt]
    out, _, cache = RF.pap_prefill(k[:, :, :prompt], v[:, :, :prompt], key_valid=kv, **opts)
    outs = [out]
    for i in range(prompt, k.shape[2], chunk):
        j = min(i + chunk, k.shape[2])
        kv = None if key_valid is None else key_valid[:, i:j]
        outs.append(cache.step(k[:, :, i:j], v[:, :, :j], key_valid=kv)[0])
    return torch.cat(outs, dim=2), cache


@pytest.mark.parametrize("threshold,mu_mode,n_iter", list(itertools.product(RULES, RF.pap.CAUSAL_MU_MODES, range(1, 7))))
def test_cached_steps_equal_the_uncached_forward(threshold, mu_mode, n_iter):
    k, v = _kv(seed=n_iter)
    opts = dict(n_iter=n_iter, lambd=RULES[threshold], threshold=threshold, mu_mode=mu_mode)
    full = RF.pap_attention(k, v, is_causal=True, **opts)
    got, cache = _decode(k, v, prompt=4, **opts)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL64)
    assert cache.length == k.shape[2] and len(cache.keys2) == n_iter



@pytest.mark.parametrize("shrink,dual_step", [("hard", 1.0), ("hard", 0.0), ("soft", 0.5)])
def test_cached_steps_continue_the_causal_robust_options(shrink, dual_step):
    # the robust options a causal layer accepts: the cache runs the same shrinkage and dual step per row
    k, v = _kv(seed=3)
    opts = dict(n_iter=4, lambd=1.0, threshold="lambda_over_mu", shrink=shrink, dual_step=dual_step)
    full = RF.pap_attention(k, v, is_causal=True, **opts)
    got, cache = _decode(k, v, prompt=4, **opts)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL64)
    assert (cache.shrink, cache.dual_step) == (shrink, dual_step)
    official = RF.pap_attention(k, v, is_causal=True, n_iter=4, lambd=1.0, threshold="lambda_over_mu")
    assert (full - official).abs().max() > 1e-3  # the option changes the output, so the check above means something

def test_cached_steps_equal_the_float64_reference_loop():
    k, v = _kv(b=1, h=2, n=8, seed=5)
    ref = ref_pap(k, v, 4, 4.0, threshold="lambda_mu", mu_mode="causal", causal=True)
    got, _ = _decode(k, v, prompt=3, n_iter=4, lambd=4.0)
    torch.testing.assert_close(got, ref, rtol=0, atol=ATOL64)


def test_the_sparse_step_fires_in_these_tests():
    # guards the tests above: with S = 0 everywhere they would not test the shrinkage of new rows
    k, v = _kv()
    _, state, _ = RF.pap_prefill(k, v, n_iter=4, lambd=4.0)
    assert 0.05 < (state.sparse != 0).double().mean() < 0.95


@pytest.mark.parametrize("chunk", [2, 3])
def test_several_positions_per_step(chunk):
    k, v = _kv(n=12)
    full = RF.pap_attention(k, v, is_causal=True, n_iter=3, lambd=4.0)
    got, _ = _decode(k, v, prompt=5, chunk=chunk, n_iter=3, lambd=4.0)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL64)


def test_infinite_lambda_and_head_width():
    k, v = _kv()
    opts = dict(n_iter=3, lambd=float("inf"), mu_mode="causal_head_dim", model_dim=7)
    full = RF.pap_attention(k, v, is_causal=True, **opts)
    got, _ = _decode(k, v, prompt=2, **opts)
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL64)


def test_left_padding_takes_no_part():
    k, v = _kv(b=3, n=10)
    valid = torch.ones(3, 10, dtype=torch.bool)
    valid[1, :3] = False  # left-padded prompts of lengths 6, 3 and 5 (then 4 decoded positions)
    valid[2, :1] = False
    opts = dict(n_iter=4, lambd=4.0, threshold="candes")
    full = RF.pap_attention(k, v, is_causal=True, attn_mask=valid[:, None, None, :], fused=False, **opts)
    got, cache = _decode(k, v, prompt=6, key_valid=valid, **opts)
    rows = valid[:, None, :, None].expand_as(full)
    torch.testing.assert_close(got[rows], full[rows], rtol=0, atol=ATOL64)
    # the padded keys changed nothing: padding replaced by other numbers gives the same real rows
    k2, v2 = k.clone(), v.clone()
    k2[~valid[:, None, :, None].expand_as(k)] = 50.0
    v2[~valid[:, None, :, None].expand_as(v)] = -9.0
    again, _ = _decode(k2, v2, prompt=6, key_valid=valid, **opts)
    torch.testing.assert_close(again[rows], got[rows], rtol=0, atol=ATOL64)
    assert cache.key_valid.shape == (3, 1, 1, 10)


def test_padding_key_in_a_step_is_ignored():
    k, v = _kv(b=2, n=9)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, 6] = False  # a padding position inside the decoded part
    opts = dict(n_iter=3, lambd=4.0)
    full = RF.pap_attention(k, v, is_causal=True, attn_mask=valid[:, None, None, :], fused=False, **opts)
    got, _ = _decode(k, v, prompt=4, key_valid=valid, **opts)
    rows = valid[:, None, :, None].expand_as(full)
    torch.testing.assert_close(got[rows], full[rows], rtol=0, atol=ATOL64)


def test_reorder_selects_batch_rows_like_beam_search():
    k, v = _kv(b=3, n=10)
    opts = dict(n_iter=4, lambd=4.0)
    _, _, cache = RF.pap_prefill(k[:, :, :6], v[:, :, :6], **opts)
    index = torch.tensor([2, 0, 0])
    cache.reorder(index)
    kr, vr = k.index_select(0, index), v.index_select(0, index)
    kr[1, :, 6:] = k[1, :, 6:]  # after the reorder the two copies of row 0 continue differently
    vr[1, :, 6:] = v[1, :, 6:]
    outs = [cache.step(kr[:, :, i:i + 1], vr[:, :, :i + 1])[0] for i in range(6, 10)]
    full = RF.pap_attention(kr, vr, is_causal=True, **opts)
    torch.testing.assert_close(torch.cat(outs, 2), full[:, :, 6:], rtol=0, atol=ATOL64)


def test_decomposition_steps_equal_pap_decompose():
    k, v = _kv(n=9)
    opts = dict(n_iter=4, lambd=4.0)
    state = RF.pap_decompose(k, v, is_causal=True, **opts)
    _, st0, cache = RF.pap_prefill(k[:, :, :5], v[:, :, :5], final_attention=False, **opts)
    assert len(cache.keys2) == 3  # the final pass's K2 is read by no later attention
    sparse, keys2 = [st0.sparse], [st0.cleaned_keys]
    for i in range(5, 9):
        out, s, k2 = cache.step(k[:, :, i:i + 1], v[:, :, :i + 1], final_attention=False)
        assert out is None
        sparse.append(s)
        keys2.append(k2)
    torch.testing.assert_close(torch.cat(sparse, 2), state.sparse, rtol=0, atol=ATOL64)
    torch.testing.assert_close(torch.cat(keys2, 2), state.cleaned_keys, rtol=0, atol=ATOL64)


def test_float32_agrees_within_its_rounding():
    k, v = _kv(dtype=torch.float32, seed=3)
    opts = dict(n_iter=4, lambd=4.0)
    full = RF.pap_attention(k, v, is_causal=True, **opts)
    got, _ = _decode(k, v, prompt=4, **opts)
    # each of the 4 passes rounds O(1) values at eps = 1.2e-7 and the dual update multiplies a pass's
    # error by up to ~2 (Y = Y + mu (k - L - S)); 64 eps of the output scale bounds 4 passes of that
    atol = 64 * torch.finfo(torch.float32).eps * full.abs().max().item()
    torch.testing.assert_close(got, full, rtol=0, atol=atol)


def test_memory_is_n_iter_cleaned_key_tensors():
    k, v = _kv(b=2, h=3, n=10, d=4)
    _, _, cache = RF.pap_prefill(k, v, n_iter=5, lambd=4.0)
    assert [t.shape for t in cache.keys2] == [(2, 3, 10, 4)] * 5
    assert cache.nbytes() == 5 * 2 * 3 * 10 * 4 * 8 + 2 * 2 * 3 * 8


def test_uncachable_options_are_refused():
    k, v = _kv()
    with pytest.raises(ValueError, match="leaks future tokens"):
        RF.pap_prefill(k, v, mu_mode="global")
    with pytest.raises(ValueError, match="tol=0.01 stops PAP"):
        RF.pap_prefill(k, v, tol=0.01)
    with pytest.raises(ValueError, match="target_fraction"):
        RF.pap_prefill(k, v, threshold="target_fraction", lambd=0.1)
    _, _, cache = RF.pap_prefill(k[:, :, :4], v[:, :, :4], n_iter=2)
    with pytest.raises(ValueError, match="cached and 1 new"):
        cache.step(k[:, :, 4:5], v[:, :, :4])


def test_prefill_with_a_full_mask_equals_key_validity():
    k, v = _kv(b=2, n=9)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, :2] = False
    full_mask = valid[:, None, None, :] & torch.ones(9, 9, dtype=torch.bool).tril()  # (B, 1, N, N)
    opts = dict(n_iter=3, lambd=4.0)
    a, _, ca = RF.pap_prefill(k[:, :, :6], v[:, :, :6], key_valid=valid[:, :6], **opts)
    b, _, cb = RF.pap_prefill(k[:, :, :6], v[:, :, :6], attn_mask=full_mask[..., :6, :6], **opts)
    rows = valid[:, None, :6, None].expand_as(a)
    torch.testing.assert_close(a[rows], b[rows], rtol=0, atol=0)
    assert torch.equal(ca.key_valid, cb.key_valid)
    sa = ca.step(k[:, :, 6:7], v[:, :, :7])[0]
    sb = cb.step(k[:, :, 6:7], v[:, :, :7])[0]
    torch.testing.assert_close(sa, sb, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not both"):
        RF.pap_prefill(k, v, key_valid=valid, attn_mask=full_mask)


def test_append_rows_grows_in_place_without_autograd():
    buf = torch.arange(6.0).reshape(1, 1, 3, 2)
    with torch.no_grad():
        grown = RF.append_rows(buf, 3, torch.full((1, 1, 1, 2), 9.0))
        assert grown.shape[-2] >= 64 and torch.equal(grown[..., :4, :].flatten(), torch.tensor([0, 1, 2, 3, 4, 5, 9, 9.0]))
        again = RF.append_rows(grown, 4, torch.full((1, 1, 2, 2), 7.0))
        assert again is grown  # room left: written in place
        assert torch.equal(again[..., 4:6, :].flatten(), torch.full((4,), 7.0))
    leaf = torch.zeros(1, 1, 2, 2, requires_grad=True)
    out = RF.append_rows(buf, 3, leaf)  # under autograd: a plain concatenation
    assert out.shape[-2] == 5 and out.requires_grad


def test_no_padding_keeps_no_mask():
    k, v = _kv()
    _, _, cache = RF.pap_prefill(k[:, :, :5], v[:, :, :5], key_valid=torch.ones(2, 5, dtype=torch.bool))
    assert cache.key_valid is None
    cache.step(k[:, :, 5:6], v[:, :, :6], key_valid=torch.ones(2, 1, dtype=torch.bool))
    assert cache.key_valid is None
    cache.step(k[:, :, 6:7], v[:, :, :7], key_valid=torch.tensor([[True], [False]]))
    assert cache.key_valid.shape == (2, 1, 1, 7) and not cache.key_valid[1, 0, 0, 6]
