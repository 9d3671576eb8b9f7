"""The ``certify`` suite: the mask set covers every patch (brute force over small grids), a dropped token
takes no part in the model (against the same model run on the kept tokens alone, float64, for symmetric
attention, PAP on both paths, robust PAP and the key controls), the double-masking decision and the
certificate against loops written from the definition, and the certificate against the strongest patch
attack the library has, on a tiny trained run."""

import os

import numpy as np
import pytest
import timm
import torch
from suite_run import run_named_suite

import rpc_attention.models  # noqa: F401  (registers the timm models)
from rpc_attention.evaluate.certify import (
    CertifyOptions,
    DefenceAttack,
    attack_defence,
    attack_positions,
    certified,
    defended_predictions,
    double_masking,
    pair_predictions,
)
from rpc_attention.evaluate.masking import (
    MaskedClassifier,
    axis_windows,
    check_token_dropping,
    kept_tokens,
    mask_set,
    token_extent,
)
from rpc_attention.evaluate.patch import PatchGrid, Variant, bpda_surrogate, patch_grid
from rpc_attention.evaluate.per_example import example_scores, has_example_record

ROBUST = {"threshold": "mad", "lowrank": "keys", "shrink": "hard", "dual_step": 0.0, "lambd": 2.0}


# ------------------------------------------------------------------------------------------ geometry
def _touched(rows, cols, token, top, left, pixels):
    """The cells a patch overlaps, from its pixels (a pixel image pooled per cell)."""
    img = np.zeros((rows * token, cols * token), dtype=bool)
    img[top:top + pixels, left:left + pixels] = True
    return img.reshape(rows, token, cols, token).any(axis=(1, 3))


@pytest.mark.parametrize("token", [2, 3, 7])
def test_every_patch_position_lies_inside_a_mask(token):
    for rows in range(2, 6):
        for cols in range(2, 6):
            grid = PatchGrid(token, rows, cols, 1)
            for pixels in range(1, token * min(rows, cols) + 1):
                extent = token_extent(pixels, token)
                positions = [(t, u) for t in range(rows * token - pixels + 1) for u in range(cols * token - pixels + 1)]
                touched = [_touched(rows, cols, token, t, u, pixels) for t, u in positions]
                # the extent is the most rows (and columns) of tokens one patch overlaps, where the image has them
                assert min(extent, rows) == max(int(m.any(1).sum()) for m in touched)
                assert min(extent, cols) == max(int(m.any(0).sum()) for m in touched)
                for per_axis in (0, 1, 2, 3):
                    masks = mask_set(grid, "patch", pixels, per_axis).dropped.numpy().reshape(-1, rows, cols)
                    for m in touched:
                        assert (~(m[None] & ~masks).any(axis=(1, 2))).any(), (rows, cols, pixels, per_axis)
            # the token threat: every single token inside a mask
            for per_axis in (0, 2):
                masks = mask_set(grid, "token", 0, per_axis).dropped
                assert masks.any(0).all() and masks.sum(1).min() >= 1


def test_mask_windows_and_counts():
    assert axis_windows(4, 2, 1) == [(0, 2), (1, 3), (2, 4)]
    assert axis_windows(4, 1, 2) == [(0, 2), (2, 4)]
    assert axis_windows(5, 2, 2) == [(0, 3), (2, 5)]
    grid = PatchGrid(7, 4, 4, 1)
    assert mask_set(grid, "patch").count == 9 and mask_set(grid, "token").count == 16
    assert mask_set(grid, "patch", 7, 2).count == 4  # 3x3-token masks, two per axis
    assert "9 masks of 2x2 tokens" in mask_set(grid, "patch").describe()
    with pytest.raises(ValueError, match="token threat"):
        mask_set(grid, "token", 5)
    with pytest.raises(ValueError, match="does not fit"):
        mask_set(grid, "patch", 29)


# ------------------------------------------------------------------------------------------ dropping tokens
def _vit(name="symvit_tiny_patch16_224", **kw):
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=12, patch_size=3, in_chans=1, embed_dim=16, depth=2, num_heads=2,
                              num_classes=3, **kw)
    return model.double().eval()


def _kept_tokens_logits(vit, x, dropped):
    """The model run on the kept tokens alone, image by image (the dropped ones removed from the sequence)."""
    out = []
    for b in range(len(x)):
        t = vit._pos_embed(vit.patch_embed(x[b:b + 1]))
        keep = [i for i in range(t.shape[1]) if i < vit.num_prefix_tokens or not dropped[b, i - vit.num_prefix_tokens]]
        t = vit.norm_pre(t[:, keep])
        for blk in vit.blocks:
            t = blk(t)
        out.append(vit.forward_head(vit.norm(t)))
    return torch.cat(out)


