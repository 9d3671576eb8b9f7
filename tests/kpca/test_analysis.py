"""Aggregation, report writing, the jproj callback and the analyze CLI on tiny models."""

import json
import math

import numpy as np
import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the timm models)
from rpc_attention import nn as rnn
from rpc_attention.cli import main
from rpc_attention.kpca import metrics as M
from rpc_attention.kpca.analysis import analyze_captures, pap_stats, perturbed_eigvecs
from rpc_attention.kpca.hooks import AttentionCapture
from rpc_attention.kpca.runner import run_analysis, summary_markdown
from rpc_attention.kpca.sources import image_probe


def _rpc_vit(lambd=4.0):
    torch.manual_seed(0)
    return timm.create_model("rpc_symvit_tiny_patch16_224", img_size=16, patch_size=2, in_chans=1, embed_dim=32,
                             depth=2, num_heads=2, num_classes=4, rpc_layers=[0], n_iter=3, lambd=lambd).eval()


def test_analyze_captures_fields_and_aggregation():
    m = _rpc_vit()
    with AttentionCapture(m) as cap, torch.no_grad():
        m(torch.randn(3, 1, 16, 16))
    res = analyze_captures(cap.captures, "exact")
    assert res["failures"] == []
    assert [l["name"] for l in res["layers"]] == ["blocks.0.attn", "blocks.1.attn"]
    l0 = res["layers"][0]
    assert l0["kind"] == "rpc" and l0["keys"] == "pap_cleaned" and l0["symmetric"]
    for key in ("jproj", "phi2", "h2", "optimal_cosine", "linear_cka", "rbf_cka", "direct_cosine", "eig_max"):
        assert l0[key]["n"] == 3 * 2, key  # examples x heads
    assert len(l0["gamma"]["learned"]["per_axis_mean"]) == 16
    # layer mean equals a direct computation of the first layer's J_proj
    c = cap.captures[0]
    direct = torch.cat([M.projection_loss(c.k[b], c.k[b], c.v[b], c.scale)["jproj"] for b in range(3)])
    assert l0["jproj"]["mean"] == pytest.approx(direct.mean().item(), rel=1e-10)
    # model level = plain mean over all records
    allj = [l["jproj"]["mean"] for l in res["layers"]]
    assert res["model"]["jproj"]["mean"] == pytest.approx(sum(allj) / 2, rel=1e-10)
    g = res["model"]["gamma"]
    assert g["eigvec"]["mean"] < 1e-6 * g["random"]["mean"]
    # paper protocol standardises q and k, so it differs
    paper = analyze_captures(cap.captures, "paper")
    assert paper["protocol"] == "paper"
    assert paper["model"]["phi2"]["mean"] != pytest.approx(res["model"]["phi2"]["mean"])
    # gamma=False leaves out gamma and its controls, and nothing else changes
    lean = analyze_captures(cap.captures, "exact", gamma=False)
    assert lean["model"]["gamma"] == {} and lean["layers"][0]["gamma"] == {}
    for key in ("jproj", "optimal_cosine", "linear_cka", "rbf_cka", "direct_cosine", "eig_max"):
        assert lean["model"][key] == res["model"][key], key


