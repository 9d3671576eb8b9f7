"""Hooks give the same q, k, v as the modules' own forward (output recomputed from the capture)."""

import os

import pytest
import torch

import rpc_attention.models  # noqa: F401  (registers our models in timm)
from rpc_attention import functional as RF
from rpc_attention import nn as rnn
from rpc_attention.kpca.hooks import AttentionCapture, find_attention_modules


def _x(b=2, n=7, c=16, seed=0):
    return torch.randn(b, n, c, generator=torch.Generator().manual_seed(seed))


def f32_atol(reference: torch.Tensor, budget: int = 64) -> float:
    """Tolerance for a float64 recomputation against the float32 forward it mirrors: the float32 side is
    off by its own rounding, a few eps of the output scale (measured <= 2.4 eps max|y| for our layers, one
    to three passes, 1-3 threads); `budget` eps leaves room for other CPUs and the library models."""
    return budget * torch.finfo(torch.float32).eps * reference.abs().max().item()


def _check(cap, y):
    assert not cap.errors, cap.errors
    assert len(cap.captures) == 1
    c = cap.captures[0]
    torch.testing.assert_close(c.output, y.double(), atol=0, rtol=0)  # the captured tensor itself
    torch.testing.assert_close(c.module_output(), y.double(), atol=f32_atol(y), rtol=0)
    return c


@pytest.mark.parametrize("is_causal", [False, True])
def test_rpc_nn_attention_and_symmetric(is_causal):
    x = _x()
    for mod in (rnn.Attention(16, 2, qkv_bias=True), rnn.SymmetricAttention(16, 2, qkv_bias=True)):
        mod.eval()
        with AttentionCapture(mod) as cap:
            y = mod(x, is_causal=is_causal)
        c = _check(cap, y)
        assert c.causal == is_causal
        # q, k, v equal the module's own split
        # the hook's projection rounds differently from the module's fused one (measured 3.3e-7 on |k| ~ 2)
        parts = [p.double() for p in mod._split(x)]
        torch.testing.assert_close(c.k, parts[-2], atol=f32_atol(parts[-2], 16), rtol=0)
        torch.testing.assert_close(c.v, parts[-1], atol=f32_atol(parts[-1], 16), rtol=0)
        if isinstance(mod, rnn.SymmetricAttention):
            assert c.symmetric and c.q is c.k
        else:
            torch.testing.assert_close(c.q, parts[0], atol=f32_atol(parts[0], 16), rtol=0)


def test_rpc_attention_records_pap_state_and_restores_flag():
    x = _x(seed=1)
    mod = rnn.RPCAttention(16, 2, n_iter=3).eval()
    with AttentionCapture(mod) as cap:
        assert mod.keep_state
        y = mod(x)
    assert mod.keep_state is False and mod.last_state is None
    c = _check(cap, y)
    k, v = mod._split(x)
    _, state = RF.pap_attention(k, v, n_iter=3, lambd=4.0, model_dim=16, return_state=True)
    for got, want in ((c.k, state.cleaned_keys), (c.k_raw, k), (c.pap["sparse"], state.sparse)):
        torch.testing.assert_close(got, want.double(), atol=f32_atol(want, 16), rtol=0)


@pytest.mark.parametrize("mode", ["s", "alpha"])
def test_scaled_attention_effective_values(mode):
    x = _x(seed=2)
    mod = rnn.ScaledAttention(16, 2, mode=mode, num_tokens=7).eval()
    with torch.no_grad():
        if mode == "s":
            mod.s_matrix.normal_(std=0.2)
        else:
            mod.alpha.fill_(0.4)
    with AttentionCapture(mod) as cap:
        y = mod(x)
    c = _check(cap, y)
    assert c.v_eff is not None and not torch.allclose(c.v_eff, c.v)
    if mode == "s":
        torch.testing.assert_close(c.v_eff, c.v - mod.s_matrix.detach().double() @ c.v)


def test_padding_mask_is_captured():
    x = _x(seed=3)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    mod = rnn.SymmetricAttention(16, 2).eval()
    with AttentionCapture(mod) as cap:
        y = mod(x, attn_mask=mask)
    c = _check(cap, y)
    assert c.key_valid(0) is None
    assert c.key_valid(1).tolist() == [True] * 5 + [False] * 2


def test_additive_masks_are_read_by_the_kernel_normaliser_and_biases_refused():
    """timm's Attention takes any float mask as an additive bias. A 0/-inf one is captured as the bool
    mask it means; a bias (other values) is refused and reported, not taken for "attend everywhere"."""
    from timm.models.vision_transformer import Attention

    mod = Attention(16, num_heads=2).eval()
    x = _x(seed=4)
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    with AttentionCapture(mod) as cap:
        mod(x, attn_mask=additive)
    assert not cap.errors and torch.equal(cap.captures[0].mask, keep.expand(2, 1, 7, 7))
    bias = torch.randn(1, 2, 7, 7, generator=torch.Generator().manual_seed(5))
    with AttentionCapture(mod) as cap:
        mod(x, attn_mask=bias)
    assert cap.captures == [] and len(cap.errors) == 1
    assert "not an attention bias" in cap.errors[0]["error"]


