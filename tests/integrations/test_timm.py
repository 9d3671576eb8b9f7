"""timm integration: convert()/revert() on randomly initialised tiny timm models (no hub)."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the symvit models in timm)
from rpc_attention import functional as RF
from rpc_attention.integrations import timm as rpc_timm
from rpc_attention.nn import RPCAttention, SymmetricAttention

INF = float("inf")
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
NAMES = ["vit_tiny_patch16_224", "deit_tiny_patch16_224", "eva02_tiny_patch14_224", "symvit_tiny_patch16_224"]


def build(name):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **TINY).eval()


@pytest.mark.parametrize("name", NAMES)
def test_convert_huge_lambda_equals_original_and_revert_is_exact(name):
    model = build(name)
    x = torch.randn(2, 3, 32, 32)
    ref = model(x)
    attn0 = model.blocks[0].attn
    cls0 = type(attn0)
    keys = list(model.state_dict())
    rpc_timm.convert(model, rpc_layers="all", n_iter=3, lambd=INF)
    assert model.blocks[0].attn is attn0 and type(attn0) is not cls0  # same module object, new behaviour
    assert list(model.state_dict()) == keys
    assert rpc_timm.converted_layers(model) == [0, 1]
    if cls0 is SymmetricAttention:
        assert type(attn0) is RPCAttention  # the paper's symmetric PAP layer, not the asymmetric extension
    else:
        torch.testing.assert_close(model(x), ref, rtol=0, atol=1e-6)
    rpc_timm.convert(model, rpc_layers=[1], n_iter=3, lambd=0.3, threshold="lambda_over_mu")
    feats = model.forward_features(x)
    rpc_timm.revert(model)
    ref_feats = model.forward_features(x)
    assert (feats - ref_feats).abs().max() > 1e-5 * ref_feats.abs().max()  # EVA init keeps residual branches small
    rpc_timm.convert(model, rpc_layers=[1], n_iter=3, lambd=0.3, threshold="lambda_over_mu")
    rpc_timm.revert(model)
    assert type(model.blocks[0].attn) is cls0 and type(model.blocks[1].attn) is cls0
    assert model.blocks[0].attn is attn0
    assert not any(hasattr(b.attn, "_rpc_convert_state") for b in model.blocks)
    assert torch.equal(model(x), ref)
    assert rpc_timm.converted_layers(model) == []


def test_symmetric_model_converts_to_paper_pap():
    model = build("symvit_tiny_patch16_224")
    ref_model = timm.create_model("rpc_symvit_tiny_patch16_224", pretrained=False, rpc_layers=[0], n_iter=4, **TINY).eval()
    ref_model.load_state_dict(model.state_dict())
    rpc_timm.convert(model, rpc_layers=[0], n_iter=4, lambd=4.0)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), ref_model(x))


def test_asymmetric_layer_uses_cleaned_queries_and_keys():
    """The converted forward equals attention(q - S, k - S, v) with S from PAP on the block's keys."""
    model = build("vit_tiny_patch16_224")
    attn = model.blocks[0].attn
    x = torch.randn(2, 17, 32)
    opts = dict(n_iter=3, lambd=0.3, threshold="lambda_over_mu")
    q, k, v = attn.qkv(x).reshape(2, 17, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
    _, st = RF.pap_attention(k, v, return_state=True, model_dim=32, **opts)
    assert st.sparse.abs().sum() > 0
    o = torch.nn.functional.scaled_dot_product_attention(q - st.sparse, k - st.sparse, v)
    ref = attn.proj(o.transpose(1, 2).reshape(2, 17, 32))
    rpc_timm.convert(model, rpc_layers=[0], **opts)
    torch.testing.assert_close(attn(x), ref, rtol=1e-5, atol=1e-6)
    rpc_timm.convert(model, rpc_layers=[0], clean_queries=False, **opts)
    o = torch.nn.functional.scaled_dot_product_attention(q, k - st.sparse, v)
    torch.testing.assert_close(attn(x), attn.proj(o.transpose(1, 2).reshape(2, 17, 32)), rtol=1e-5, atol=1e-6)


def test_unfused_module_is_forced_onto_fused_path_and_restored():
    model = build("vit_tiny_patch16_224")
    for blk in model.blocks:
        blk.attn.fused_attn = False
    x = torch.randn(1, 3, 32, 32)
    ref = model(x)
    rpc_timm.convert(model, lambd=INF)
    torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
    assert model.blocks[0].attn.fused_attn is False
    rpc_timm.revert(model)
    assert torch.equal(model(x), ref)


def test_convert_errors():
    model = build("vit_tiny_patch16_224")
    with pytest.raises(ValueError, match="out of range"):
        rpc_timm.convert(model, rpc_layers=[5])
    with pytest.raises(ValueError, match="lambd"):
        rpc_timm.convert(model, lambd=-1.0)
    with pytest.raises(ValueError, match="blocks"):
        rpc_timm.convert(torch.nn.Linear(2, 2))
    pap = timm.create_model("rpc_symvit_tiny_patch16_224", pretrained=False, rpc_layers=[0], **TINY)
    with pytest.raises(ValueError, match="already runs PAP"):
        rpc_timm.convert(pap, rpc_layers=[0])


def test_symmetric_extension_mode_reduces_to_symmetric_attention():
    model = build("symvit_tiny_patch16_224")
    x = torch.randn(2, 3, 32, 32)
    ref = model(x)
    rpc_timm.convert(model, rpc_layers="all", n_iter=3, lambd=INF, symmetric="extension")
    assert type(model.blocks[0].attn).__name__ == "RPCConvertedSymmetricAttention"
    torch.testing.assert_close(model(x), ref, rtol=0, atol=1e-6)
    rpc_timm.convert(model, rpc_layers="all", n_iter=3, lambd=INF)  # the paper's layer: K2 != K for n_iter >= 2
    assert type(model.blocks[0].attn) is RPCAttention and (model(x) - ref).abs().max() > 1e-6
    rpc_timm.revert(model)
    assert torch.equal(model(x), ref)
    with pytest.raises(ValueError, match="symmetric"):
        rpc_timm.convert(model, symmetric="bogus")


def test_conversion_that_changes_nothing_warns_once_and_records_the_activity():
    """vit_tiny at the official threshold: S = 0, so the logits are the original ones; the user is told
    on the first forward (once), and a lower threshold changes the logits without a warning."""
    import warnings

    model = build("vit_tiny_patch16_224")
    x = torch.randn(2, 3, 32, 32)
    ref = model(x)
    rpc_timm.convert(model, rpc_layers=[0, 1], n_iter=6, lambd=INF)
    with pytest.warns(rpc_timm.RPCInactiveWarning, match="changed nothing") as record:
        out = model(x)
    # one text for every layer that did nothing, raised from one place: Python's default filter shows it once
    assert len(record) == 2 and len({(str(w.message), w.filename, w.lineno) for w in record}) == 1
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    act = rpc_timm.sparse_activity(model)
    assert sorted(act) == [0, 1] and all(a["frac_nonzero"] == 0 for calls in act.values() for a in calls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(x)  # measured on the first forward only
        rpc_timm.convert(model, rpc_layers=[0], n_iter=6, lambd=0.3, threshold="lambda_over_mu")  # measured again
        out = model(x)
    assert rpc_timm.sparse_activity(model)[0][0]["frac_nonzero"] > 0
    assert (out - ref).abs().max() > 1e-4


def test_the_inactive_warning_points_at_the_callers_line():
    """The warning is raised in a converted layer below torch's Module.__call__ and timm's forwards; its
    location is the line that called the model (here, this test file), not torch's module.py."""
    import warnings

    model = build("vit_tiny_patch16_224")
    rpc_timm.convert(model, rpc_layers=[0], n_iter=2, lambd=INF)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1  # the line below, which calls the model
        model(torch.randn(1, 3, 32, 32))
    (w,) = [w for w in record if issubclass(w.category, rpc_timm.RPCInactiveWarning)]
    assert w.filename == __file__ and w.lineno == line
