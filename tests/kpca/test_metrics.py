"""Every kernel-PCA metric against a direct numpy / brute-force computation on small random tensors."""

import itertools
import math

import numpy as np
import pytest
import torch

from rpc_attention.kpca import metrics as M


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


# ---------------------------------------------------------------- explicit feature map (Taylor)

def _taylor_features(x: np.ndarray, s: float, order: int = 40) -> np.ndarray:
    """phi(x) for D = 2 with phi(x).phi(y) = sum_{n<=order} s^n (x.y)^n / n!  (= exp(s x.y) truncated).

    Monomials x1^a x2^b (a + b = n) with coefficient sqrt(s^n / (a! b!)) (multinomial expansion).
    """
    feats = []
    for n in range(order + 1):
        for a in range(n + 1):
            b = n - a
            c = math.sqrt(s ** n / (math.factorial(a) * math.factorial(b)))
            feats.append(c * x[..., 0] ** a * x[..., 1] ** b)
    return np.stack(feats, axis=-1)


def test_taylor_features_reproduce_kernel():
    x = _rand(5, 2, seed=1).numpy() * 0.8
    s = 1 / math.sqrt(2)
    p = _taylor_features(x, s)
    np.testing.assert_allclose(p @ p.T, np.exp(s * x @ x.T), rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_jproj_terms_match_explicit_feature_map(causal):
    n, s = 6, 1 / math.sqrt(2)
    q, k, v = _rand(1, n, 2, seed=2) * 0.8, _rand(1, n, 2, seed=3) * 0.8, _rand(1, n, 3, seed=4)
    pq, pk = _taylor_features(q[0].numpy(), s), _taylor_features(k[0].numpy(), s)
    kern = pq @ pk.T
    if causal:
        kern = np.tril(kern)
    g = kern.sum(1)
    varphi = pq / g[:, None]
    phi2_ref = (varphi ** 2).sum(1)
    attn = kern / g[:, None]
    h_ref = attn @ v[0].numpy()
    h2_ref = (h_ref ** 2).sum(1)
    t = M.log_feature_norms(q, k, v, s, causal=causal)
    np.testing.assert_allclose(np.exp(t["log_phi2"][0].numpy()), phi2_ref, rtol=1e-9)
    np.testing.assert_allclose(np.exp(t["log_h2"][0].numpy()), h2_ref, rtol=1e-9)
    pl = M.projection_loss(q, k, v, s, causal=causal)
    assert pl["jproj"].shape == (1,)
    np.testing.assert_allclose(pl["phi2"].item(), phi2_ref.mean(), rtol=1e-9)
    np.testing.assert_allclose(pl["h2"].item(), h2_ref.mean(), rtol=1e-9)
    np.testing.assert_allclose(pl["jproj"].item(), phi2_ref.mean() - h2_ref.mean(), rtol=1e-8, atol=1e-12)


def test_gram_and_kpca_values_give_the_projection_of_varphi():
    """With V = G (I - 1_N) A (top eigenvectors of K_c), softmax attention output h_id equals the
    projection of varphi(q_i) on the (unnormalised) principal axis u_d = sum_j a_jd (varphi(k_j) - mean)."""
    n, s, dv = 7, 1 / math.sqrt(2), 3
    q, k = _rand(1, n, 2, seed=5) * 0.8, _rand(1, n, 2, seed=6) * 0.8
    g = M.centred_gram(k, s)
    pk = _taylor_features(k[0].numpy(), s)
    gk = (pk @ pk.T).sum(1)
    vk = pk / gk[:, None]
    kphi_ref = vk @ vk.T
    np.testing.assert_allclose(g["k_phi"][0].numpy(), kphi_ref, rtol=1e-9)
    hmat = np.eye(n) - np.ones((n, n)) / n
    np.testing.assert_allclose(g["k_c"][0].numpy(), hmat @ kphi_ref @ hmat, atol=1e-12)
    eig = M.gram_eigen(g["k_c"], dv)
    evals, evecs = np.linalg.eigh(hmat @ kphi_ref @ hmat)
    np.testing.assert_allclose(eig["eig"][0].numpy(), evals[::-1][:dv], rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(eig["lam"][0].numpy(), evals[::-1][:dv] / n, rtol=1e-8, atol=1e-14)
    a = eig["vecs"][0].numpy()
    v_hat = M.kpca_values(g["log_g"], eig["vecs"])
    h = M.log_feature_norms(q, k, v_hat, s)["h"][0].numpy()
    pq = _taylor_features(q[0].numpy(), s)
    gq = (pq @ pk.T).sum(1)
    vq = pq / gq[:, None]
    axes = (vk - vk.mean(0)).T @ a  # (features, dv)
    np.testing.assert_allclose(h, vq @ axes, rtol=1e-7, atol=1e-12)


def test_log_space_terms_do_not_overflow():
    q = _rand(2, 5, 8, seed=7, scale=60.0)  # s q.q ~ 1e4 >> 709
    k = _rand(2, 5, 8, seed=8)
    v = _rand(2, 5, 8, seed=9)
    s = 8 ** -0.5
    t = M.log_feature_norms(q, k, v, s)
    assert torch.isfinite(t["log_phi2"]).all()
    scores = s * np.einsum("hnd,hmd->hnm", q.numpy(), k.numpy())
    lse = np.logaddexp.reduce(scores, axis=-1)
    ref = s * (q.numpy() ** 2).sum(-1) - 2 * lse
    np.testing.assert_allclose(t["log_phi2"].numpy(), ref, rtol=1e-12)
    pl = M.projection_loss(q, k, v, s)
    assert torch.isfinite(pl["log_phi2"]).all() and torch.isfinite(pl["log_h2"]).all()


def test_padding_mask_excludes_keys_and_queries():
    q, k, v = _rand(2, 6, 4, seed=10), _rand(2, 6, 4, seed=11), _rand(2, 6, 4, seed=12)
    valid = torch.tensor([1, 1, 1, 1, 0, 0], dtype=torch.bool)
    s = 0.5
    full = M.projection_loss(q, k, v, s, key_valid=valid, query_valid=valid)
    ref = M.projection_loss(q[:, :4], k[:, :4], v[:, :4], s)
    for key in ("jproj", "phi2", "h2"):
        torch.testing.assert_close(full[key], ref[key])


def test_standardize_tokens_uses_the_unbiased_std_of_the_official_code():
    x = _rand(3, 5, 16, seed=13, scale=4.0) + 2.0
    z = M.standardize_tokens(x)
    # the official code: (q - q.mean(-1)) / q.std(-1), torch's default unbiased std, no eps
    xn = x.numpy()
    ref = (xn - xn.mean(-1, keepdims=True)) / xn.std(-1, ddof=1, keepdims=True)
    np.testing.assert_allclose(z.numpy(), ref, rtol=1e-12, atol=1e-12)
    # the study's scripts add 1e-8 to the std
    ref_eps = (xn - xn.mean(-1, keepdims=True)) / (xn.std(-1, ddof=1, keepdims=True) + 1e-8)
    np.testing.assert_allclose(M.standardize_tokens(x, eps=1e-8).numpy(), ref_eps, rtol=1e-12, atol=1e-12)


def test_official_phi2_is_the_codes_unscaled_formula():
    # Reconstruction/softmax.py: num = exp(q.q), den = exp(2 q.k_0 - log(attn_0^2)), attn = softmax(s q.k)
    q, k = _rand(2, 6, 4, seed=30, scale=0.5), _rand(2, 6, 4, seed=31, scale=0.5)
    s = 0.5
    qn, kn = q.numpy(), k.numpy()
    for h in range(2):
        for i in range(6):
            qk = kn[h] @ qn[h, i]
            attn0 = np.exp(s * qk[0]) / np.exp(s * qk).sum()
            ref = np.exp(qn[h, i] @ qn[h, i]) / np.exp(2 * qk[0] - np.log(attn0 ** 2))
            assert math.exp(M.official_log_phi2(q, k, s)[h, i].item()) == pytest.approx(ref, rel=1e-12)
    # with s = 1 it is the definition's ||varphi(q)||^2
    v = _rand(2, 6, 4, seed=32)
    torch.testing.assert_close(M.official_log_phi2(q, k, 1.0), M.log_feature_norms(q, k, v, 1.0)["log_phi2"],
                               rtol=0, atol=1e-12)


# ---------------------------------------------------------------- gamma

def test_pairwise_abs_diff_stats_matches_loop():
    x = _rand(2, 9, 3, seed=14)
    st = M.pairwise_abs_diff_stats(x)
    for h in range(2):
        for d in range(3):
            diffs = [abs(x[h, i, d].item() - x[h, j, d].item()) for i in range(9) for j in range(i + 1, 9)]
            assert st["mean"][h, d].item() == pytest.approx(np.mean(diffs), rel=1e-10)
            assert st["std"][h, d].item() == pytest.approx(np.std(diffs, ddof=1), rel=1e-7)  # torch.std of the pairs


def test_pairwise_rel_diff_stats_matches_the_studys_loop():
    x = _rand(2, 7, 3, seed=33)
    st = M.pairwise_rel_diff_stats(x)
    for h in range(2):
        for d in range(3):
            a = x[h, :, d].tolist()
            rel = [abs(a[i] - a[j]) / (max(abs(a[i]), abs(a[j])) + 1e-10) for i in range(7) for j in range(i + 1, 7)]
            assert st["mean"][h, d].item() == pytest.approx(np.mean(rel), rel=1e-12)
            assert st["std"][h, d].item() == pytest.approx(np.std(rel, ddof=1), rel=1e-10)


def test_gamma_constant_for_true_eigenvectors_not_for_controls():
    k = _rand(2, 12, 4, seed=15)
    g = M.centred_gram(k, 0.5)
    eig = M.gram_eigen(g["k_c"], 4)
    gam = M.gamma_ratios(g["k_c"], eig["vecs"])
    # the study's gamma = K_c a / (a N): lambda = eigenvalue of K_c / N for every token i
    torch.testing.assert_close(gam, eig["lam"].unsqueeze(-2).expand_as(gam), rtol=1e-6, atol=1e-12)
    a = eig["vecs"][0].numpy()
    ref = (g["k_c"][0].numpy() @ a) / (a * 12)
    np.testing.assert_allclose(gam[0].numpy(), ref, rtol=1e-12, atol=0)
    st = M.gamma_stats(g["k_c"], eig["vecs"])
    assert (st["rel_mean"] < 1e-6).all()
    scale = eig["lam"].abs()
    assert (st["mean"] < 1e-6 * scale).all()
    noisy = eig["vecs"] + 0.01 * _rand(*eig["vecs"].shape, seed=16) / math.sqrt(12)
    st_noisy = M.gamma_stats(g["k_c"], noisy)
    assert (st_noisy["mean"] > 1e-4 * scale).all()
    rnd = _rand(*eig["vecs"].shape, seed=17)
    assert (M.gamma_stats(g["k_c"], rnd)["mean"] > 1e-2 * scale).all()


def test_recover_a_hat_inverts_kpca_values():
    k = _rand(3, 10, 4, seed=18)
    g = M.centred_gram(k, 0.5)
    eig = M.gram_eigen(g["k_c"], 4)
    v = M.kpca_values(g["log_g"], eig["vecs"])
    torch.testing.assert_close(M.recover_a_hat(g["log_g"], v), eig["vecs"], rtol=1e-8, atol=1e-10)


def test_gamma_stats_flags_zero_entries():
    k = _rand(1, 6, 3, seed=19)
    g = M.centred_gram(k, 0.5)
    a = _rand(1, 6, 2, seed=20)
    a[0, 2, 1] = 0.0
    st = M.gamma_stats(g["k_c"], a)
    assert st["n_nonfinite"] == 1
    assert torch.isnan(st["mean"][0, 1]) and torch.isfinite(st["mean"][0, 0])


def test_gram_eigen_rejects_dv_above_n():
    with pytest.raises(ValueError, match="Dv <= N"):
        M.gram_eigen(torch.eye(3, dtype=torch.float64)[None], 4)


# ---------------------------------------------------------------- alignment metrics

def _cos_rows(x, y):
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    return x @ y.T


def test_direct_and_optimal_cosine_brute_force():
    x, y = _rand(6, 3, seed=21), _rand(6, 3, seed=22)
    c = _cos_rows(x.numpy(), y.numpy())
    assert M.direct_cosine(x, y).item() == pytest.approx(np.mean(np.diag(c)), rel=1e-12)
    best = max(np.mean([c[i, p[i]] for i in range(6)]) for p in itertools.permutations(range(6)))
    assert M.optimal_cosine(x, y) == pytest.approx(best, rel=1e-12)
    assert M.optimal_cosine(x, x[torch.randperm(6)]) == pytest.approx(1.0)


def _hsic_np(kx, ky):
    n = kx.shape[0]
    h = np.eye(n) - 1.0 / n
    return np.trace(kx @ h @ ky @ h)


def test_linear_cka_matches_kernel_form():
    x, y = _rand(9, 4, seed=23), _rand(9, 3, seed=24)
    xn, yn = x.numpy(), y.numpy()
    ref = _hsic_np(xn @ xn.T, yn @ yn.T) / math.sqrt(_hsic_np(xn @ xn.T, xn @ xn.T) * _hsic_np(yn @ yn.T, yn @ yn.T))
    assert M.linear_cka(x, y).item() == pytest.approx(ref, rel=1e-10)


def test_rbf_cka_matches_loop():
    x, y = _rand(8, 4, seed=25), _rand(8, 4, seed=26)

    def kern(a):
        d2 = np.array([[np.sum((a[i] - a[j]) ** 2) for j in range(len(a))] for i in range(len(a))])
        sigma2 = np.median(d2[d2 > 0])
        return np.exp(-d2 / (2 * sigma2))

    kx, ky = kern(x.numpy()), kern(y.numpy())
    ref = _hsic_np(kx, ky) / math.sqrt(_hsic_np(kx, kx) * _hsic_np(ky, ky))
    assert M.rbf_cka(x, y).item() == pytest.approx(ref, rel=1e-8)


def test_cka_invariances():
    x, y = _rand(20, 5, seed=27), _rand(20, 5, seed=28)
    qmat, _ = torch.linalg.qr(_rand(5, 5, seed=29))
    for fn in (M.linear_cka, M.rbf_cka):
        base = fn(x, y).item()
        assert fn(x @ qmat, y).item() == pytest.approx(base, rel=1e-8)
        assert fn(3.7 * x, y).item() == pytest.approx(base, rel=1e-8)
        assert fn(x, 0.2 * y @ qmat.T).item() == pytest.approx(base, rel=1e-8)
        assert fn(x, x).item() == pytest.approx(1.0)
    # linear CKA is not invariant to a non-isotropic scaling
    scale = torch.diag(torch.tensor([10.0, 1, 1, 1, 0.1], dtype=torch.float64))
    assert abs(M.linear_cka(x @ scale, y).item() - M.linear_cka(x, y).item()) > 1e-3


def test_alignment_metrics_batched_and_chance_baseline():
    x, y = _rand(3, 10, 4, seed=30), _rand(3, 10, 4, seed=31)
    m = M.alignment_metrics(x, y)
    for h in range(3):
        assert m["linear_cka"][h].item() == pytest.approx(M.linear_cka(x[h], y[h]).item())
        assert m["optimal_cosine"][h].item() == pytest.approx(M.optimal_cosine(x[h], y[h]))
    b1 = M.random_alignment_baseline(30, 8, draws=4, seed=1)
    b2 = M.random_alignment_baseline(30, 8, draws=4, seed=1)
    assert b1 == b2
    assert abs(b1["direct_cosine"]["mean"]) < 0.15
    assert b1["optimal_cosine"]["mean"] > b1["direct_cosine"]["mean"]
    assert 0 < b1["linear_cka"]["mean"] < 1