def test_timm_vit_hooks_match_forward():
    import timm

    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                          num_classes=3).eval()
    assert [n for n, _, _ in find_attention_modules(m)] == ["blocks.0.attn", "blocks.1.attn"]
    with AttentionCapture(m) as cap, torch.no_grad():
        m(torch.randn(2, 3, 32, 32))
    assert not cap.errors and len(cap.captures) == 2
    for c in cap.captures:
        assert c.kind == "timm" and c.q.shape == (2, 3, 17, 64)
        torch.testing.assert_close(c.module_output(), c.output, atol=f32_atol(c.output), rtol=0)


def test_our_vision_models_are_found():
    import timm

    m = timm.create_model("rpc_symvit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=32, depth=2,
                          num_heads=2, num_classes=3, rpc_layers=[0], n_iter=2).eval()
    kinds = [k for _, _, k in find_attention_modules(m)]
    assert kinds == ["rpc", "symmetric"]
    with AttentionCapture(m) as cap, torch.no_grad():
        m(torch.randn(2, 3, 16, 16))
    assert not cap.errors
    for c in cap.captures:
        torch.testing.assert_close(c.module_output(), c.output, atol=f32_atol(c.output), rtol=0)


def test_hf_bert_and_vit_hooks_match_forward_and_cli(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertConfig, BertModel, ViTConfig, ViTModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                vocab_size=100)).eval()
    ids = torch.randint(0, 100, (2, 9))
    am = torch.ones(2, 9, dtype=torch.long)
    am[1, 6:] = 0
    with AttentionCapture(bert) as cap, torch.no_grad():
        bert(input_ids=ids, attention_mask=am)
    assert not cap.errors and len(cap.captures) == 2
    for c in cap.captures:
        assert c.kind == "hf" and c.key_valid(1).tolist() == [True] * 6 + [False] * 3
        diff = (c.module_output() - c.output).abs()
        tol = f32_atol(c.output[0]), f32_atol(c.output[1, :6])  # padded query rows are irrelevant
        assert diff[0].max() <= tol[0] and diff[1, :6].max() <= tol[1]
    vit = ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8)).eval()
    with AttentionCapture(vit) as cap, torch.no_grad():
        vit(pixel_values=torch.randn(2, 3, 32, 32))
    assert not cap.errors and len(cap.captures) == 2
    for c in cap.captures:
        torch.testing.assert_close(c.module_output(), c.output, atol=f32_atol(c.output), rtol=0)
    # the CLI on a built-in config (same test: transformers is imported once)
    import json

    from rpc_attention.cli import main

    out = tmp_path / "hf"
    rc = main(["analyze", "--hf", "bert-tiny-config", "--seq-len", "80", "--limit", "2", "--out", str(out),
               "--no-figures"])
    assert rc == 0
    data = json.loads((out / "kpca.json").read_text())
    assert len(data["protocols"]["paper"]["layers"]) == 2 and data["failures"] == []
    assert data["protocols"]["exact"]["layers"][0]["tokens"] == 80


@pytest.mark.parametrize("qk_norm", [False, True])
def test_timm_capture_computes_q_k_v_in_float64(qk_norm):
    """q, k, v come from the hooked input and the layer's weights in float64 (the module's own float32
    projection differs by its rounding), q_norm / k_norm included: a float64 reference written out."""
    from timm.models.vision_transformer import Attention

    torch.manual_seed(0)
    mod = Attention(16, num_heads=2, qkv_bias=True, qk_norm=qk_norm, norm_layer=torch.nn.LayerNorm).eval()
    if qk_norm:
        for norm in (mod.q_norm, mod.k_norm):
            norm.weight.data.uniform_(0.5, 1.5)
            norm.bias.data.uniform_(-0.5, 0.5)
    x = _x(seed=6)
    with AttentionCapture(mod) as cap:
        mod(x)
    c = cap.captures[0]
    w, bias = mod.qkv.weight.double(), mod.qkv.bias.double()
    ref = torch.zeros(3, 2, 2, 7, 8, dtype=torch.float64)  # (q|k|v, batch, head, token, dim)
    for b in range(2):
        for i in range(7):
            row = w @ x[b, i].double() + bias
            for part in range(3):
                for h in range(2):
                    ref[part, b, h, i] = row[part * 16 + h * 8: part * 16 + (h + 1) * 8]
    if qk_norm:
        for part, norm in ((0, mod.q_norm), (1, mod.k_norm)):
            t = ref[part]
            z = (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + norm.eps)
            ref[part] = z * norm.weight.double() + norm.bias.double()
    for got, want in zip((c.q, c.k, c.v), ref):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)  # float64 rounding, values O(1)
    # the module's float32 projection, cast, is farther off than float64 rounding
    f32 = mod.qkv(x).reshape(2, 7, 3, 2, 8).permute(2, 0, 3, 1, 4)[2].double()
    assert (f32 - c.v).abs().max() > 1e-9
