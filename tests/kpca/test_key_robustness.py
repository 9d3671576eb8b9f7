"""The layer-level key-corruption benchmark (rpc_attention.kpca.key_robustness, `rpc-attention robustness`):
its metrics against float64 hand computations, its controls, and the command."""

import json
import math
import os

import pytest
import torch

from rpc_attention import functional as RF
from rpc_attention.cli import main
from rpc_attention.kpca import key_robustness as KR

FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def test_relative_change_and_support_scores_by_hand():
    ref = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # norm 5
    assert KR.relative_change(torch.tensor([[3.0, 5.0]], dtype=torch.float64), ref) == pytest.approx(0.2, abs=1e-15)
    sparse = torch.tensor([0.0, 2.0, -1.0, 0.0, 3.0])
    hit = torch.tensor([False, True, False, True, True])
    # found {1, 2, 4}, hit {1, 3, 4}: 2 true positives of 3 found, of 3 hit
    assert KR.support_scores(sparse, hit) == pytest.approx((2 / 3, 2 / 3))
    assert KR.support_scores(torch.zeros(5), hit) == (1.0, 0.0)


def test_corruption_is_seeded_sized_and_per_example():
    keys = torch.randn(3, 2, 50, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    keys[1] *= 10
    a, hit = KR.corrupt_keys(keys, 0.2, 7.0, seed=3)
    b, hit_b = KR.corrupt_keys(keys, 0.2, 7.0, seed=3)
    assert torch.equal(a, b) and torch.equal(hit, hit_b)
    assert 0.15 < float(hit.double().mean()) < 0.25
    for i in range(3):
        delta = (a[i] - keys[i])[hit[i]].abs()
        torch.testing.assert_close(delta, torch.full_like(delta, 7.0 * float(keys[i].std())), rtol=0, atol=1e-12)
    assert not (a - keys)[~hit].any()
    assert not torch.equal(KR.corrupt_keys(keys, 0.2, 7.0, seed=4)[1], hit)


def test_clip_and_oracle_by_hand():
    # one head, tokens 0, 1, 2, 10 in feature 0 and 0, 0, 0, 0 in feature 1
    k = torch.tensor([[[[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [10.0, 0.0]]]], dtype=torch.float64)
    # lower medians 1 and 0; |k - m| = 1, 0, 1, 9, 0, 0, 0, 0 -> lower median 0 -> scale floored at 1e-12
    clipped = RF.clip_keys(k, 4.0)
    assert clipped[0, 0, :, 0].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=1e-9)
    hit = torch.zeros_like(k, dtype=torch.bool)
    hit[0, 0, 3, 0] = True
    # the others in feature 0 are 0, 1, 2: median 1
    assert KR.oracle_keys(k, hit)[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 1.0]
    k2 = torch.tensor([[[[0.0], [1.0], [2.0], [3.0], [100.0]]]], dtype=torch.float64)
    # median 2, |k - 2| = 2, 1, 0, 1, 98: median 1, scale 1.4826: clip at 2 +- 5.9304
    assert RF.clip_keys(k2, 4.0)[0, 0, :, 0].tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0, 2 + 4 * 1.4826])


def test_oracle_is_exactly_the_floor_on_exactly_low_rank_keys():
    # rank one with constant columns: every token's key is the same, so the per-feature median of the
    # uncorrupted entries is the clean value and the oracle repairs the keys exactly
    g = torch.Generator().manual_seed(1)
    keys = torch.ones(2, 2, 20, 1, dtype=torch.float64) * torch.randn(2, 2, 1, 6, generator=g, dtype=torch.float64)
    values = torch.randn(2, 2, 20, 6, generator=g, dtype=torch.float64)
    spec = KR.parse_variant("official")
    grid = KR.robustness_grid(keys, values, [spec], [10.0], [0.05], seed=0)
    methods = grid["cells"][0]["methods"]
    assert methods["oracle"]["r"] == 0.0 and methods["oracle"]["key_error"] == 0.0
    assert min(m["r"] for name, m in methods.items() if name != "oracle") > 0


