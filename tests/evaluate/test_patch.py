"""The ``patch`` suite: adversarial patches on the patch grid, against a float64 from-scratch loop, its
sanity checks (more steps or patches never help the model, a whole-image patch is an unbounded attack),
its adaptive BPDA variant on a robust PAP model and on the key controls, and the controls switched on in a
trained run from the command line (``eval --model-set``)."""

import json

import pytest
import timm
import torch
import torch.nn.functional as F
from suite_run import run_named_suite

import rpc_attention.models  # noqa: F401  (registers the timm models)
from rpc_attention import functional as RF
from rpc_attention import nn as rnn
from rpc_attention.cli import main
from rpc_attention.evaluate.inputs import Normalized
from rpc_attention.evaluate.patch import (
    PatchAttack,
    PatchOptions,
    TokenAttention,
    Variant,
    _attack_examples,
    _attention_probs,
    bpda_surrogate,
    candidate_cells,
    cell_mask,
    cell_saliency,
    has_nondifferentiable_pap,
    patch_grid,
    patch_pgd,
)
from rpc_attention.evaluate.per_example import example_scores, has_example_record

MEAN, STD = 0.3, 0.4
ROBUST = {"threshold": "mad", "lowrank": "keys", "shrink": "hard", "dual_step": 0.0, "lambd": 2.0}


def _tiny64(name="symvit_tiny_patch16_224", **kw):
    """An untrained float64 ViT on 8x8 one-channel images: patch 4, a 2x2 grid, 3 classes."""
    torch.manual_seed(0)
    model = timm.create_model(name, img_size=8, patch_size=4, in_chans=1, embed_dim=16, depth=2, num_heads=2,
                              num_classes=3, **kw)
    with torch.no_grad():
        model.head.weight.mul_(30.0)  # logits that a patch can move within a few steps
    return Normalized(model.double().eval(), torch.tensor([MEAN]), torch.tensor([STD]))


