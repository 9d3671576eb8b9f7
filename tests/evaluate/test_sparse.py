"""The ``sparse`` suite: salt-and-pepper pixels, patch occlusion, sparse key corruption in block 1."""

import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the timm models)
from rpc_attention import nn as rnn
from rpc_attention.evaluate.sparse import (
    KeyCorruption,
    SparseSupport,
    first_attention,
    occlude_patches,
    salt_and_pepper,
)
from rpc_attention.evaluate.suites import get_suite, resolve_options, run_suite


def _images(n=6, seed=0):
    return torch.rand(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed)) * 0.5 + 0.25


def test_salt_and_pepper_sets_exactly_the_share_of_pixels_to_black_or_white():
    x = _images()  # every pixel in [0.25, 0.75]: a changed pixel is one set to 0 or 1
    out = salt_and_pepper(x, 0.05, seed=1)
    changed = out != x
    assert changed.flatten(1).sum(1).tolist() == [round(0.05 * 784)] * 6
    assert set(out[changed].unique().tolist()) == {0.0, 1.0}
    # deterministic and independent of batching; another seed draws other pixels
    assert torch.equal(salt_and_pepper(x[2:5], 0.05, seed=1, offset=2), out[2:5])
    assert not torch.equal(salt_and_pepper(x, 0.05, seed=2), out)
    rgb = salt_and_pepper(_images().repeat(1, 3, 1, 1), 0.1)
    assert torch.equal(rgb[:, 0], rgb[:, 1]) and torch.equal(rgb[:, 0], rgb[:, 2])  # whole pixels
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        salt_and_pepper(x, 1.5)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_occlusion_fills_k_distinct_patches_of_the_grid(k):
    x = _images()
    out = occlude_patches(x, k, patch=7, fill=0.0, seed=3)
    cells = (out != x).reshape(6, 4, 7, 4, 7).permute(0, 1, 3, 2, 4).reshape(6, 16, 49)
    whole = cells.all(-1)
    assert whole.sum(1).tolist() == [k] * 6 and (cells.any(-1) == whole).all()  # whole patches only
    assert (out[out != x] == 0).all()
    assert torch.equal(occlude_patches(x[3:], k, 7, 0.0, seed=3, offset=3), out[3:])
    with pytest.raises(ValueError, match="cannot occlude 17"):
        occlude_patches(x, 17, 7)


