"""SymViT family in timm's registry: builds, forward/backward, RPC placement, checkpoint layout, init."""


import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the models in timm)
from rpc_attention.models import MODEL_NAMES, load_official_checkpoint
from rpc_attention.models.vision import SymViT, resolve_rpc_layers
from rpc_attention.nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention

SMALL = dict(num_classes=7, img_size=16, patch_size=8, in_chans=1, embed_dim=16, depth=2, num_heads=2)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_builds_runs_and_backprops(name):
    torch.manual_seed(0)
    m = timm.create_model(name, **SMALL)
    assert isinstance(m, SymViT)
    x = torch.randn(3, 1, 16, 16)
    y = m(x)
    assert y.shape == (3, 7)
    y.square().mean().backward()
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert m.pretrained_cfg["architecture"] == name
    assert m.pretrained_cfg["rpc_cfg"] == m.rpc_cfg


def test_registered_in_timm():
    listed = set(timm.list_models("*symvit*")) | set(timm.list_models("scaled*"))
    assert set(MODEL_NAMES) <= listed


@pytest.mark.parametrize("name,width,heads", [
    ("symvit_tiny_patch16_224", 192, 3), ("symvit_small_patch16_224", 384, 6), ("symvit_base_patch16_224", 768, 12)])
def test_default_sizes(name, width, heads):
    # depth=1 keeps it cheap; small is DeiT-small's 384 (the official SymViT-small's 348 is built by
    # load_official_checkpoint, tests/models/test_official_checkpoints.py)
    m = timm.create_model(name, depth=1)
    assert m.embed_dim == width and m.blocks[0].attn.num_heads == heads
    assert m.patch_embed.num_patches == 196 and m.pos_embed.shape == (1, 197, width)
    assert m.blocks[0].norm1.eps == 1e-6 and m.norm.eps == 1e-6
    assert m.blocks[0].attn.qkv.bias is not None
    assert m.num_classes == 1000


def test_full_depth_defaults_and_rpc_placement():
    m = timm.create_model("rpc_symvit_tiny_patch16_224", img_size=32, embed_dim=12, num_heads=3)
    assert len(m.blocks) == 12
    assert isinstance(m.blocks[0].attn, RPCAttention)
    assert m.blocks[0].attn.n_iter == 6 and m.blocks[0].attn.lambd == 4.0
    assert all(type(b.attn) is SymmetricAttention for b in m.blocks[1:])
    assert m.rpc_cfg["rpc_layers"] == [0] and m.rpc_cfg["n_iter"] == 6
    for name in ("rpc_symvit_small_patch16_224", "rpc_symvit_base_patch16_224"):
        m = timm.create_model(name, img_size=32, embed_dim=12, num_heads=3, depth=3)
        assert all(isinstance(b.attn, RPCAttention) and b.attn.n_iter == 2 for b in m.blocks)
    m = timm.create_model("symvit_tiny_patch16_224", img_size=32, embed_dim=12, num_heads=3, depth=3)
    assert all(type(b.attn) is SymmetricAttention for b in m.blocks) and m.rpc_cfg["rpc_layers"] == []


def test_rpc_only_in_configured_blocks_and_options_passed():
    m = timm.create_model("rpc_symvit_tiny_patch16_224", **dict(SMALL, depth=4), rpc_layers=[1, 3], n_iter=3,
                          lambd=2.5, threshold="lambda_over_mu", mu_mode="head_dim", tol=1e-4)
    kinds = [type(b.attn) for b in m.blocks]
    assert kinds == [SymmetricAttention, RPCAttention, SymmetricAttention, RPCAttention]
    for i in (1, 3):
        a = m.blocks[i].attn
        assert (a.n_iter, a.lambd, a.threshold, a.mu_mode, a.tol) == (3, 2.5, "lambda_over_mu", "head_dim", 1e-4)
    r = repr(m)
    assert "rpc_layers=[1, 3]" in r and "n_iter=3" in r
    # the RPC blocks really run PAP: one iteration with a huge lambda is plain symmetric attention
    # (clamp(k, -tau, tau) with tau -> inf), a small lambda changes the output
    x = torch.randn(2, 1, 16, 16)
    a = timm.create_model("rpc_symvit_tiny_patch16_224", **SMALL, rpc_layers="all", n_iter=1, lambd=1e9).eval()
    b = timm.create_model("symvit_tiny_patch16_224", **SMALL).eval()
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(x), b(x), rtol=1e-5, atol=1e-5)
    c = timm.create_model("rpc_symvit_tiny_patch16_224", **SMALL, rpc_layers="all", n_iter=3, lambd=0.1).eval()
    c.load_state_dict(a.state_dict())
    assert not torch.allclose(c(x), b(x), atol=1e-4)


@pytest.mark.parametrize("bad,needle", [([5], "5"), ([0, -1], "-1"), ("first", "first"), ([1.5], "1.5")])
def test_bad_rpc_layers_rejected_up_front(bad, needle):
    with pytest.raises(ValueError, match="rpc_layers") as exc:
        timm.create_model("rpc_symvit_tiny_patch16_224", **SMALL, rpc_layers=bad)
    assert needle in str(exc.value)


