"""The published codes' conventions that the analysis offers next to its own (docs/analysis.md#protocols):
each variant against a float64 reference written out with loops from its definition, each option's effect,
and its validation."""

import math

import numpy as np
import pytest
import torch

from rpc_attention.cli import main
from rpc_attention.kpca import metrics as M
from rpc_attention.kpca.analysis import analyze_captures, summarise_tokens
from rpc_attention.kpca.hooks import LayerCapture
from rpc_attention.kpca.options import options_from_settings


def _capture(name="l", b=2, h=2, n=9, d=4, seed=0, rank1=False, key_scale=1.0):
    """A symmetric layer's capture built directly: keys (rank 1 when ``rank1``) and random values."""
    g = torch.Generator().manual_seed(seed)
    if rank1:  # kernel eigenvalues fall to the rounding level: many tiny ones of either sign
        k = torch.randn(b, h, n, 1, generator=g, dtype=torch.float64) * torch.randn(1, h, 1, d, generator=g, dtype=torch.float64)
    else:
        k = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = k * key_scale
    v = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    return LayerCapture(name=name, kind="symmetric", q=k, k=k, v=v, scale=d ** -0.5, symmetric=True)


def _token_norms(q, k, v, s):
    """Per-token ||varphi(q_i)||^2 and ||h_i||^2 of one head by loops over tokens and keys."""
    n = q.shape[0]
    phi2, h2 = [], []
    for i in range(n):
        w = [math.exp(s * float(q[i] @ k[j])) for j in range(n)]
        g = sum(w)
        phi2.append(math.exp(s * float(q[i] @ q[i])) / g ** 2)
        h = sum(w[j] / g * v[j].numpy() for j in range(n))
        h2.append(float((h * h).sum()))
    return phi2, h2


def _standardise(x, eps=0.0):
    out = torch.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        mean = sum(float(t) for t in row) / len(row)
        std = math.sqrt(sum((float(t) - mean) ** 2 for t in row) / (len(row) - 1))
        out[idx] = (row - mean) / (std + eps)
    return out


def test_per_token_relative_errors_and_official_layer_average_of_logs():
    caps = [_capture("a", d=8, seed=1), _capture("b", d=8, seed=2, key_scale=2.0)]
    paper = analyze_captures(caps, "paper", gram=False)
    layer_logs, rel_h, rel_phi = [], [], []
    for c, layer in zip(caps, paper["layers"]):
        kz = _standardise(c.k)
        official, rh, rp = [], [], []
        for b in range(2):
            for h in range(2):
                q = k = kz[b, h]
                phi2, h2 = _token_norms(q, k, c.v[b, h], c.scale)
                rh += [abs(p - x) / (x + 1e-8) for p, x in zip(phi2, h2)]
                rp += [abs(p - x) / (p + 1e-8) for p, x in zip(phi2, h2)]
                for i in range(9):  # official form: exp(q.q) / exp(2 q.k_0 - log attn_0^2) - ||h||^2
                    w = [math.exp(c.scale * float(q[i] @ k[j])) for j in range(9)]
                    attn0 = w[0] / sum(w)
                    official.append(math.exp(float(q[i] @ q[i])) / math.exp(2 * float(q[i] @ k[0]) - math.log(attn0 ** 2))
                                    - h2[i])
        layer_logs.append(math.log(sum(official) / len(official)))
        rel_h.append(sum(rh) / len(rh))
        rel_phi.append(sum(rp) / len(rp))
        assert layer["log_mean_jproj_official"] == pytest.approx(layer_logs[-1], rel=1e-10)
        assert layer["rel_error_per_token_wrt_h2"] == pytest.approx(rel_h[-1], rel=1e-10)
        assert layer["rel_error_per_token_wrt_phi2"] == pytest.approx(rel_phi[-1], rel=1e-10)
    model = paper["model"]
    assert model["mean_layer_log_jproj_official"] == pytest.approx(sum(layer_logs) / 2, rel=1e-10)
    assert model["log_mean_jproj_official"] != pytest.approx(model["mean_layer_log_jproj_official"], rel=1e-6)
    assert model["rel_error_per_token_wrt_h2"] == pytest.approx(sum(rel_h) / 2, rel=1e-10)
    assert model["rel_error_per_token_wrt_phi2"] == pytest.approx(sum(rel_phi) / 2, rel=1e-10)
    # the ratio of means (norms.py) is another number
    assert model["rel_error_wrt_phi2"] != pytest.approx(model["rel_error_per_token_wrt_phi2"], rel=1e-3)
    assert "mean_layer_log_jproj_official" in paper["conventions"]
    exact = analyze_captures(caps, "exact", gram=False)
    assert "mean_layer_log_jproj_official" not in exact["model"]