MODELS = {
    "symvit": ("symvit_tiny_patch16_224", {}),
    "rpc6_fused": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 6}),
    "rpc6_reference": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 6, "fused_attn": False}),
    "robust": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 2, **ROBUST}),
    "robust_rows": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 2, **ROBUST, "row_lambd": 1.0}),
    "pcp_all": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": "all", "n_iter": 3, "threshold": "lambda_over_mu",
                                                "lambd": 0.5}),
    "clip": ("symvit_tiny_patch16_224", {"key_control": "clip", "key_control_level": 0.5}),
    "drop": ("symvit_tiny_patch16_224", {"key_control": "drop", "key_control_level": 0.5}),
}


@pytest.mark.parametrize("key", list(MODELS))
def test_a_dropped_token_takes_no_part(key):
    name, kw = MODELS[key]
    if key == "rpc6_reference":  # every block's attention on the explicit path
        vit = _vit(name, **{k: v for k, v in kw.items() if k != "fused_attn"})
        for blk in vit.blocks:
            blk.attn.fused_attn = False
    else:
        vit = _vit(name, **kw)
    grid = patch_grid(vit, (1, 12, 12))
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(5, 1, 12, 12, generator=gen).double()
    dropped = torch.rand(5, 16, generator=gen) < 0.4
    dropped[0] = False  # nothing dropped: the plain model
    ref = _kept_tokens_logits(vit, (x - 0.25) / 0.5, dropped)
    pix = dropped.double().view(5, 1, 4, 4).repeat_interleave(3, 2).repeat_interleave(3, 3)
    other = x * (1 - pix) + torch.rand(x.shape, generator=gen).double() * 5 * pix
    # the shortened sequence (rows padded to the batch's longest) and the full one under the key mask
    for gather in (True, False):
        model = MaskedClassifier(vit, torch.tensor([0.25]), torch.tensor([0.5]), grid, gather=gather).double()
        logits = model(x, dropped)
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(logits[:1], vit((x[:1] - 0.25) / 0.5), rtol=0, atol=1e-12)
        # any pixels under the dropped cells give exactly the same logits
        assert torch.equal(model(other, dropped), logits)
        # one row alone, unpadded, gives its logits in the batch
        torch.testing.assert_close(model(x[3:4], dropped[3:4]), logits[3:4], rtol=0, atol=1e-10)


def test_kept_tokens_shortens_each_row_in_order():
    dropped = torch.tensor([[False, True, False, True], [True, True, True, False], [False] * 4])
    index, key_mask = kept_tokens(dropped, prefix=1)
    assert index.tolist() == [[0, 1, 3, 0, 0], [0, 4, 0, 0, 0], [0, 1, 2, 3, 4]]
    assert key_mask[:, 0, 0].tolist() == [[True] * 3 + [False] * 2, [True] * 2 + [False] * 3, [True] * 5]
    index, key_mask = kept_tokens(dropped[:2] | torch.tensor([True, True, False, False]), prefix=2)
    assert index.tolist() == [[0, 1, 4], [0, 1, 5]] and key_mask is None  # same length: no key mask
    vit = _vit()
    grid = patch_grid(vit, (1, 12, 12))
    with pytest.raises(ValueError, match="gather=True .* leave gather unset"):
        MaskedClassifier(vit, torch.tensor([0.25]), torch.tensor([0.5]), grid, "pixels", gather=True)
    # the attention loss needs every token at its place
    short = MaskedClassifier(vit, torch.tensor([0.25]), torch.tensor([0.5]), grid)
    masks = mask_set(grid, "patch", 3)
    with pytest.raises(ValueError, match="gather=False"):
        attack_defence(short, {"model": short}, torch.rand(1, 1, 12, 12), torch.zeros(1, dtype=torch.long), masks,
                       [Variant("attention", "model")], [(0, 0)], DefenceAttack(steps=1), {"device": "cpu",
                       "batch_size": 64}, 3, seed=0)


def test_token_dropping_is_refused_where_it_would_leak():
    with pytest.raises(ValueError, match="global_pool='token'"):
        check_token_dropping(timm.create_model("symvit_tiny_patch16_224", img_size=12, patch_size=3, in_chans=1,
                                               embed_dim=16, depth=1, num_heads=2, global_pool="avg"))
    check_token_dropping(_vit())