def test_grid_is_deterministic_and_the_robust_variant_beats_clipping_on_large_outliers():
    keys, values = KR.synthetic_keys(batch=2, heads=2, tokens=32, head_dim=8, rank=2, seed=0)
    variants = [KR.parse_variant(v) for v in KR.DEFAULT_VARIANTS]
    a = KR.robustness_grid(keys, values, variants, [30.0], [0.05], seed=0)
    assert a == KR.robustness_grid(keys, values, variants, [30.0], [0.05], seed=0)
    m = a["cells"][0]["methods"]
    assert m["robust"]["r"] < m["clip"]["r"] and m["robust"]["precision"] > 0.9 and m["robust"]["recall"] > 0.9
    dev = a["clean_deviation"]
    assert dev["symmetric"] == dev["oracle"] == 0.0 and 0 < dev["robust"] < dev["official"]
    # the r of the official PAP is the hand-computed one
    clean = RF.pap_attention(keys, values, n_iter=6, lambd=4.0)
    dirty = RF.pap_attention(KR.corrupt_keys(keys, 0.05, 30.0, 0)[0], values, n_iter=6, lambd=4.0)
    assert m["official"]["r"] == pytest.approx(float((dirty - clean).norm() / clean.norm()), rel=1e-12)


@pytest.mark.parametrize("text, match", [("symmetric", "name other than"), ("x=lowrank:svd", "lowrank"),
                                         ("x=n_iter:two", "n_iter must be a number"), ("x=color:red", "key:value"),
                                         ("x=dual_step:0,n_iter:1", "dual_step")])
def test_bad_variants_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        KR.parse_variant(text)


def test_parse_variant_reads_options():
    spec = KR.parse_variant("r=threshold:mad,lambd:8,lowrank:keys,shrink:hard,dual_step:0,n_iter:3")
    assert spec.options == {"n_iter": 3, "lambd": 8.0, "threshold": "mad", "lowrank": "keys", "shrink": "hard",
                            "dual_step": 0.0}