def _percentile(sorted_vals, p):
    """numpy's default (linear) percentile written out."""
    pos = (len(sorted_vals) - 1) * p / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def test_token_statistics_over_tokens_and_the_studys_trimmed_median():
    vals = [float(x) for x in torch.rand(41, generator=torch.Generator().manual_seed(3), dtype=torch.float64) ** 3]
    got = summarise_tokens(vals + [float("inf")])
    s = sorted(vals)
    cut = _percentile(s, 95)
    kept = [x for x in s if x <= cut]
    mean = sum(vals) / len(vals)
    assert got["mean"] == pytest.approx(mean, rel=1e-12)
    assert got["std"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in vals) / len(vals)), rel=1e-12)
    assert got["n_kept"] == len(kept) < len(vals) and got["n_nonfinite"] == 1
    assert got["median"] == pytest.approx(_percentile(kept, 50), rel=1e-12)
    assert got["q25"] == pytest.approx(_percentile(kept, 25), rel=1e-12)
    assert got["q75"] == pytest.approx(_percentile(kept, 75), rel=1e-12)
    # in the analysis: a layer's token statistics are over its (example, head, token) norms
    cap = _capture(seed=4)
    layer = analyze_captures([cap], "exact", gram=False)["layers"][0]
    phi2 = []
    for b in range(2):
        for h in range(2):
            phi2 += _token_norms(cap.k[b, h], cap.k[b, h], cap.v[b, h], cap.scale)[0]
    assert layer["phi2_tokens"]["n"] == 36
    assert layer["phi2_tokens"]["std"] == pytest.approx(float(np.std(phi2)), rel=1e-9)
    assert layer["phi2_tokens"]["std"] != pytest.approx(layer["phi2"]["std"], rel=1e-3)  # not the records' std


def test_gamma_std_of_record_means_is_the_studys_band():
    cap = _capture(n=12, seed=5)
    layer = analyze_captures([cap], "exact")["layers"][0]
    means = []  # per (example, head) record: mean over pairs of |gamma_i - gamma_j| per axis, eigenvectors
    for b in range(2):
        k = cap.k[b].numpy()
        for h in range(2):
            e = np.exp(k[h] @ k[h].T * cap.scale)
            kphi = e / np.outer(e.sum(1), e.sum(1))
            hm = np.eye(12) - 1.0 / 12
            kc = hm @ kphi @ hm
            a = M.recover_a_hat(torch.log(torch.tensor(e.sum(1))).unsqueeze(0), cap.v[b, h:h + 1])[0].numpy()
            gam = (kc @ a) / (a * 12)
            row = []
            for d in range(4):
                diffs = [abs(gam[i, d] - gam[j, d]) for i in range(12) for j in range(i + 1, 12)]
                row.append(sum(diffs) / len(diffs))
            means.append(row)
    means = np.array(means)
    got = layer["gamma"]["learned"]
    np.testing.assert_allclose(got["per_axis_mean"], means.mean(0), rtol=1e-7)
    np.testing.assert_allclose(got["per_axis_std_of_means"], means.std(0), rtol=1e-6)
    assert not np.allclose(got["per_axis_std_of_means"], got["per_axis_std"], rtol=1e-2)


def test_eigenpairs_ranked_by_magnitude_and_canonical_signs():
    # a symmetric matrix with known eigenvalues 3, -2, 1, -0.5
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64))
    mat = q @ torch.diag(torch.tensor([3.0, -2.0, 1.0, -0.5], dtype=torch.float64)) @ q.T
    assert M.gram_eigen(mat, 2)["eig"].tolist() == pytest.approx([3.0, 1.0])
    assert M.gram_eigen(mat, 2, "magnitude")["eig"].tolist() == pytest.approx([3.0, -2.0])
    vecs = M.gram_eigen(mat, 4)["vecs"]
    canon = M.canonical_signs(vecs)
    for d in range(4):  # the largest-magnitude entry of each column is positive, the column otherwise the same
        col = vecs[:, d].tolist()
        big = max(range(4), key=lambda i: (abs(col[i]), -i))
        sign = 1.0 if col[big] > 0 else -1.0
        assert canon[:, d].tolist() == pytest.approx([sign * x for x in col], abs=0)
    torch.testing.assert_close(M.canonical_signs(-vecs), canon, rtol=0, atol=0)


def test_vhat_rank_changes_v_hat_where_rounding_level_eigenvalues_compete():
    # Dv = N - 1, so the excluded axis decides; small rank-1 keys: most eigenvalues at the rounding level
    cap = _capture(h=4, n=12, d=11, seed=7, rank1=True, key_scale=0.1)
    by_value = analyze_captures([cap], "exact", vhat_rank="value")
    by_mag = analyze_captures([cap], "exact", vhat_rank="magnitude")
    ref, differs = [], False
    for b in range(2):
        g = M.centred_gram(cap.k[b], cap.scale)
        evals, evecs = torch.linalg.eigh(g["k_c"])
        for h in range(4):
            pairs = sorted(range(12), key=lambda i: -abs(float(evals[h, i])))[:11]
            differs |= set(pairs) != set(sorted(range(12), key=lambda i: -float(evals[h, i]))[:11])
            a = evecs[h][:, pairs]
            vhat = torch.exp(-g["log_g"][h]).unsqueeze(-1) * (a - a.mean(0))
            cos = [float(cap.v[b, h, i] @ vhat[i]) / float(cap.v[b, h, i].norm() * vhat[i].norm()) for i in range(12)]
            ref.append(sum(cos) / 12)
    assert differs  # some record has a negative rounding-level eigenvalue larger in magnitude than a positive one
    assert by_mag["model"]["direct_cosine"]["mean"] == pytest.approx(sum(ref) / len(ref), rel=1e-9)
    assert by_mag["model"]["direct_cosine"]["mean"] != pytest.approx(by_value["model"]["direct_cosine"]["mean"], rel=1e-9)
    assert by_mag["conventions"]["vhat_rank"].startswith("magnitude")