def _key_parts(module, x, slot, corrupt=None):
    """(keys, the other chunks) the block's qkv projection hands on, with or without the hook."""
    seen = {}
    h = module.qkv.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
    try:
        module(x)
    finally:
        h.remove()
    b, n, w = seen["out"].shape
    parts = seen["out"].reshape(b, n, -1, module.dim if hasattr(module, "dim") else w // 3)
    others = [parts[:, :, i] for i in range(parts.shape[2]) if i != slot]
    return parts[:, :, slot], others


@pytest.mark.parametrize("cls,slot", [(rnn.RPCAttention, 0), (rnn.SymmetricAttention, 0), (rnn.Attention, 1)])
def test_key_corruption_moves_5_percent_of_keys_by_5_std(cls, slot):
    torch.manual_seed(0)
    model = torch.nn.Sequential(cls(32, num_heads=2).double().eval())
    x = torch.randn(8, 50, 32, dtype=torch.float64)
    keys, others = _key_parts(model[0], x, slot)
    with KeyCorruption(model, 0.05, 5.0, seed=0) as kc:
        assert (kc.name, kc.slot) == ("0", slot)
        bad_keys, bad_others = _key_parts(model[0], x, slot)
    assert not model[0].qkv._forward_hooks  # removed on exit
    for a, b in zip(others, bad_others):
        assert torch.equal(a, b)  # values (and queries of asymmetric blocks) untouched
    delta = bad_keys - keys
    hit = delta != 0
    share = hit.double().mean().item()
    assert abs(share - 0.05) < 4 * (0.05 * 0.95 / hit.numel()) ** 0.5  # binomial, 4 sigma
    for i in range(8):
        # +-5 std of the example's own clean keys, float64 round-off only
        torch.testing.assert_close(delta[i][hit[i]].abs(), torch.full_like(delta[i][hit[i]], 5 * keys[i].std().item()))
    # seeded per example: example 3 alone at offset 3 gets the same corruption
    with KeyCorruption(model, 0.05, 5.0, seed=0) as kc:
        kc.offset = 3
        one, _ = _key_parts(model[0], x[3:4], slot)
    # (float64: the projection of one example and of eight differ by round-off, ~1e-16 relative)
    torch.testing.assert_close(one[0], bad_keys[3], rtol=1e-12, atol=1e-12)


def test_key_corruption_finds_the_first_block_of_timm_and_rpc_models():
    rpc = timm.create_model("rpc_symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, embed_dim=32,
                            depth=2, num_heads=2, num_classes=10, rpc_layers=[1])
    assert first_attention(rpc)[0::2] == ("blocks.0.attn", 0)
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    assert first_attention(vit)[0::2] == ("blocks.0.attn", 1)
    with pytest.raises(ValueError, match="fused qkv"):
        first_attention(torch.nn.Linear(3, 3))


def test_sparse_suite_reports_every_setting(tiny_model):  # skips without Fashion-MNIST (the fixture)
    model, cfg = tiny_model
    suite = get_suite("sparse")
    opts = resolve_options(suite, {}, limit=64)
    rec = run_suite(suite, model, cfg, None, opts)
    m = rec["metrics"]
    names = ["top1_salt_pepper@2%", "top1_salt_pepper@5%", "top1_salt_pepper@10%", "top1_occlusion@1",
             "top1_occlusion@2", "top1_occlusion@4", "top1_keys@5%"]
    assert {k for k in m if not k.startswith("s_")} == {"top1_clean", "mean_top1_input", "mean_top1_keys", *names}
    assert m["mean_top1_keys"] == m["top1_keys@5%"]
    # the tiny model's first block runs PAP: S's support is scored against the corrupted entries
    assert set(rec["key_sparse"]) == {"top1_keys@5%"} and rec["key_sparse"]["top1_keys@5%"]["corrupted_entries"] > 0
    # input-level settings and the synthetic key corruption are averaged apart, never together
    assert m["mean_top1_input"] == pytest.approx(sum(m[k] for k in names[:6]) / 6, rel=1e-12)
    assert set(rec["per_example"]["metrics"]["mean_top1_input"]["settings"]) == set(names[:6])
    assert rec["per_example"]["metrics"]["mean_top1_keys"]["settings"] == ["top1_keys@5%"]
    assert [r["level"] for r in rec["rows"]][1:4] == ["2% of pixels", "5% of pixels", "10% of pixels"]
    assert rec["n_examples"] == 64 and rec["settings"]["patch_size"] == 7
    # the clean row is the clean suite's number on the same images; reruns agree exactly
    clean = run_suite(get_suite("clean"), model, cfg, None, resolve_options(get_suite("clean"), {}, limit=64))
    assert m["top1_clean"] == clean["metrics"]["top1"]
    assert run_suite(suite, model, cfg, None, opts)["metrics"] == m
    with pytest.raises(ValueError, match="sparse.occlusion"):
        suite.check(cfg, resolve_options(suite, {"sparse.occlusion": "1.5"}))


def test_per_head_key_corruption_is_sized_by_each_heads_std_and_last_hit_has_the_heads_layout():
    torch.manual_seed(0)
    model = torch.nn.Sequential(rnn.SymmetricAttention(32, num_heads=2).double().eval())
    with torch.no_grad():
        model[0].qkv.weight[:16] *= 10  # head 0's keys 10x larger than head 1's
    x = torch.randn(4, 40, 32, dtype=torch.float64)
    keys, _ = _key_parts(model[0], x, 0)
    with KeyCorruption(model, 0.1, 3.0, seed=0, per_head=True) as kc:
        bad, _ = _key_parts(model[0], x, 0)
        last_hit = kc.last_hit
    delta = (bad - keys).reshape(4, 40, 2, 16)
    assert torch.equal(last_hit, (delta != 0).transpose(1, 2))
    for i in range(4):
        for h in range(2):
            d = delta[i, :, h][delta[i, :, h] != 0].abs()
            want = 3.0 * keys[i].reshape(40, 2, 16)[:, h].std().item()
            torch.testing.assert_close(d, torch.full_like(d, want), rtol=1e-12, atol=1e-12)


def test_sparse_support_counts_the_entries_pap_took_against_the_corrupted_ones():
    torch.manual_seed(0)
    layer = rnn.RPCAttention(32, num_heads=2, n_iter=2, threshold="mad", lambd=6.0, lowrank="keys", shrink="hard",
                             dual_step=0.0).double().eval()
    model = torch.nn.Sequential(layer)
    x = torch.randn(3, 40, 32, dtype=torch.float64)
    seen = []
    with KeyCorruption(model, 0.05, 50.0, seed=0) as kc, SparseSupport(kc) as support:
        layer.register_forward_hook(lambda m, a, o: seen.append(((m.last_state.sparse != 0), kc.last_hit)))
        model(x)
    taken, hit = seen[0]
    both = int((taken & hit).sum())
    scores = support.scores()
    assert scores["precision"] == both / int(taken.sum()) and scores["recall"] == both / int(hit.sum())
    assert scores["recall"] == 1.0 and scores["precision"] > 0.9  # 50 std: every corrupted entry is taken
    assert layer.keep_state is False and layer.last_state is None  # restored
    with KeyCorruption(torch.nn.Sequential(rnn.SymmetricAttention(32, 2)), 0.05, 5.0) as kc2, SparseSupport(kc2) as s2:
        assert s2.scores() == {}  # no PAP block: nothing to score


def test_key_magnitude_list_gives_a_dose_response_with_its_own_metric_names(tiny_model):
    model, cfg = tiny_model
    suite = get_suite("sparse")
    opts = dict(resolve_options(suite, {"sparse.key_magnitude": "5,100"}, limit=32), salt_pepper=[], occlusion=[])
    rec = run_suite(suite, model, cfg, None, opts)
    assert {k for k in rec["metrics"] if k.startswith("top1_keys")} == {"top1_keys@5%x5std", "top1_keys@5%x100std"}
    assert set(rec["key_sparse"]) == {"top1_keys@5%x5std", "top1_keys@5%x100std"}
    assert "mean_top1_input" not in rec["metrics"]  # no input-level setting ran: no input mean
    assert rec["metrics"]["mean_top1_keys"] == pytest.approx(
        (rec["metrics"]["top1_keys@5%x5std"] + rec["metrics"]["top1_keys@5%x100std"]) / 2, rel=1e-12)
    single = run_suite(suite, model, cfg, None, dict(opts, key_magnitude=[100.0]))
    assert single["metrics"]["top1_keys@5%"] == rec["metrics"]["top1_keys@5%x100std"]
    for bad in ({"sparse.key_magnitude": "5,5"}, {"sparse.key_per_head": "true", "sparse.key_fraction": "0"}):
        with pytest.raises(ValueError, match="key_"):
            suite.check(cfg, resolve_options(suite, bad))