def test_pixel_masking_fills_the_masked_cells():
    vit = _vit()
    grid = patch_grid(vit, (1, 12, 12))
    model = MaskedClassifier(vit, torch.tensor([0.25]), torch.tensor([0.5]), grid, "pixels", fill=0.5).double()
    x = torch.rand(2, 1, 12, 12, generator=torch.Generator().manual_seed(3)).double()
    dropped = torch.zeros(2, 16, dtype=torch.bool)
    dropped[:, 5] = True
    filled = x.clone()
    filled[:, :, 3:6, 3:6] = 0.5
    torch.testing.assert_close(model(x, dropped), vit((filled - 0.25) / 0.5), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------ decision
def _decision_reference(table, num_classes):
    """Double masking written out from the definition for one image: (label, forward passes)."""
    m = len(table)
    singles = [int(table[i][i]) for i in range(m)]
    if len(set(singles)) == 1:
        return singles[0], m
    counts = [singles.count(c) for c in range(num_classes)]
    majority = counts.index(max(counts))
    passes = m
    for i in range(m):
        if singles[i] == majority:
            continue
        passes += m - 1
        if all(int(table[i][j]) == singles[i] for j in range(m)):
            return singles[i], passes
    return majority, passes


def test_double_masking_and_the_certificate_against_loops():
    gen = torch.Generator().manual_seed(0)
    for m, classes in ((4, 2), (9, 3), (9, 2), (16, 4)):
        up = torch.randint(0, classes, (400, m, m), generator=gen)
        # mostly one label with a few others, so every branch of the decision is taken
        up = torch.where(torch.rand(400, m, m, generator=gen) < 0.85, torch.zeros_like(up), up)
        up[:50] = torch.randint(0, classes, (50, 1, 1), generator=gen)  # unanimous images
        table = torch.triu(up) + torch.triu(up, 1).transpose(1, 2)
        labels, passes = double_masking(table, classes)
        y = torch.randint(0, classes, (400,), generator=gen)
        y[:100] = 0
        cert = certified(table, y)
        for b in range(400):
            ref_label, ref_passes = _decision_reference(table[b].tolist(), classes)
            assert (int(labels[b]), int(passes[b])) == (ref_label, ref_passes)
            assert bool(cert[b]) == all(int(v) == int(y[b]) for v in table[b].flatten())
            if cert[b]:
                assert labels[b] == y[b]  # a certified example is classified right on the clean image
        assert cert.any() and (~cert).any()


def test_pair_predictions_and_the_deployed_decision_against_a_loop():
    vit = _vit("rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=2)
    with torch.no_grad():
        vit.head.weight.mul_(40.0)  # predictions that differ between masks
    grid = patch_grid(vit, (1, 12, 12))
    model = MaskedClassifier(vit, torch.tensor([0.25]), torch.tensor([0.5]), grid).double()
    masks = mask_set(grid, "patch", 3)
    x = torch.rand(4, 1, 12, 12, generator=torch.Generator().manual_seed(2)).double()
    with torch.no_grad():  # near ties, so that the masks disagree
        vit.head.bias.sub_(model(x.repeat_interleave(9, 0), masks.dropped.repeat(4, 1)).mean(0))
    table = pair_predictions(model, x, masks, batch_size=7, device="cpu")
    assert torch.equal(table, table.transpose(1, 2))
    for b in range(4):
        for i in range(masks.count):
            for j in range(i, masks.count):
                union = (masks.dropped[i] | masks.dropped[j])[None]
                assert table[b, i, j] == model(x[b:b + 1], union).argmax(-1)[0]
    assert len(set(table.flatten().tolist())) > 1
    labels, _ = double_masking(table, 3)
    assert torch.equal(defended_predictions(model, x, masks, 5, "cpu", 3), labels)


# ------------------------------------------------------------------------------------------ the suite
def _run(model, cfg, limit, **sets):
    return run_named_suite("certify", model, cfg, limit, **sets)


def test_the_suite_on_a_trained_model(tiny_model):  # skips without Fashion-MNIST (the fixture)
    model, cfg = tiny_model
    rec = _run(model, cfg, 24)
    m = rec["metrics"]
    for name, value in m.items():
        if name.startswith(("clean", "certified", "defended")):
            assert has_example_record("certify", name)
            assert example_scores(rec["per_example"], name).mean() == pytest.approx(value)
    for threat in ("patch", "token"):
        assert m[f"certified_top1_{threat}"] <= m[f"defended_top1_{threat}"]
        bits = rec["per_example"]["correct"]
        assert all(c <= d for c, d in zip(bits[f"certified_top1_{threat}"], bits[f"defended_top1_{threat}"]))
    assert m["certify_passes_patch"] == 45 and m["certify_passes_token"] == 136
    assert 9 <= m["forward_passes_patch"] <= 9 + 9 * 8
    assert "7x7-pixel patch anywhere" in rec["threat_model"]["patch"]
    pixels = _run(model, cfg, 24, masking="pixels", threats="patch")
    assert pixels["per_example"]["correct"]["defended_top1_patch"] != bits["defended_top1_patch"]


def test_options_are_checked_up_front():
    for bad, match in (({"threats": ["patch", "corner"]}, "threats"), ({"masking": "blur"}, "masking"),
                       ({"fill": 0.5}, "masking=pixels"), ({"attack_stride": 2}, "attack_steps=0"),
                       ({"patch_pixels": 5, "threats": ["token"]}, "leaves out"), ({"bpda": "exact"}, "bpda"),
                       ({"attack_steps": 1, "losses": ["margin"]}, "losses")):
        with pytest.raises(ValueError, match=match):
            CertifyOptions(**bad)


# ------------------------------------------------------------------------------------------ the check
@pytest.fixture(scope="module")
def small_runs():
    """Two tiny models on 12x12 Fashion-MNIST images (the centre 24x24 pooled by 2; 3-pixel tokens, a 4x4 grid),
    trained a few seconds with random token drop: SymViT and robust PAP (hard threshold, medians), and 200
    test images."""
    from rpc_attention.evaluate.inputs import load_eval_data
    from rpc_attention.train.task_classification import token_drop_mask

    if not os.path.isdir(os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")):
        pytest.skip("Fashion-MNIST not installed")
    cfg = {"data": {"name": "fashion_mnist", "mean": [0.286], "std": [0.353]}}
    x, y = load_eval_data(cfg, "test", 2400)
    x = torch.nn.functional.avg_pool2d(x[:, :, 2:26, 2:26], 2)
    runs = {}
    for key, kw in (("symvit", {}), ("robust", {"rpc_layers": [0], "n_iter": 2, **ROBUST})):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            vit = timm.create_model("rpc_symvit_tiny_patch16_224" if kw else "symvit_tiny_patch16_224", img_size=12,
                                    patch_size=3, in_chans=1, embed_dim=32, depth=1, num_heads=2, num_classes=10, **kw)
            opt = torch.optim.AdamW(vit.parameters(), 3e-3)
            xt, yt = (x[200:] - 0.286) / 0.353, y[200:]
            for _ in range(3):
                for i in range(0, len(yt), 100):
                    vit.train()
                    logits = vit(xt[i:i + 100], attn_mask=token_drop_mask(vit, xt[i:i + 100], 0.5))
                    loss = torch.nn.functional.cross_entropy(logits, yt[i:i + 100])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        runs[key] = vit.eval()
    return runs, x[:200], y[:200]


@pytest.mark.parametrize("key", ["symvit", "robust"])
def test_no_certified_example_is_broken_by_the_strongest_attack(small_runs, key):
    """Every patch position (stride 1), both losses, the exact gradient through the masked forward passes and,
    on robust PAP, BPDA through the surrogate; 12 steps (the study runs 10); the judge is the discrete decision."""
    runs, x, y = small_runs
    vit = runs[key]
    grid = patch_grid(vit, x.shape)
    stats = (torch.tensor([0.286]), torch.tensor([0.353]))
    judge = MaskedClassifier(vit, *stats, grid)
    masks = mask_set(grid, "patch", 3)
    table = pair_predictions(judge, x, masks, 4096, "cpu")
    labels, _ = double_masking(table, 10)
    cert = certified(table, y)
    assert cert.sum() >= 2 and (labels == y).sum() > cert.sum()
    grads = {"model": MaskedClassifier(vit, *stats, grid, gather=False),
             "bpda": MaskedClassifier(bpda_surrogate(vit), *stats, grid, gather=False)}
    variants = [Variant(loss, g) for g in (["model", "bpda"] if key == "robust" else ["model"]) for loss in ("ce", "attention")]
    positions = attack_positions(grid, masks, 1, (12, 12))
    assert len(positions) == 100  # every position of a 3x3 patch on 12x12 pixels
    opts = {"device": "cpu", "batch_size": 8192}
    idx = cert.nonzero().flatten()[:2]  # the check: certified examples (each one costs every position)
    wrong = ((labels == y) & ~cert).nonzero().flatten()[:2]  # and examples the defence gets right, uncertified
    pick = torch.cat([idx, wrong])
    alive = attack_defence(judge, grads, x[pick], y[pick], masks, variants, positions,
                           DefenceAttack(steps=12, step_size=0.1), opts, 10, seed=0)
    assert alive[:len(idx)].all()  # a certified example broken would be a bug
    assert not alive[len(idx):].all()  # the attack is not idle: it breaks uncertified examples