def test_protocol_conventions_of_the_two_published_codes():
    # docs/analysis.md#protocols: each against a float64 formula written from the codes
    m = _rpc_vit()
    with AttentionCapture(m) as cap, torch.no_grad():
        m(torch.randn(2, 1, 16, 16))
    exact = analyze_captures(cap.captures, "exact")
    c = cap.captures[1]  # the plain symmetric block (raw keys)
    l1 = exact["layers"][1]
    # eigenvalues on the study's scale: |eigenvalues of K_c| (not divided by N), top Dv
    tops = []
    for b in range(2):
        kk = c.k[b].double().numpy()
        for h in range(kk.shape[0]):
            s = np.exp(kk[h] @ kk[h].T * c.scale)
            kphi = s / np.outer(s.sum(1), s.sum(1))
            n = kphi.shape[0]
            hm = np.eye(n) - np.full((n, n), 1.0 / n)
            tops.append(np.abs(np.sort(np.linalg.eigvalsh(hm @ kphi @ hm))[::-1][:16]).max())
    assert l1["eig_max"]["mean"] == pytest.approx(np.mean(tops), rel=1e-8)
    # the study's relative reconstruction errors, from the layer's mean norms
    phi2, h2 = l1["phi2"]["mean"], l1["h2"]["mean"]
    assert l1["rel_error_wrt_phi2"] == pytest.approx(abs(phi2 - h2) / phi2, rel=1e-12)
    assert l1["rel_error_wrt_h2"] == pytest.approx(abs(phi2 - h2) / h2, rel=1e-12)
    assert exact["model"]["rel_error_wrt_h2"] == pytest.approx(
        sum(L["rel_error_wrt_h2"] for L in exact["layers"]) / 2, rel=1e-12)
    # the official code's J_proj under `paper`: log of the mean of exp(q.q)/exp(2 q.k_0 - log attn_0^2) - ||h||^2
    paper = analyze_captures(cap.captures, "paper")
    kz = M.standardize_tokens(c.k.double())
    terms = []
    for b in range(2):
        lp = M.official_log_phi2(kz[b], kz[b], c.scale)
        h2b = M.log_feature_norms(kz[b], kz[b], c.v[b], c.scale)["log_h2"].exp()
        terms.append((lp.exp() - h2b).reshape(-1))
    official = torch.cat(terms).mean().item()
    got = paper["layers"][1].get("log_mean_jproj_official")
    assert (got is None and official <= 0) or got == pytest.approx(math.log(official), rel=1e-9)
    assert "jproj_official" not in exact["layers"][1]