def test_token_and_feature_corruption_pick_whole_rows_and_columns():
    keys = torch.randn(4, 3, 20, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    corrupted, hit = KR.corrupt_keys(keys, 0.1, 9.0, seed=1, pattern="tokens")
    rows = hit.all(dim=-1).all(dim=1)  # (B, N): tokens hit in every head and feature
    assert torch.equal(hit, rows[:, None, :, None].expand_as(hit)) and rows.sum(dim=1).tolist() == [2, 2, 2, 2]
    assert len({tuple(r.nonzero().flatten().tolist()) for r in rows}) > 1  # drawn per example
    for b in range(4):
        delta = (corrupted[b] - keys[b])[hit[b]].abs()
        torch.testing.assert_close(delta, torch.full_like(delta, 9.0 * float(keys[b].std())), rtol=0, atol=1e-12)
    _, cols = KR.corrupt_keys(keys, 0.1, 9.0, seed=1, pattern="features")
    per_col = cols.all(dim=2)  # (B, H, d): features hit at every token
    assert torch.equal(cols, per_col[:, :, None, :].expand_as(cols))
    assert per_col.flatten(1).sum(dim=1).tolist() == [2, 2, 2, 2]  # round(0.1 * 15) of the H d = 15 features
    assert KR.corrupt_keys(keys, 0.1, 9.0, seed=1, pattern="tokens")[0].equal(corrupted)
    with pytest.raises(ValueError, match="pattern"):
        KR.corrupt_keys(keys, 0.1, 9.0, pattern="rows")


def test_drop_control_masks_the_outlier_token_and_reports_the_others():
    keys, values = KR.synthetic_keys(batch=2, heads=2, tokens=24, head_dim=8, rank=8, noise=0.0, seed=0)
    corrupted, hit = KR.corrupt_keys(keys, 0.04, 50.0, seed=0, pattern="tokens")  # one token per example
    keep = RF.key_drop_mask(corrupted, 6.0)
    assert torch.equal(~keep[:, :, 0, :], hit.all(dim=-1))
    spec = KR.parse_variant("robust=threshold:mad,lambd:6,lowrank:keys,shrink:hard,dual_step:0,n_iter:2,row_lambd:6")
    grid = KR.robustness_grid(keys, values, [spec], [50.0], [0.04], patterns=("tokens",))
    m = grid["cells"][0]["methods"]
    dropped = RF.symmetric_attention(corrupted, values, attn_mask=keep)
    clean_drop = RF.symmetric_attention(keys, values, attn_mask=RF.key_drop_mask(keys, 6.0))
    assert m["drop"]["r"] == pytest.approx(KR.relative_change(dropped, clean_drop), rel=1e-12)
    others = ~hit.any(dim=-1)
    assert m["robust"]["r_others"] == pytest.approx(
        KR.relative_change(RF.pap_attention(corrupted, values, **spec.options)[others],
                           RF.pap_attention(keys, values, **spec.options)[others]), rel=1e-12)
    assert m["robust"]["recall"] == 1.0 and m["robust"]["r_others"] < m["clip"]["r_others"]


TINY = ["--batch", "2", "--heads", "2", "--tokens", "12", "--head-dim", "4", "--rank", "2",
        "--magnitudes", "5,50", "--densities", "0.1"]


def test_cli_writes_table_json_and_figure_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "rob"
    assert main(["robustness", "--out", str(out), *TINY]) == 0
    assert "| tokens | 10 % | 50 |" in capsys.readouterr().out
    data = json.loads((out / "robustness.json").read_text())
    cells = data["sources"][0]["cells"]
    assert [(c["pattern"], c["magnitude"]) for c in cells] == [(p, m) for p in KR.PATTERNS for m in (5.0, 50.0)]
    assert set(cells[0]["methods"]) == {"symmetric", "clip", "drop", "oracle", "official", "robust", "rows", "values8"}
    assert "r_others" in cells[2]["methods"]["robust"] and "r_others" not in cells[0]["methods"]["robust"]
    assert (out / "robustness.png").stat().st_size > 1000 and "| density |" in (out / "robustness.md").read_text()
    before = (out / "robustness.json").read_text()
    assert main(["robustness", "--out", str(out), *TINY, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert (out / "robustness.json").read_text() == before
    assert main(["robustness", "--out", str(out), *TINY, "--seed", "1", "--force"]) == 0


@pytest.mark.parametrize("bad, match", [(["--densities", "1.5"], "densities"), (["--variant", "x=shrink:firm"], "shrink"),
                                        (["--no-synthetic"], "nothing to measure"), (["--run", "/nonexistent"], ""),
                                        (["--variant", "a", "--variant", "a"], "distinct"), (["--clip", "0"], "clipping"),
                                        (["--patterns", "rows"], "patterns"), (["--drop", "-1"], "drop level")])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, bad, match):
    assert main(["robustness", "--out", str(tmp_path / "o"), *TINY, *bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and not (tmp_path / "o" / "robustness.json").exists()


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")
def test_keys_of_a_run_are_the_first_block_keys(tmp_path):
    import timm
    import yaml
    from safetensors.torch import save_file

    import rpc_attention.models  # noqa: F401

    kwargs = {"num_classes": 10, "img_size": 28, "in_chans": 1, "patch_size": 7, "embed_dim": 16, "depth": 1,
              "num_heads": 2}
    cfg = {"task": "classification", "model": {"name": "symvit_tiny_patch16_224", "kwargs": kwargs},
           "data": {"name": "fashion_mnist", "mean": [0.286], "std": [0.353], "num_classes": 10, "in_chans": 1,
                    "img_size": 28}}
    torch.manual_seed(0)
    model = timm.create_model(cfg["model"]["name"], **kwargs).eval()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    keys, values, name = KR.run_keys(tmp_path, examples=3)
    assert name == "blocks.0.attn" and keys.shape == (3, 2, 17, 8) and keys.dtype == torch.float64
    assert math.isfinite(float(keys.sum())) and values.shape == keys.shape
