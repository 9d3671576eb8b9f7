"""The key controls (clip, drop) as an option of SymmetricAttention and the SymViT family: the kernel runs
behind them, only the blocks named get one, a trained SymViT loads unchanged, and bad combinations fail at
construction with one message."""

import pytest
import timm
import torch
from torch.fx import symbolic_trace

import rpc_attention.models  # noqa: F401  (registers the timm entry points)
from rpc_attention import functional as RF
from rpc_attention.nn import SymmetricAttention

TINY = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=16, depth=2, num_heads=2)


@pytest.mark.parametrize("control", ["clip", "drop"])
def test_symmetric_attention_runs_the_control_kernel(control):
    torch.manual_seed(0)
    layer = SymmetricAttention(8, num_heads=2, key_control=control, key_control_level=1.5).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    x[:, 3] += 30.0  # an outlying token
    k, v = layer.qkv(x).reshape(2, 7, 2, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
    ref = RF.controlled_symmetric_attention(k, v, control, 1.5)
    torch.testing.assert_close(layer(x), layer.proj(ref.transpose(1, 2).reshape(2, 7, 8)), rtol=0, atol=1e-12)
    plain = SymmetricAttention(8, num_heads=2).double()
    plain.load_state_dict(layer.state_dict())  # no parameters of its own
    assert (plain(x) - layer(x)).abs().max() > 1e-6
    assert f"key_control='{control}'" in repr(layer) and "key_control" not in repr(plain)


def test_symvit_puts_the_control_in_the_named_blocks_only():
    torch.manual_seed(0)
    plain = timm.create_model("symvit_tiny_patch16_224", **TINY).eval()
    model = timm.create_model("symvit_tiny_patch16_224", key_control="clip", key_control_layers=[1], **TINY).eval()
    model.load_state_dict(plain.state_dict())  # a trained SymViT loads unchanged
    assert (model.blocks[0].attn.key_control, model.blocks[1].attn.key_control) == ("", "clip")
    assert model.rpc_cfg["key_control"] == "clip" and model.rpc_cfg["key_control_layers"] == [1]
    assert "key_control" not in plain.rpc_cfg
    default = timm.create_model("symvit_tiny_patch16_224", key_control="drop", **TINY)
    assert default.rpc_cfg["key_control_layers"] == [0] and default.rpc_cfg["key_control_level"] == 6.0
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        # a clipping level far above every deviation changes nothing; a tight one changes the logits
        huge = timm.create_model("symvit_tiny_patch16_224", key_control="clip", key_control_level=1e6, **TINY).eval()
        huge.load_state_dict(plain.state_dict())
        torch.testing.assert_close(huge(x), plain(x), rtol=0, atol=1e-6)
        tight = timm.create_model("symvit_tiny_patch16_224", key_control="clip", key_control_level=0.1, **TINY).eval()
        tight.load_state_dict(plain.state_dict())
        assert (tight(x) - plain(x)).abs().max() > 1e-4


def test_a_controlled_symvit_traces_and_scripts():
    model = timm.create_model("symvit_tiny_patch16_224", key_control="drop", key_control_level=1.0, **TINY).eval()
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        ref = model(x)
        torch.testing.assert_close(symbolic_trace(model)(x), ref, rtol=0, atol=0)
        torch.testing.assert_close(torch.jit.script(model)(x), ref, rtol=0, atol=0)


@pytest.mark.parametrize("bad, match", [
    (dict(key_control="median"), "key_control must be one of clip, drop"),
    (dict(key_control_level=3.0), "needs key_control"),
    (dict(key_control_layers=[0]), "key_control_layers=.* needs key_control"),
    (dict(key_control="clip", key_control_level=0.0), "for clip must be > 0"),
    (dict(key_control="clip", rpc_layers=[0]), "both name block"),
    (dict(key_control="clip", key_control_layers=[2]), "out of range"),
    (dict(key_control="drop", attention="attn"), "needs symmetric attention"),
    (dict(key_control="drop", key_control_layers=[]), "name at least one block"),
])
def test_bad_combinations_fail_at_construction(bad, match):
    with pytest.raises(ValueError, match=match):
        timm.create_model("symvit_tiny_patch16_224", **dict(TINY, **bad))


def test_causal_attention_is_refused_with_a_control():
    layer = SymmetricAttention(8, num_heads=2, key_control="clip")
    with pytest.raises(ValueError, match="is_causal=True is not supported"):
        layer(torch.randn(1, 5, 8), is_causal=True)