def test_eigenvector_signs_move_the_cosines_not_cka_or_eigenvalues():
    cap = _capture(n=12, seed=8)
    eigh = analyze_captures([cap], "exact")["model"]
    canon = analyze_captures([cap], "exact", eig_signs="canonical")["model"]
    for key in ("direct_cosine", "optimal_cosine"):
        assert canon[key]["mean"] != pytest.approx(eigh[key]["mean"], rel=1e-6), key
    for key in ("linear_cka", "rbf_cka", "eig_mean"):
        assert canon[key]["mean"] == pytest.approx(eigh[key]["mean"], rel=1e-10), key
    for key in ("learned", "eigvec", "random"):  # gamma is a ratio: the sign cancels
        assert canon["gamma"][key]["mean"] == pytest.approx(eigh["gamma"][key]["mean"], rel=1e-8), key


def test_standardize_eps_is_the_studys_standardisation():
    cap = _capture(seed=9)
    off = analyze_captures([cap], "paper", gram=False)["layers"][0]
    study = analyze_captures([cap], "paper", gram=False, standardize_eps=0.5)["layers"][0]  # large: visible
    kz = _standardise(cap.k, eps=0.5)
    phi2 = []
    for b in range(2):
        for h in range(2):
            p, _ = _token_norms(kz[b, h], kz[b, h], cap.v[b, h], cap.scale)
            phi2.append(sum(p) / len(p))
    assert study["phi2"]["mean"] == pytest.approx(sum(phi2) / 4, rel=1e-10)
    assert study["phi2"]["mean"] != pytest.approx(off["phi2"]["mean"], rel=1e-3)
    assert analyze_captures([cap], "paper", gram=False, standardize_eps=1e-8)["conventions"]["standardization"].endswith(
        "(std + 1e-08), unbiased std")


@pytest.mark.parametrize("settings, message", [
    (["vhat_rank=largest"], "vhat_rank='largest'"),
    (["eig_signs=positive"], "eig_signs='positive'"),
    (["standardize_eps=-1"], "standardize_eps=-1"),
    (["standardize_eps=1e-8", "protocol=exact"], "only `paper` standardises"),
])
def test_bad_conventions_are_refused_up_front(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        options_from_settings(settings)
    with pytest.raises(ValueError, match="no effect without the alignment"):
        analyze_captures([_capture()], "exact", alignment=False, vhat_rank="magnitude")
    with pytest.raises(ValueError, match="no effect without the Gram"):
        analyze_captures([_capture()], "exact", gram=False, eig_signs="canonical")


def test_cli_refuses_a_bad_convention_and_writes_the_ones_used(tmp_path, capsys):
    import json

    base = ["analyze", "--timm", "vit_tiny_patch16_224", "--set", "model.kwargs.img_size=16", "--set",
            "model.kwargs.patch_size=4", "--set", "model.kwargs.depth=1", "--set", "model.kwargs.embed_dim=16",
            "--set", "model.kwargs.num_heads=2", "--limit", "2", "--no-figures"]
    assert main(base + ["--out", str(tmp_path / "bad"), "--protocol", "exact", "--standardize-eps", "1e-8"]) == 2
    assert "only `paper` standardises" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(base + ["--out", str(tmp_path / "ok"), "--eig-signs", "canonical", "--vhat-rank", "magnitude",
                        "--standardize-eps", "1e-8"]) == 0
    data = json.loads((tmp_path / "ok" / "kpca.json").read_text())
    assert (data["meta"]["eig_signs"], data["meta"]["vhat_rank"], data["meta"]["standardize_eps"]) == (
        "canonical", "magnitude", 1e-8)
    assert data["protocols"]["exact"]["conventions"]["standardization"] == "none (raw q, k)"
    assert "1e-08" in data["protocols"]["paper"]["conventions"]["standardization"]
    assert "eigenvector signs canonical" in (tmp_path / "ok" / "summary.md").read_text()


def test_conventions_as_study_settings_reach_the_analysis():
    o = options_from_settings(["vhat_rank=magnitude", "eig_signs=canonical", "standardize_eps=1e-8"])
    kw = o.analysis_kwargs()
    assert (kw["vhat_rank"], kw["eig_signs"], kw["standardize_eps"]) == ("magnitude", "canonical", 1e-8)