@pytest.mark.parametrize("kw", [dict(n_iter=0), dict(lambd=-1.0), dict(threshold="x"), dict(mu_mode="nope")])
def test_bad_pap_options_rejected(kw):
    with pytest.raises(ValueError):
        timm.create_model("rpc_symvit_tiny_patch16_224", **SMALL, **kw)


def test_rpc_layers_forms():
    assert resolve_rpc_layers("all", 3) == [0, 1, 2]
    assert resolve_rpc_layers(None, 3) == [] and resolve_rpc_layers("none", 3) == []
    assert resolve_rpc_layers(2, 3) == [2] and resolve_rpc_layers("0,2", 3) == [0, 2]
    with pytest.raises(ValueError, match="rpc_layers"):
        timm.create_model("scaled_vit_tiny_patch16_224", **SMALL, rpc_layers=[0])


def test_scaled_models():
    m = timm.create_model("scaled_vit_tiny_patch16_224", **SMALL)
    a = m.blocks[0].attn
    assert isinstance(a, ScaledAttention) and a.mode == "s"
    assert a.num_tokens == (16 // 8) ** 2 + 1 and a.s_matrix.shape == (2, 5, 5)
    assert torch.count_nonzero(a.s_matrix) == 0
    m = timm.create_model("scaled_alpha_vit_tiny_patch16_224", **SMALL)
    assert isinstance(m.blocks[1].attn, ScaledAttention) and m.blocks[1].attn.mode == "alpha"
    assert float(m.blocks[1].attn.alpha.detach()) == 0.0
    m = SymViT(attention="attn", **SMALL)
    assert isinstance(m.blocks[0].attn, Attention) and m.blocks[0].attn.qkv.weight.shape == (48, 16)


def test_official_state_dict_layout_and_roundtrip():
    """Names/shapes written from the spec: timm ViT names, symmetric qkv [2C, C] and [2C]."""
    C, depth, heads, classes, grid = 24, 2, 3, 5, 4
    m = timm.create_model("rpc_symvit_tiny_patch16_224", num_classes=classes, img_size=32, patch_size=8,
                          embed_dim=C, depth=depth, num_heads=heads)
    expected = {"cls_token": (1, 1, C), "pos_embed": (1, grid * grid + 1, C),
                "patch_embed.proj.weight": (C, 3, 8, 8), "patch_embed.proj.bias": (C,),
                "norm.weight": (C,), "norm.bias": (C,), "head.weight": (classes, C), "head.bias": (classes,)}
    for i in range(depth):
        p = f"blocks.{i}."
        expected.update({
            p + "norm1.weight": (C,), p + "norm1.bias": (C,),
            p + "attn.qkv.weight": (2 * C, C), p + "attn.qkv.bias": (2 * C,),
            p + "attn.proj.weight": (C, C), p + "attn.proj.bias": (C,),
            p + "norm2.weight": (C,), p + "norm2.bias": (C,),
            p + "mlp.fc1.weight": (4 * C, C), p + "mlp.fc1.bias": (4 * C,),
            p + "mlp.fc2.weight": (C, 4 * C), p + "mlp.fc2.bias": (C,)})
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == expected
    # an "official" checkpoint: {"model": state dict with DDP prefixes}, loads unchanged into SymViT and RPC-SymViT
    torch.manual_seed(1)
    official = {"model": {"module." + k: torch.randn(s) for k, s in expected.items()}, "epoch": 299}
    for name in ("symvit_tiny_patch16_224", "rpc_symvit_tiny_patch16_224"):
        target = timm.create_model(name, num_classes=classes, img_size=32, patch_size=8, embed_dim=C,
                                   depth=depth, num_heads=heads)
        load_official_checkpoint(target, official)
        for k, v in target.state_dict().items():
            assert torch.equal(v, official["model"]["module." + k])


def test_official_checkpoint_file_with_args_namespace(tmp_path):
    import argparse

    m = timm.create_model("symvit_tiny_patch16_224", **SMALL)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": m.state_dict(), "args": argparse.Namespace(model="deit_tiny")}, path)
    m2 = timm.create_model("symvit_tiny_patch16_224", **SMALL)
    load_official_checkpoint(m2, str(path))
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))
    with pytest.raises(ValueError, match="shape"):
        load_official_checkpoint(timm.create_model("symvit_tiny_patch16_224", **dict(SMALL, num_classes=3)), str(path))


def test_timm_vit_init():
    torch.manual_seed(0)
    m = timm.create_model("symvit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
    w = m.blocks[0].attn.qkv.weight
    assert abs(float(w.std()) - 0.02) < 0.003 and abs(float(w.mean())) < 0.002  # trunc_normal_(std=.02)
    assert torch.count_nonzero(m.blocks[0].attn.qkv.bias) == 0
    assert float(m.cls_token.abs().max()) < 1e-4  # normal(std 1e-6)
    assert abs(float(m.pos_embed.std()) - 0.02) < 0.005
    assert torch.equal(m.blocks[1].norm2.weight, torch.ones(64))
    assert torch.count_nonzero(m.head.bias) == 0


def test_pretrained_without_weights_is_timms_error_naming_the_local_file_route():
    with pytest.raises(RuntimeError, match="No pretrained weights exist.*pretrained_cfg_overlay=dict\\(file="):
        timm.create_model("symvit_tiny_patch16_224", pretrained=True)