def _reference(model, x, y, cells, steps, step, weight, seed):
    """The patch PGD written out per example in float64: paste the patch, take the loss (cross-entropy
    plus ``weight`` x the attention mass on the patch token, from the keys each block's qkv projection
    returns), step the patch pixels by the sign of the gradient, stop at the first misclassified
    iterate."""
    values = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)).double()
    keys = []
    blocks = [m for m in model.modules() if isinstance(m, rnn.SymmetricAttention)]
    hooks = [m.qkv.register_forward_hook(lambda mod, a, out: keys.append(out)) for m in blocks]
    out, broken = [], []
    try:
        for b in range(len(y)):
            r, c = divmod(int(cells[b, 0]), 2)
            patch = values[b, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].clone()
            for i in range(steps + 1):
                patch.requires_grad_(True)
                img = x[b:b + 1].clone()
                img[0, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = patch
                keys.clear()
                logits = model(img)
                if logits.argmax(-1).item() != y[b].item() or i == steps:
                    break
                mass = 0.0
                for blk, out_qkv in zip(blocks, keys):
                    k = out_qkv[0, :, :16].reshape(5, 2, 8).transpose(0, 1)  # (heads, tokens, head dim)
                    attn = torch.softmax(blk.scale * k @ k.transpose(-1, -2), dim=-1)
                    mass = mass + attn[:, :, 1 + int(cells[b, 0])].mean() / len(blocks)
                loss = F.cross_entropy(logits, y[b:b + 1], reduction="sum") + weight * mass
                (g,) = torch.autograd.grad(loss, patch)
                patch = (patch.detach() + step * g.sign()).clamp(0, 1)
            out.append(img.detach()[0])
            broken.append(logits.argmax(-1).item() != y[b].item())
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(out), torch.tensor(broken)


@pytest.mark.parametrize("weight", [0.0, 3.0])
def test_patch_pgd_matches_a_float64_loop(weight):
    model = _tiny64()
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        model.model.head.bias.sub_(model(x).mean(0))  # near ties, which a patch can break in a few steps
        y = model(x).argmax(-1)  # every example starts correct
    cells = torch.tensor([[0], [1], [2], [3], [1], [2]])
    grid = patch_grid(model.model, x.shape)
    assert (grid.patch, grid.rows, grid.cols, grid.prefix) == (4, 2, 2, 1)
    attack = PatchAttack(steps=6, step_size=0.2, attention_weight=weight)
    with TokenAttention(model) as attention:
        adv, broken = patch_pgd(model, model, x, y, cell_mask(cells, grid, x), attack,
                                torch.Generator().manual_seed(5), attention, cells + grid.prefix)
    ref, ref_broken = _reference(model, x, y, cells, 6, 0.2, weight, 5)
    assert torch.equal(broken, ref_broken) and broken.any()
    torch.testing.assert_close(adv, ref, rtol=0, atol=1e-12)  # float64, same operations: exact up to rounding
    outside = cell_mask(cells, grid, x) == 0
    assert torch.equal(adv[outside.expand_as(adv)], x[outside.expand_as(x)])  # only the patch changed
    assert adv.min() >= 0 and adv.max() <= 1


def test_bpda_surrogate_is_an_explicit_copy_with_the_same_weights():
    model = _tiny64("rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=2, **ROBUST)
    for kind, cls in (("symmetric", rnn.SymmetricAttention), ("soft", rnn.RPCAttention)):
        sur = bpda_surrogate(model, kind)
        blk, orig = sur.model.blocks[0].attn, model.model.blocks[0].attn
        assert type(blk) is cls and torch.equal(blk.qkv.weight, orig.qkv.weight)
        assert kind == "symmetric" or (blk.shrink, blk.threshold, blk.lowrank) == ("soft", "mad", "keys")
        assert orig.shrink == "hard" and blk.qkv.weight.data_ptr() != orig.qkv.weight.data_ptr()
    with pytest.raises(ValueError, match="surrogate"):
        bpda_surrogate(model, "none")


def test_bpda_runs_only_where_pap_has_steps_without_a_gradient():
    assert has_nondifferentiable_pap(_tiny64("rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=2, **ROBUST))
    assert has_nondifferentiable_pap(_tiny64("rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=2, shrink="hard"))
    assert not has_nondifferentiable_pap(_tiny64("rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=6))  # official
    assert not has_nondifferentiable_pap(_tiny64())


def _run(model, cfg, limit, **sets):
    return run_named_suite("patch", model, cfg, limit, **sets)


def test_accuracy_falls_with_steps_and_patches(tiny_model):  # skips without Fashion-MNIST (the fixture)
    model, cfg = tiny_model
    few = _run(model, cfg, 40, steps="1", restarts="1", patches="1,2,4", losses="ce", bpda="none")
    many = _run(model, cfg, 40, steps="4", restarts="1", patches="1", losses="ce", bpda="none")
    m = few["metrics"]
    for name, value in m.items():  # every metric has its per-example record, for the paired intervals
        assert has_example_record("patch", name)
        assert example_scores(few["per_example"], name).mean() == pytest.approx(value)
    assert m["clean_top1"] > m["top1@1patch"] > m["top1@2patch"] >= m["top1@4patch"]
    bits = few["per_example"]["correct"]  # per example too: broken with fewer patches, broken with more
    assert all(a >= b >= c for a, b, c in zip(bits["top1@1patch"], bits["top1@2patch"], bits["top1@4patch"]))
    # one restart, the same seed: the first step of the longer run is the short run's
    short = few["per_example"]["correct"]["top1@1patch"]
    long_ = many["per_example"]["correct"]["top1@1patch"]
    assert all(a >= b for a, b in zip(short, long_)) and many["metrics"]["top1@1patch"] < m["top1@1patch"]


def test_the_location_search_tries_every_cell_and_the_top_half_pairs():
    saliency = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4], [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    one = candidate_cells(saliency, 1)
    assert one.shape == (2, 8, 1) and one[0, :, 0].tolist() == [1, 6, 4, 2, 7, 3, 5, 0]  # most salient first
    assert sorted(one[1, :, 0].tolist()) == list(range(8))
    two = candidate_cells(saliency, 2)
    assert two.shape == (2, 6, 2)  # every pair among the top half (4 cells)
    assert {frozenset(p) for p in two[0].tolist()} == {frozenset(p) for p in ([1, 6], [1, 4], [1, 2], [6, 4], [6, 2],
                                                                               [4, 2])}
    assert candidate_cells(saliency, 8).shape == (2, 1, 8)  # more patches than the half: every cell


def _search_reference(model, x, y, k, grid, attack, seed, restarts):
    """The location search one example at a time: every candidate location and restart in turn, each from
    its own seeded start, until one breaks the example."""
    locations = candidate_cells(cell_saliency(model, x, y, grid), k)
    out = []
    for b in range(len(y)):
        survived = True
        for loc in range(locations.shape[1]):
            for r in range(restarts):
                start = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed * 1_000_003 + 7919 * loc + r))
                cells = locations[b:b + 1, loc]
                _, broken = patch_pgd(model, model, x[b:b + 1].detach(), y[b:b + 1], cell_mask(cells, grid, x), attack,
                                      None, None, None, start=start[b:b + 1])
                if broken.item():
                    survived = False
                    break
            if not survived:
                break
        out.append(survived)
    return torch.tensor(out)


def test_the_search_equals_every_location_tried_one_example_at_a_time():
    model = _tiny64()
    x = torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(1)).double()
    with torch.no_grad():
        model.model.head.bias.sub_(model(x).mean(0))
        y = model(x).argmax(-1)
    grid = patch_grid(model.model, x.shape)
    opts = {"device": "cpu", "batch_size": 64, "steps": 1, "step_size": 0.02, "attention_weight": 0.0, "restarts": 2}
    for k in (1, 2):
        got = _attack_examples(model, model, x, y, k, grid, Variant("ce"), opts, seed=3)
        ref = _search_reference(model, x, y, k, grid, PatchAttack(1, 0.02, 0.0), 3, 2)
        assert torch.equal(got, ref) and got.any() and not got.all()


def test_more_steps_or_restarts_never_raise_accuracy(tiny_model):
    model, cfg = tiny_model
    runs = {(steps, restarts): _run(model, cfg, 40, steps=str(steps), restarts=str(restarts), patches="1", losses="ce",
                                    bpda="none")["per_example"]["correct"]["top1@1patch"]
            for steps, restarts in ((1, 1), (3, 1), (1, 2))}
    for more in ((3, 1), (1, 2)):  # each example broken with less is broken with more (a superset of trajectories)
        assert all(a >= b for a, b in zip(runs[(1, 1)], runs[more]))


def test_a_patch_covering_the_image_is_an_unbounded_attack(tiny_model):
    model, cfg = tiny_model
    rec = _run(model, cfg, 30, steps="10", restarts="1", patches="16", losses="ce", bpda="none")
    assert rec["metrics"]["clean_top1"] == 30.0 and rec["metrics"]["top1@16patch"] == 0.0


def test_bpda_changes_the_result_on_a_robust_pap_model(robust_tiny_model):
    robust, cfg = robust_tiny_model  # robust PAP (hard threshold, medians) in its one block
    # Which examples break depends on float rounding in the trained model (thread count, CPU), so the
    # claim is checked over three attack lengths together: somewhere the surrogate's gradient breaks an
    # example the defended model's own gradient does not, and the adaptive accuracy is lower in total.
    gained, plain_total, adaptive_total = 0, 0.0, 0.0
    for steps in ("1", "2", "4"):
        plain = _run(robust, cfg, 40, steps=steps, restarts="1", patches="1", losses="ce", bpda="none")
        adaptive = _run(robust, cfg, 40, steps=steps, restarts="1", patches="1", losses="ce")
        assert plain["settings"]["variants"] == ["ce"] and adaptive["settings"]["variants"] == ["ce", "ce_bpda"]
        bits = adaptive["per_example"]["correct"]
        assert bits["top1@1patch_ce"] == plain["per_example"]["correct"]["top1@1patch_ce"]  # the same seeded variant
        gained += sum(a == "1" and b == "0" for a, b in zip(bits["top1@1patch_ce"], bits["top1@1patch_ce_bpda"]))
        assert adaptive["metrics"]["top1@1patch"] <= plain["metrics"]["top1@1patch"]  # the worst variant counts
        plain_total += plain["metrics"]["top1@1patch"]
        adaptive_total += adaptive["metrics"]["top1@1patch"]
    assert gained > 0 and adaptive_total < plain_total


def test_options_are_checked_up_front():
    for bad, match in (({"losses": ["ce", "margin"]}, "losses"), ({"patches": [0.0]}, "whole numbers"), ({"patches": [1.0, 1.0]}, "distinct"),
                       ({"bpda": "exact"}, "bpda"), ({"steps": 0}, "steps")):
        with pytest.raises(ValueError, match=match):
            PatchOptions(**bad)


@pytest.mark.parametrize("control", ["clip", "drop"])
def test_the_attention_loss_reads_the_controlled_attention(control):
    model = _tiny64(key_control=control, key_control_level=0.5).model
    blk = model.blocks[0].attn
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    k, _ = blk.qkv(x).reshape(3, 5, 2, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
    # the attention matrix is the controlled attention's output on identity values
    eye = torch.eye(5, dtype=torch.float64).expand(3, 2, 5, 5)
    ref = RF.controlled_symmetric_attention(k, eye, control, 0.5, fused=False)
    torch.testing.assert_close(_attention_probs(blk, x), ref, rtol=0, atol=1e-12)
    if control == "drop":  # the level is low enough that some token is dropped
        assert (ref == 0).any()


def test_bpda_covers_the_key_controls():
    for control in ("clip", "drop"):
        model = _tiny64(key_control=control)
        assert has_nondifferentiable_pap(model)
        sur = bpda_surrogate(model)
        blk, orig = sur.model.blocks[0].attn, model.model.blocks[0].attn
        assert type(blk) is rnn.SymmetricAttention and blk.key_control == "" and orig.key_control == control
        assert torch.equal(blk.qkv.weight, orig.qkv.weight) and blk.qkv.weight.data_ptr() != orig.qkv.weight.data_ptr()


def test_a_key_control_on_a_trained_run_changes_the_patch_result(sym_run, tmp_path):
    args = ["--suite", "patch", "--limit", "40", "--set", "patch.steps=2", "--set", "patch.restarts=1",
            "--set", "patch.patches=1", "--set", "patch.losses=ce"]
    assert main(["eval", "--run", str(sym_run), "--out", str(tmp_path / "plain"), *args]) == 0
    assert main(["eval", "--run", str(sym_run), "--model-set", "key_control=clip", "--model-set",
                 "key_control_level=0.3", "--out", str(tmp_path / "clip"), *args]) == 0
    plain = json.loads((tmp_path / "plain" / "patch.json").read_text())
    clip = json.loads((tmp_path / "clip" / "patch.json").read_text())
    assert clip["source"]["model_kwargs"] == {"key_control": "clip", "key_control_level": 0.3}
    assert "model_kwargs" not in plain["source"]
    assert plain["settings"]["variants"] == ["ce"] and clip["settings"]["variants"] == ["ce", "ce_bpda"]
    assert clip["per_example"]["correct"] != plain["per_example"]["correct"]


@pytest.mark.parametrize("extra, message", [
    (["--model-set", "key_control=clip"], "give --out DIR"),
    (["--model-set", "model.kwargs.key_control=clip", "--out", "X"], "not a dotted key"),
    (["--model-set", "key_control", "--out", "X"], "KEY=VALUE"),
    (["--model-set", "key_control=median", "--out", "X"], "key_control must be one of"),
    (["--model-set", "no_such_option=1", "--out", "X"], "no_such_option"),
])
def test_bad_model_keywords_are_one_clear_error(sym_run, tmp_path, capsys, extra, message):
    extra = [str(tmp_path / "out") if a == "X" else a for a in extra]
    assert main(["eval", "--run", str(sym_run), "--suite", "clean", "--limit", "4", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out" / "clean.json").exists()
