"""load_official_checkpoint builds the SymViT that fits an official checkpoint (synthetic state dicts).

The layouts are written out by hand from the official DeiT-codebase models (timm ViT names; symmetric
``qkv`` is ``[2C, C]``), not produced by our own model, so a drift in our layout would show here.
"""

import argparse

import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the models)
from rpc_attention.models import load_official_checkpoint
from rpc_attention.models.vision import checkpoint_model_kwargs
from rpc_attention.nn import RPCAttention, SymmetricAttention


def official_layout(width, depth, classes=1000, grid=14, patch=16, qkv_rows=None):
    shapes = {"cls_token": (1, 1, width), "pos_embed": (1, grid * grid + 1, width),
              "patch_embed.proj.weight": (width, 3, patch, patch), "patch_embed.proj.bias": (width,),
              "norm.weight": (width,), "norm.bias": (width,),
              "head.weight": (classes, width), "head.bias": (classes,)}
    for i in range(depth):
        p = f"blocks.{i}."
        shapes.update({
            p + "norm1.weight": (width,), p + "norm1.bias": (width,),
            p + "attn.qkv.weight": (qkv_rows or 2 * width, width), p + "attn.qkv.bias": (qkv_rows or 2 * width,),
            p + "attn.proj.weight": (width, width), p + "attn.proj.bias": (width,),
            p + "norm2.weight": (width,), p + "norm2.bias": (width,),
            p + "mlp.fc1.weight": (4 * width, width), p + "mlp.fc1.bias": (4 * width,),
            p + "mlp.fc2.weight": (width, 4 * width), p + "mlp.fc2.bias": (width,)})
    gen = torch.Generator().manual_seed(0)
    return {k: 0.02 * torch.randn(s, generator=gen) for k, s in shapes.items()}


def assert_holds(model, state):
    own = model.state_dict()
    assert set(own) == set(state)
    assert all(torch.equal(own[k], v) for k, v in state.items())


def test_official_small_is_348_wide_with_6_heads_of_58(tmp_path):
    state = official_layout(348, 12)
    # the registered small model is DeiT-small's 384: the official small checkpoint does not fit it
    with pytest.raises(ValueError, match="348-wide.*load_official_checkpoint"):
        load_official_checkpoint(timm.create_model("symvit_small_patch16_224"), state)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": {"module." + k: v for k, v in state.items()}, "epoch": 299,
                "args": argparse.Namespace(model="deit_small_patch16_224", lr=5e-4)}, path)
    model = load_official_checkpoint(str(path))
    assert model.pretrained_cfg["architecture"] == "symvit_small_patch16_224"
    assert model.embed_dim == 348 and len(model.blocks) == 12
    assert all(type(b.attn) is SymmetricAttention and (b.attn.num_heads, b.attn.head_dim) == (6, 58)
               for b in model.blocks)
    assert model.patch_embed.grid_size == (14, 14) and model.num_classes == 1000
    assert_holds(model, state)
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_heads_without_args_come_from_the_official_widths():
    model = load_official_checkpoint(official_layout(348, 1))
    assert model.blocks[0].attn.num_heads == 6
    tiny = load_official_checkpoint(official_layout(192, 2))
    assert tiny.pretrained_cfg["architecture"] == "symvit_tiny_patch16_224" and tiny.blocks[0].attn.num_heads == 3
    base = load_official_checkpoint(official_layout(768, 1, classes=10, grid=2))
    assert base.pretrained_cfg["architecture"] == "symvit_base_patch16_224"
    assert base.blocks[0].attn.num_heads == 12 and base.num_classes == 10


def test_heads_from_args_and_explicit_num_heads():
    state = official_layout(96, 2, classes=10, grid=4, patch=7)
    with pytest.raises(ValueError, match="num_heads=") as exc:
        load_official_checkpoint(state)
    assert "96-wide" in str(exc.value)
    model = load_official_checkpoint(state, num_heads=4)
    assert model.blocks[0].attn.num_heads == 4 and model.patch_embed.img_size == (28, 28)
    assert_holds(model, state)
    wrapped = {"model": state, "args": argparse.Namespace(num_heads=3)}
    assert load_official_checkpoint(wrapped).blocks[1].attn.num_heads == 3


def test_rpc_settings_come_from_the_variant_or_options():
    state = official_layout(192, 3, grid=2)
    model = load_official_checkpoint(state, variant="rpc_symvit_tiny_patch16_224")
    assert isinstance(model.blocks[0].attn, RPCAttention) and model.blocks[0].attn.n_iter == 6
    assert type(model.blocks[1].attn) is SymmetricAttention
    every = load_official_checkpoint(state, rpc_layers="all", n_iter=2)
    assert all(isinstance(b.attn, RPCAttention) and b.attn.n_iter == 2 for b in every.blocks)
    assert every.rpc_cfg["rpc_layers"] == [0, 1, 2]
    assert_holds(every, state)


def test_other_img_size_resamples_the_position_embedding():
    state = official_layout(192, 1)
    model = load_official_checkpoint(state, img_size=64)
    assert model.pos_embed.shape == (1, 4 * 4 + 1, 192)
    assert torch.equal(model.pos_embed[:, 0], state["pos_embed"][:, 0])


def test_in_place_form_checks_and_loads():
    state = official_layout(192, 2, grid=2)
    model = timm.create_model("symvit_tiny_patch16_224", depth=2, img_size=32)
    assert load_official_checkpoint(model, state) is model
    assert_holds(model, state)
    with pytest.raises(ValueError, match="only apply when"):
        load_official_checkpoint(model, state, num_heads=3)


def test_attention_type_is_read_from_the_tensors():
    asym = official_layout(192, 1, grid=2, qkv_rows=3 * 192)
    assert checkpoint_model_kwargs(asym)["attention"] == "attn"
    alpha = dict(asym, **{"blocks.0.attn.alpha": torch.tensor(0.1)})
    model = load_official_checkpoint(alpha)
    assert model.pretrained_cfg["architecture"] == "scaled_alpha_vit_tiny_patch16_224"
    assert_holds(model, alpha)