def test_perturbed_control_is_the_studys_noise_then_qr():
    vecs = torch.linalg.qr(torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))[0]
    got = perturbed_eigvecs(vecs, 0.1, torch.Generator().manual_seed(5))
    noise = torch.randn(vecs.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref, _ = np.linalg.qr((vecs + 0.1 * noise).numpy())
    np.testing.assert_allclose(got.numpy(), ref[:, :4], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.T.numpy() @ got.numpy(), np.eye(4), rtol=0, atol=1e-12)


def test_failures_are_reported_not_dropped():
    """Example 1 keeps 5 of 20 keys (padding): head dim 16 > 5 valid keys, no KPCA for that example only."""
    mod = rnn.SymmetricAttention(32, 2).eval()
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    mask[1, ..., 5:] = False
    with AttentionCapture(mod) as cap:
        mod(torch.randn(2, 20, 32), attn_mask=mask)
    res = analyze_captures(cap.captures, "exact")
    assert len(res["failures"]) == 1 and res["failures"][0]["example"] == 1
    assert "Dv <= N" in res["failures"][0]["error"] and "gram" not in res["layers"][0]
    assert res["layers"][0]["jproj"]["n"] == 4  # J_proj still measured
    assert res["layers"][0]["optimal_cosine"]["n"] == 2  # example 0's two heads


def test_layers_with_more_value_dims_than_tokens_get_one_note_not_failures():
    mod = rnn.SymmetricAttention(32, 2).eval()  # head dim 16 > N = 5 tokens: no KPCA
    with AttentionCapture(mod) as cap:
        mod(torch.randn(2, 5, 32))
    res = analyze_captures(cap.captures, "exact")
    assert res["failures"] == [] and res["layers"][0]["gram"] == "not applicable: Dv=16 > N=5"
    assert res["layers"][0]["jproj"]["n"] == 4  # J_proj still measured


def test_causal_capture_uses_causal_jproj():
    mod = rnn.SymmetricAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    with AttentionCapture(mod) as cap:
        mod(x, is_causal=True)
    c = cap.captures[0]
    res = analyze_captures(cap.captures, "exact", gram=False)
    ref = M.projection_loss(c.k[0], c.k[0], c.v[0], c.scale, causal=True)["jproj"].mean().item()
    noncausal = M.projection_loss(c.k[0], c.k[0], c.v[0], c.scale)["jproj"].mean().item()
    assert res["layers"][0]["jproj"]["mean"] == pytest.approx(ref, rel=1e-10)
    assert ref != pytest.approx(noncausal)


def test_run_analysis_writes_json_summary_figures_and_pap_study(tmp_path):
    m = _rpc_vit(lambd=0.2)  # small threshold: S is non-zero at random init
    x01 = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    probe = image_probe(m, x01, [0.5], [0.25], torch.tensor([0, 1, 2, 3]), {"source": "test", "model": "tiny"})
    res = run_analysis(probe, tmp_path, protocols=("paper", "exact"), figures=False)
    data = json.loads((tmp_path / "kpca.json").read_text())
    assert set(data["protocols"]) == {"paper", "exact"}
    assert "65x16" in data["chance"]
    assert set(data["pap"]) >= {"clean", "fgsm", "noise", "settings"}
    assert list(data["pap"]["clean"]) == ["blocks.0.attn"]
    assert data["pap"]["fgsm"]["blocks.0.attn"]["rel_norm"] > 0
    text = (tmp_path / "summary.md").read_text()
    for word in ("`paper`", "`exact`", "chance", "Rule:", "sparse part"):
        assert word in text
    assert "||" not in text  # markdown tables stay intact
    assert "figures" not in res
    # figures (matplotlib is slow: one protocol)
    from rpc_attention.kpca.plots import make_figures

    res["protocols"].pop("paper")
    res["history"] = [{"epoch": e, "jproj/exact/model/jproj": 1.0 / e, "jproj/exact/model/phi2": 0.1,
                       "jproj/exact/model/h2": 0.1 - 1.0 / e} for e in (1, 2)]
    files = make_figures(res, tmp_path)
    assert sorted(files) == ["alignment_layers.png", "gamma_axes.png", "jproj_history.png", "jproj_terms.png",
                             "pap_sparse.png"]
    for f in files:
        assert (tmp_path / f).stat().st_size > 1000, f


def test_summary_verdicts_follow_rules():
    def mk(opt, cka, j, phi2, h2, learned, pert, rnd):
        gam = {"learned": {"mean": learned}, "perturbed": {"mean": pert}, "random": {"mean": rnd},
               "eigvec": {"mean": 0.0}}
        return {"layers": [], "model": {"optimal_cosine": {"mean": opt}, "linear_cka": {"mean": cka},
                                        "rbf_cka": {"mean": cka}, "jproj": {"mean": j, "std": 0.0},
                                        "phi2": {"mean": phi2}, "h2": {"mean": h2}, "gamma": gam}}

    chance = {"10x4": {k: {"mean": 0.2, "std": 0.01} for k in ("optimal_cosine", "linear_cka", "rbf_cka", "direct_cosine")}}
    res = {"meta": {"source": "t"}, "chance": chance, "failures": [],
           "protocols": {"exact": mk(0.95, 0.9, 0.5, 1.0, 0.5, 1e-9, 1e-6, 1.0),
                         "paper": mk(0.21, 0.2, -1.0, 1e-3, 2.0, 0.9, 1e-6, 1.0)},
           "history": [{"epoch": 1, "jproj/exact/model/jproj": 1.0, "jproj/exact/model/phi2": 1.0, "jproj/exact/model/h2": 0.0},
                       {"epoch": 2, "jproj/exact/model/jproj": 0.5, "jproj/exact/model/phi2": 1.0, "jproj/exact/model/h2": 0.5}]}
    text = summary_markdown(res)
    assert "supports" in text and "consistent with eigenvectors" in text
    assert "no metric exceeds the chance level" in text and "no better than random" in text
    assert "negative" in text and "dominated by \u2016h\u2016^2" in text
    assert "driven by \u2016h\u2016^2" in text


def test_pap_stats_values():
    mod = rnn.RPCAttention(16, 2, n_iter=2, lambd=0.5).eval()
    with AttentionCapture(mod) as cap:
        mod(torch.randn(2, 6, 16))
    st = pap_stats(cap.captures)[""]
    s = cap.captures[0].pap["sparse"]
    assert st["zero_fraction"] == pytest.approx(float((s == 0).double().mean()))
    assert st["rel_norm"] == pytest.approx(float(s.norm() / cap.captures[0].k_raw.norm()))
    assert st["n_iter_run"] == 2


def test_jproj_callback_logs_both_protocols(tmp_path, fake_logger, fake_task):
    from rpc_attention.kpca import register_callbacks
    from rpc_attention.kpca.jproj_callback import jproj_callback, jproj_record
    from rpc_attention.train.callbacks import get_callback
    from rpc_attention.train.tasks import register_task

    register_callbacks()
    assert get_callback("jproj") is jproj_callback
    register_task("kpca-test-fake", fake_task(10), overwrite=True)
    m = _rpc_vit()
    cfg = {"task": "kpca-test-fake", "train": {"jproj_examples": 3}}
    log = fake_logger
    jproj_callback(m, cfg, 1, tmp_path, log)
    jproj_callback(m, cfg, 2, tmp_path, log)
    assert [r["epoch"] for r in log.records] == [1, 2]
    rec = log.records[0]
    for proto in ("paper", "exact"):
        for t in ("jproj", "phi2", "h2"):
            assert isinstance(rec[f"jproj/{proto}/model/{t}"], float)
            assert f"jproj/{proto}/blocks.1.attn/{t}" in rec
    with AttentionCapture(m) as cap, torch.no_grad():
        m(fake_task(10).build_datasets(None)["val"].tensors[0][:3])
    assert jproj_record(cap.captures)["jproj/exact/model/jproj"] == pytest.approx(rec["jproj/exact/model/jproj"])


def test_analyze_cli_timm_hf_and_errors(tmp_path, capsys):
    out = tmp_path / "timm"
    rc = main(["analyze", "--timm", "vit_tiny_patch16_224", "--timm-kwarg", "img_size=32", "--timm-kwarg", "patch_size=4",
               "--timm-kwarg", "depth=1", "--timm-kwarg", "embed_dim=32", "--timm-kwarg", "num_heads=2", "--limit", "2", "--out", str(out), "--no-figures", "--protocol", "exact"])
    assert rc == 0
    data = json.loads((out / "kpca.json").read_text())
    assert list(data["protocols"]) == ["exact"] and data["meta"]["source"] == "timm"
    assert data["protocols"]["exact"]["layers"][0]["optimal_cosine"]["n"] == 2 * 2
    assert main(["analyze", "--run", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert main(["analyze", "--hf", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_language_model_causal_capture():
    from rpc_attention.models.lm import Symlm, SymlmConfig

    torch.manual_seed(0)
    cfg = SymlmConfig(vocab_size=50, n_layer=2, d_model=32, n_head=2, d_inner=64, context=40, dropout=0.0,
                      rpc_layers=[0], n_iter=2, cutoffs=[], adaptive=False)
    lm = Symlm(cfg).eval()
    with AttentionCapture(lm) as cap, torch.no_grad():
        lm(torch.randint(0, 50, (2, 40)))
    assert not cap.errors and [c.kind for c in cap.captures] == ["rpc", "symmetric"]
    assert all(c.causal for c in cap.captures)
    for c in cap.captures:
        # float64 recomputation vs the float32 forward: that forward's rounding, a few eps of its scale
        atol = 64 * torch.finfo(torch.float32).eps * c.output.abs().max().item()
        torch.testing.assert_close(c.module_output(), c.output, atol=atol, rtol=0)
    res = analyze_captures(cap.captures, "exact")
    assert res["failures"] == [] and res["layers"][0]["causal"]
    c = cap.captures[1]
    ref = torch.cat([M.projection_loss(c.k[b], c.k[b], c.v[b], c.scale, causal=True)["jproj"] for b in range(2)])
    assert res["layers"][1]["jproj"]["n"] == 4
    assert res["layers"][1]["jproj"]["mean"] == pytest.approx(ref.mean().item(), rel=1e-10)


def test_gram_analysis_not_applicable_is_one_warning_not_failures(tmp_path, caplog):
    """Head dimension 32 > 17 tokens (the 3-head Fashion-MNIST presets): KPCA cannot run; one warning
    before the work, one line in summary.md, no failures, no matplotlib warning, J_proj still measured."""
    import warnings

    torch.manual_seed(0)
    m = timm.create_model("symvit_tiny_patch16_224", img_size=16, patch_size=4, in_chans=1, embed_dim=64,
                          depth=2, num_heads=2, num_classes=4).eval()
    x01 = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    probe = image_probe(m, x01, [0.5], [0.25], torch.tensor([0, 1, 2]), {"source": "test", "model": "tiny"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (matplotlib's empty legends) fails the test
        with caplog.at_level("WARNING", logger="rpc_attention"):
            res = run_analysis(probe, tmp_path, protocols=("exact",), figures=True)
    notes = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(notes) == 1 and "Dv=32 > N=17" in notes[0] and "every layer" in notes[0]
    assert res["failures"] == [] and res["not_applicable"] == notes[0]
    layer = res["protocols"]["exact"]["layers"][0]
    assert layer["gram"] == "not applicable: Dv=32 > N=17" and "optimal_cosine" not in layer
    assert layer["jproj"]["n"] == 3 * 2
    text = (tmp_path / "summary.md").read_text()
    assert text.count("Dv=32 > N=17") == 1 and "Failures" not in text and "varphi" not in text


def test_analyze_cli_reports_the_command_time(tmp_path, capsys, monkeypatch):
    """The printed time covers the model loading, not only the analysis."""
    import time as _time

    from rpc_attention.kpca import sources

    real = sources.probe_from_timm

    def slow_probe(*a, **k):
        _time.sleep(0.5)
        return real(*a, **k)

    monkeypatch.setattr(sources, "probe_from_timm", slow_probe)
    assert main(["analyze", "--timm", "symvit_tiny_patch16_224", "--set", "model.kwargs.img_size=32",
                 "--set", "model.kwargs.patch_size=8", "--set", "model.kwargs.depth=1", "--limit", "2",
                 "--no-figures", "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    seconds = float(last.split(" in ")[-1].split(" s")[0])
    assert seconds >= 0.5, last


def test_analyze_keeps_an_earlier_analysis_unless_force(tmp_path, capsys):
    out = tmp_path / "a"
    argv = ["analyze", "--timm", "vit_tiny_patch16_224", "--set", "model.kwargs.img_size=16",
            "--set", "model.kwargs.patch_size=4", "--set", "model.kwargs.depth=1", "--set", "model.kwargs.embed_dim=16",
            "--set", "model.kwargs.num_heads=2", "--limit", "2", "--out", str(out), "--no-figures", "--protocol", "exact"]
    assert main(argv) == 0
    out.joinpath("kpca.json").write_text("EARLIER")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds an analysis" in err and "--force" in err
    assert out.joinpath("kpca.json").read_text() == "EARLIER"
    assert main(argv + ["--force"]) == 0
    assert json.loads(out.joinpath("kpca.json").read_text())["meta"]["source"] == "timm"


def test_random_init_probes_are_seeded_and_leave_the_global_rng_alone():
    from rpc_attention.kpca.sources import probe_from_hf, probe_from_timm

    kw = dict(img_size=16, patch_size=8, depth=1, embed_dim=16, num_heads=2)
    state = torch.random.get_rng_state()
    a, b = probe_from_timm("vit_tiny_patch16_224", limit=1, **kw), probe_from_timm("vit_tiny_patch16_224", limit=1, **kw)
    other = probe_from_timm("vit_tiny_patch16_224", limit=1, seed=1, **kw)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wo = (p.model.blocks[0].attn.qkv.weight for p in (a, b, other))
    assert torch.equal(wa, wb) and not torch.equal(wa, wo)
    assert a.description["weights"] == "random init (seed 0)"
    ha, hb = probe_from_hf("bert-tiny-config", limit=1, seq_len=8), probe_from_hf("bert-tiny-config", limit=1, seq_len=8)
    for (name, pa), pb in zip(ha.model.named_parameters(), hb.model.parameters()):
        assert torch.equal(pa, pb), name
