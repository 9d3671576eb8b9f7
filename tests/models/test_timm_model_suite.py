"""What timm's own model suite (tests/test_models.py) checks, for every registered name, on tiny sizes.

Forward (with grad checkpointing), backward, the non-standard default-cfg checks, ``features_only``
(timm's getter and FX feature wrappers), ``forward_intermediates``, FX tracing (``torch.fx`` and
torchvision's feature extraction), ``torch.jit.script``, ``pretrained_cfg_overlay`` and
``pretrained=True`` with local weights.
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import timm
import torch
from torch.fx import symbolic_trace

import rpc_attention.models  # noqa: F401  (registers the models)
from rpc_attention.models import FAN_MODEL_NAMES, MODEL_NAMES

# the SymViT family and the FAN family (FAN, SymFAN, RPC-FAN): the same timm behaviours
ALL_NAMES = MODEL_NAMES + FAN_MODEL_NAMES

# depth 3: timm's default features_only out_indices=3 takes the last three blocks
TINY = dict(img_size=32, patch_size=8, embed_dim=16, depth=3, num_heads=2)
GRID = 32 // 8


def create(name, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **dict(TINY, **kw))


def image(batch=1, chans=3):
    return torch.randn(batch, chans, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_forward_and_grad_checkpointing(name):
    model = create(name, num_classes=5).eval()
    x = image()
    out = model(x)
    assert out.shape == (1, 5) and torch.isfinite(out).all()
    model.set_grad_checkpointing()
    # checkpointing re-runs the same ops in the same order: identical in eval mode
    assert torch.equal(model(x), out)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_backward_reaches_every_parameter(name):
    model = create(name, num_classes=42).train()
    out = model(image(batch=2))
    assert out.shape == (2, 42)
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", ALL_NAMES)
def test_default_cfg_checks(name):
    model = create(name).eval()
    assert model.num_classes == 1000 and model.num_features == 16 and model.head_hidden_size == 16
    cfg = model.default_cfg
    assert cfg is model.pretrained_cfg and cfg["architecture"] == name
    assert cfg["rpc_cfg"] == model.rpc_cfg
    state = model.state_dict()
    assert cfg["classifier"] + ".weight" in state and cfg["first_conv"] + ".weight" in state
    x = image()
    feats = model.forward_features(x)
    assert feats.shape == (1, GRID * GRID + 1, 16)
    pre = model.forward_head(feats, pre_logits=True)
    assert pre.shape == (1, 16)
    model.reset_classifier(0)
    assert model.num_classes == 0 and torch.equal(model(x), pre)
    headless = create(name, num_classes=0).eval()
    assert headless(x).shape == (1, 16)


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("feature_cls", ["getter", "fx"])
def test_features_only(name, feature_cls):
    reference = create(name).eval()
    model = create(name, features_only=True, feature_cls=feature_cls).eval()  # same seed, same weights
    assert model.feature_info.channels() == [16, 16, 16]
    assert model.feature_info.reduction() == [8, 8, 8]
    assert model.pretrained_cfg["rpc_cfg"] == reference.rpc_cfg
    assert model.default_cfg["rpc_cfg"] == reference.rpc_cfg
    x = image()
    outs = model(x)
    if feature_cls == "getter":  # (B, C, H, W) maps, as forward_intermediates gives them
        _, expected = reference.forward_intermediates(x, output_fmt="NCHW")
    else:  # FX returns the traced blocks' raw token outputs (B, N, C)
        expected = []
        hooks = [b.register_forward_hook(lambda m, i, o: expected.append(o)) for b in reference.blocks]
        reference(x)
        for h in hooks:
            h.remove()
    assert len(outs) == len(expected) == 3
    for got, want in zip(outs, expected):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_forward_intermediates(name):
    model = create(name).eval()
    x = image()
    final, inter = model.forward_intermediates(x, output_fmt="NCHW")
    assert [t.shape for t in inter] == [(1, 16, GRID, GRID)] * 3
    assert torch.equal(final, model.forward_features(x))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fx_symbolic_trace_and_feature_extraction(name):
    from torchvision.models.feature_extraction import create_feature_extractor

    model = create(name, num_classes=5).eval()
    x = image()
    ref = model(x)
    traced = symbolic_trace(model)
    assert torch.equal(traced(x), ref)  # the same kernels run in the same order
    kernels = {n.target.__name__ for n in traced.graph.nodes if n.op == "call_function"}
    assert {"_check_width"} <= kernels and kernels & {"softmax_attention", "_symmetric_attention", "_pap_attention",
                                                      "_scaled_attention"}
    extractor = create_feature_extractor(model, return_nodes={"blocks.1": "mid", "head": "logits"})
    out = extractor(x)
    tokens = GRID * GRID + (0 if name in FAN_MODEL_NAMES else 1)  # FAN's class token joins after the blocks
    assert out["mid"].shape == (1, tokens, 16) and torch.equal(out["logits"], ref)
    # backward through the traced graph in train mode reaches every parameter
    trained = symbolic_trace(create(name, num_classes=5).train())
    trained(image(batch=2)).mean().backward()
    assert all(p.grad is not None for p in trained.parameters())


def test_traced_graph_still_checks_the_input_width():
    traced = symbolic_trace(create("symvit_tiny_patch16_224").blocks[0].attn)
    with pytest.raises(ValueError, match="input"):
        traced(torch.randn(1, 5, 12))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_torchscript_of_the_model_and_of_its_traced_graph(name):
    model = create(name, num_classes=5).eval()
    x = image()
    ref = model(x)
    assert torch.equal(torch.jit.script(model)(x), ref)
    # timm also scripts the FX-traced graph, whose kernel calls carry the options as constants
    assert torch.equal(torch.jit.script(symbolic_trace(model))(x), ref)


def test_pretrained_cfg_overlay_reaches_both_cfgs_and_the_data_config():
    overlay = dict(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), crop_pct=1.0)
    for kw in ({}, dict(features_only=True)):
        model = create("rpc_symvit_tiny_patch16_224", pretrained_cfg_overlay=overlay, **kw)
        for cfg in (model.pretrained_cfg, model.default_cfg):
            assert cfg["mean"] == overlay["mean"] and cfg["std"] == overlay["std"] and cfg["crop_pct"] == 1.0
            assert cfg["rpc_cfg"]["rpc_layers"] == [0]
    data_cfg = timm.data.resolve_data_config(model=create("symvit_tiny_patch16_224", pretrained_cfg_overlay=overlay))
    assert data_cfg["mean"] == overlay["mean"] and data_cfg["std"] == overlay["std"]


def _save_official_style(model, path):
    """An official DeiT-codebase training checkpoint: DDP prefixes, args Namespace, optimizer state."""
    state = {"module." + k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"model": state, "args": argparse.Namespace(model="deit_tiny_patch16_224"), "epoch": 299,
                "optimizer": {"state": {}, "param_groups": []}}, path)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_pretrained_true_loads_a_local_file(name, tmp_path):
    source = create(name, num_classes=7)
    path = tmp_path / "checkpoint.pth"
    _save_official_style(source, path)
    overlay = dict(file=str(path), num_classes=7)
    loaded = create(name, num_classes=7, pretrained=True, pretrained_cfg_overlay=overlay)
    src = source.state_dict()
    assert all(torch.equal(v, src[k]) for k, v in loaded.state_dict().items())
    assert loaded.pretrained_cfg["file"] == str(path) and loaded.default_cfg["rpc_cfg"] == loaded.rpc_cfg
    # other num_classes: timm drops the checkpoint's head and keeps the rest
    other = create(name, num_classes=3, pretrained=True, pretrained_cfg_overlay=overlay)
    assert all(torch.equal(v, src[k]) for k, v in other.state_dict().items() if not k.startswith("head."))
    assert other.head.weight.shape == (3, 16)


def test_pretrained_local_file_safetensors_features_only_and_resampled_grid(tmp_path):
    from safetensors.torch import save_file

    source = create("rpc_symvit_tiny_patch16_224")
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    feats = create("rpc_symvit_tiny_patch16_224", pretrained=True, features_only=True,
                   pretrained_cfg_overlay=dict(file=str(path)))
    assert torch.equal(feats.model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    bigger = create("rpc_symvit_tiny_patch16_224", img_size=48, pretrained=True,
                    pretrained_cfg_overlay=dict(file=str(path)))
    assert bigger.pos_embed.shape == (1, 6 * 6 + 1, 16)
    assert torch.equal(bigger.pos_embed[:, :1], source.pos_embed[:, :1])  # the class token's is kept


def test_pretrained_local_file_of_another_width_names_the_fix(tmp_path):
    path = tmp_path / "wide.pth"
    _save_official_style(create("symvit_tiny_patch16_224", embed_dim=24, num_heads=2), path)
    with pytest.raises(ValueError, match="24-wide.*load_official_checkpoint"):
        create("symvit_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))


def test_pretrained_true_without_weights_is_timms_runtime_error():
    with pytest.raises(RuntimeError, match="No pretrained weights exist for scaled_vit_tiny_patch16_224"):
        create("scaled_vit_tiny_patch16_224", pretrained=True)
