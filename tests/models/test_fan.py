"""FAN / SymFAN / RPC-FAN: builds, timm behaviours, the authors' state-dict layout, PAP placement."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

import rpc_attention.models  # noqa: F401  (registers the models)
from rpc_attention import nn as rnn
from rpc_attention.models import FAN, FAN_MODEL_NAMES, load_fan_checkpoint
from rpc_attention.models.fan import checkpoint_filter_fn

# 2 blocks, 32x32 images, patch 8 (a 4x4 grid), width 32, 4 heads: milliseconds per forward
TINY = dict(num_classes=5, img_size=32, patch_size=8, in_chans=3, embed_dim=32, depth=2, num_heads=4)


def _tiny(name, **kw):
    return timm.create_model(name, **dict(TINY, **kw))


@pytest.mark.parametrize("name", FAN_MODEL_NAMES)
def test_every_fan_model_builds_runs_and_backprops(name):
    torch.manual_seed(0)
    m = _tiny(name)
    assert isinstance(m, FAN) and m.pretrained_cfg["architecture"] == name
    assert m.pretrained_cfg["rpc_cfg"] == m.rpc_cfg
    y = m(torch.randn(3, 3, 32, 32))
    assert y.shape == (3, 5)
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_registered_in_timm():
    assert set(FAN_MODEL_NAMES) <= set(timm.list_models("*fan*"))


@pytest.mark.parametrize("name,width,heads", [("fan_tiny_12_p16_224", 192, 4), ("fan_small_12_p16_224", 384, 8),
                                              ("rpc_fan_small_12_p16_224", 384, 8)])
def test_default_sizes_follow_the_authors(name, width, heads):
    m = timm.create_model(name, depth=1)  # full width; depth 1 keeps it cheap
    assert m.embed_dim == width and m.blocks[0].attn.num_heads == heads and m.blocks[0].mlp.num_heads == heads
    assert m.num_classes == 1000 and len(m.cls_attn_blocks) == 2
    assert m.patch_embed.grid_size == (14, 14)
    convs = [mod for mod in m.patch_embed.proj.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [width // 8, width // 4, width // 2, width]
    assert all(c.stride == (2, 2) and c.kernel_size == (3, 3) for c in convs)
    assert m.blocks[0].norm1.eps == 1e-6 and m.blocks[0].attn.qkv.bias is not None
    assert m.blocks[0].mlp.mlp_v.fc1.out_features == 4 * width
    assert len(timm.create_model(name.replace("small", "tiny"), img_size=32, embed_dim=16, num_heads=4).blocks) == 12


def test_token_mixing_types_and_rpc_placement():
    assert all(type(b.attn) is rnn.Attention for b in _tiny("fan_tiny_12_p16_224").blocks)
    assert all(type(b.attn) is rnn.SymmetricAttention for b in _tiny("symfan_tiny_12_p16_224", depth=3).blocks)
    m = _tiny("rpc_fan_tiny_12_p16_224", depth=3)
    assert [type(b.attn) for b in m.blocks] == [rnn.RPCAttention, rnn.SymmetricAttention, rnn.SymmetricAttention]
    a = m.blocks[0].attn
    assert (a.n_iter, a.lambd, a.threshold, a.mu_mode) == (4, 4.0, "lambda_mu", None)
    assert m.rpc_cfg == {"token_mixing": "sym", "rpc_layers": [0], "n_iter": 4, "lambd": 4.0,
                         "threshold": "lambda_mu", "mu_mode": None, "model_dim": 32, "tol": None,
                         "lowrank": "values", "shrink": "soft", "dual_step": 1.0}


def test_pap_options_overridable_through_create_model():
    m = _tiny("rpc_fan_tiny_12_p16_224", depth=4, rpc_layers="1,3", n_iter=3, lambd=2.5,
              threshold="lambda_over_mu", mu_mode="head_dim", model_dim=64, tol=1e-4)
    kinds = [type(b.attn) for b in m.blocks]
    assert kinds == [rnn.SymmetricAttention, rnn.RPCAttention, rnn.SymmetricAttention, rnn.RPCAttention]
    for i in (1, 3):
        a = m.blocks[i].attn
        assert (a.n_iter, a.lambd, a.threshold, a.mu_mode, a.model_dim, a.tol) == (
            3, 2.5, "lambda_over_mu", "head_dim", 64, 1e-4)
    assert "rpc_layers=[1, 3]" in repr(m)
    assert all(isinstance(b.attn, rnn.RPCAttention) for b in _tiny("symfan_tiny_12_p16_224", rpc_layers="all").blocks)


@pytest.mark.parametrize("kw,needle", [
    (dict(rpc_layers=[0]), "token_mixing='sym'"),          # PAP needs symmetric mixing
    (dict(token_mixing="sym", rpc_layers=[2]), "rpc_layers"),
    (dict(token_mixing="qk"), "token_mixing"),
    (dict(patch_size=7), "patch_size 4, 8 or 16"),
    (dict(token_mixing="sym", rpc_layers=[0], n_iter=0), "n_iter"),
    (dict(token_mixing="sym", rpc_layers=[0], lambd=-1.0), "lambd"),
])
def test_bad_options_rejected_with_a_clear_error(kw, needle):
    with pytest.raises(ValueError) as exc:
        _tiny("fan_tiny_12_p16_224", **kw)
    assert needle in str(exc.value)


def _expected_layout(symmetric, c=TINY["embed_dim"], depth=TINY["depth"], classes=TINY["num_classes"]):
    """Names and shapes of the authors' FAN state dict (NVlabs/FAN models/fan.py; symmetric:
    rachtsy/FAN models/fan_sym.py), for patch 8: a stem of three conv-BN layers (C/4, C/2, C)."""
    exp = {"cls_token": (1, 1, c), "pos_embed.token_projection.weight": (c, 64, 1, 1),
           "pos_embed.token_projection.bias": (c,), "norm.weight": (c,), "norm.bias": (c,),
           "head.weight": (classes, c), "head.bias": (classes,)}
    widths = [3, c // 4, c // 2, c]
    for j in range(3):
        p, w = f"patch_embed.proj.{2 * j}.", widths[j + 1]
        exp[p + "0.weight"] = (w, widths[j], 3, 3)
        exp.update({p + "1." + s: (w,) for s in ("weight", "bias", "running_mean", "running_var")})
        exp[p + "1.num_batches_tracked"] = ()
    h = 4 * c
    for i in range(depth):
        p = f"blocks.{i}."
        exp.update({p + s: (c,) for s in ("gamma1", "gamma2", "norm1.weight", "norm1.bias", "norm2.weight",
                                          "norm2.bias", "attn.proj.bias", "mlp.q.bias", "mlp.norm_v.weight",
                                          "mlp.norm_v.bias", "mlp.mlp_v.fc2.bias")})
        exp.update({p + "attn.kv.weight": (2 * c, c), p + "attn.kv.bias": (2 * c,), p + "attn.proj.weight": (c, c),
                    p + "mlp.temperature": (4, 1, 1), p + "mlp.q.weight": (c, c),
                    p + "mlp.mlp_v.fc1.weight": (h, c), p + "mlp.mlp_v.fc1.bias": (h,), p + "mlp.mlp_v.gamma": (h,),
                    p + "mlp.mlp_v.fc2.weight": (c, h)})
        d = p + "mlp.mlp_v.dwconv."
        exp.update({d + "conv1.weight": (h, 1, 3, 3), d + "conv1.bias": (h,), d + "conv2.weight": (h, 1, 3, 3),
                    d + "conv2.bias": (h,), d + "bn.num_batches_tracked": ()})
        exp.update({d + "bn." + s: (h,) for s in ("weight", "bias", "running_mean", "running_var")})
        if not symmetric:
            exp.update({p + "attn.q.weight": (c, c), p + "attn.q.bias": (c,)})
    for i in range(2):
        p = f"cls_attn_blocks.{i}."
        exp.update({p + s: (c,) for s in ("gamma1", "gamma2", "norm1.weight", "norm1.bias", "norm2.weight",
                                          "norm2.bias", "attn.proj.bias", "mlp.fc2.bias")})
        names = ("k", "v", "proj") if symmetric else ("q", "k", "v", "proj")
        exp.update({f"{p}attn.{n}.weight": (c, c) for n in names})
        exp.update({f"{p}attn.{n}.bias": (c,) for n in names if n != "proj"})
        exp.update({p + "mlp.fc1.weight": (h, c), p + "mlp.fc1.bias": (h,), p + "mlp.fc2.weight": (c, h)})
    return exp


@pytest.mark.parametrize("name,symmetric", [("fan_tiny_12_p16_224", False), ("symfan_tiny_12_p16_224", True),
                                            ("rpc_fan_tiny_12_p16_224", True)])
def test_state_dict_has_the_authors_names_and_shapes(name, symmetric):
    got = {k: tuple(v.shape) for k, v in _tiny(name).state_dict().items()}
    assert got == _expected_layout(symmetric)


def test_symmetric_mixing_has_no_query_weights():
    m = _tiny("rpc_fan_tiny_12_p16_224")
    assert all(b.attn.qkv.weight.shape == (64, 32) for b in m.blocks)  # keys then values only
    assert all(not hasattr(b.attn, "q") for b in m.cls_attn_blocks)
    assert not any(".attn.q." in k for k in m.state_dict())


@pytest.mark.parametrize("name", ["fan_tiny_12_p16_224", "rpc_fan_tiny_12_p16_224"])
def test_authors_checkpoint_loads_with_one_call_and_reproduces_outputs(name):
    torch.manual_seed(0)
    src = _tiny(name).eval()
    with torch.no_grad():  # non-trivial values everywhere, also in the BatchNorm statistics
        for t in src.state_dict().values():
            if t.is_floating_point():
                t.add_(0.1 * torch.randn_like(t)).abs_() if t.dim() == 1 else t.add_(0.05 * torch.randn_like(t))
    official = {"state_dict": {"module." + k: v.clone() for k, v in src.state_dict().items()}, "epoch": 299}
    dst = _tiny(name).eval()
    load_fan_checkpoint(dst, official)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(dst(x), src(x))
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k


def test_asymmetric_state_dict_entries_are_views_of_the_fused_projection():
    # EMA implementations update state_dict() tensors in place; that must reach the parameter
    m = _tiny("fan_tiny_12_p16_224")
    sd = m.state_dict()
    sd["blocks.0.attn.q.weight"].fill_(1.0)
    sd["blocks.0.attn.kv.bias"].fill_(2.0)
    assert torch.all(m.blocks[0].attn.qkv.weight[:32] == 1.0) and torch.all(m.blocks[0].attn.qkv.bias[32:] == 2.0)


def test_wrong_family_checkpoint_is_a_clear_error():
    asym, sym = _tiny("fan_tiny_12_p16_224").state_dict(), _tiny("symfan_tiny_12_p16_224").state_dict()
    with pytest.raises(RuntimeError, match="fan_\\*"):
        _tiny("symfan_tiny_12_p16_224").load_state_dict(asym)
    with pytest.raises(RuntimeError, match="symfan_\\*"):
        _tiny("fan_tiny_12_p16_224").load_state_dict(sym)
    with pytest.raises(ValueError, match="shape"):
        load_fan_checkpoint(_tiny("fan_tiny_12_p16_224", num_classes=3), asym)


def test_checkpoint_filter_renames_older_keys():
    m = _tiny("fan_tiny_12_p16_224")
    sd = m.state_dict()
    old = {k.replace("pos_embed.", "pos_embeder."): v for k, v in sd.items()}
    for i in range(2):
        p = f"cls_attn_blocks.{i}.attn."
        for kind in ("weight", "bias"):
            old[p + "qkv." + kind] = torch.cat([old.pop(p + n + "." + kind) for n in "qkv"])
    new = checkpoint_filter_fn(old, m)
    assert set(new) == set(sd) and all(torch.equal(new[k], sd[k]) for k in sd)
    # a symmetric model keeps k and v of a fused class-attention qkv and drops q
    sym = _tiny("symfan_tiny_12_p16_224")
    assert "cls_attn_blocks.0.attn.q.weight" not in checkpoint_filter_fn(old, sym)


def _pap_reference(k, v, n_iter, lambd, scale, model_dim):
    """PAP written out from the method's definition, float64 (mu over the model width, tau = lambda mu)."""
    n = k.shape[-2]
    mu = n * model_dim / (4 * k.abs().sum(dim=(-2, -1), keepdim=True))
    tau = lambd * mu
    low, dual = torch.zeros_like(k), torch.zeros_like(k)

    def shrink(x):
        return torch.sign(x) * torch.clamp(x.abs() - tau, min=0)

    for _ in range(n_iter - 1):
        sparse = shrink(k - low + dual / mu)
        k2 = k - sparse - dual / mu
        low = torch.softmax(scale * k2 @ k2.transpose(-2, -1), -1) @ v
        dual = dual + mu * (k - low - sparse)
    sparse = shrink(k - low + dual / mu)
    k2 = k - sparse - dual / mu
    return torch.softmax(scale * k2 @ k2.transpose(-2, -1), -1) @ v, sparse


def _channel_attention_reference(mlp, x, hgt, wid):
    b, n, c = x.shape
    h, d = mlp.num_heads, c // mlp.num_heads
    q = F.linear(x, mlp.q.weight, mlp.q.bias).reshape(b, n, h, d).softmax(1)      # token distribution per channel
    k = x.reshape(b, n, h, d).softmax(1).mean(-1)                                  # (b, n, h)
    gates = torch.sigmoid(torch.einsum("bnhd,bnh->bhd", q, k)) * mlp.temperature.reshape(1, h, 1)
    mv = mlp.mlp_v
    z = F.linear(x, mv.fc1.weight, mv.fc1.bias)
    grid = z.transpose(1, 2).reshape(b, -1, hgt, wid)
    dw = mv.dwconv
    y = F.conv2d(grid, dw.conv1.weight, dw.conv1.bias, padding=1, groups=grid.shape[1])
    y = F.batch_norm(F.gelu(y), dw.bn.running_mean, dw.bn.running_var, dw.bn.weight, dw.bn.bias, False, 0.0, dw.bn.eps)
    y = F.conv2d(y, dw.conv2.weight, dw.conv2.bias, padding=1, groups=grid.shape[1]).reshape(b, -1, n).transpose(1, 2)
    vals = F.linear(z + mv.gamma * y, mv.fc2.weight, mv.fc2.bias)
    vals = F.layer_norm(vals, (c,), mlp.norm_v.weight, mlp.norm_v.bias, mlp.norm_v.eps)
    return (vals.reshape(b, n, h, d) * gates[:, None]).reshape(b, n, c)


@pytest.mark.parametrize("lambd", [4.0, 0.05])  # 4: the paper's value; 0.05: small enough that S is non-zero
def test_rpc_block0_equals_a_hand_written_float64_reference(lambd):
    torch.manual_seed(0)
    m = _tiny("rpc_fan_tiny_12_p16_224", lambd=lambd).double().eval()
    with torch.no_grad():
        for t in m.state_dict().values():
            if t.is_floating_point():
                t.add_(0.1 * torch.randn_like(t)).abs_() if t.dim() == 1 else t.add_(0.1 * torch.randn_like(t))
    blk = m.blocks[0]
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    got = blk(x, 4, 4)

    b, n, c = x.shape
    a = blk.attn
    xn = F.layer_norm(x, (c,), blk.norm1.weight, blk.norm1.bias, 1e-6)
    kv = F.linear(xn, a.qkv.weight, a.qkv.bias).reshape(b, n, 2, 4, c // 4).permute(2, 0, 3, 1, 4)
    mixed, sparse = _pap_reference(kv[0], kv[1], n_iter=4, lambd=lambd, scale=(c // 4) ** -0.5, model_dim=c)
    if lambd < 1:
        assert sparse.abs().sum() > 0  # the sparse step fired, so the comparison covers the shrinkage
    mixed = F.linear(mixed.transpose(1, 2).reshape(b, n, c), a.proj.weight, a.proj.bias)
    y = x + blk.gamma1 * mixed
    yn = F.layer_norm(y, (c,), blk.norm2.weight, blk.norm2.bias, 1e-6)
    want = y + blk.gamma2 * _channel_attention_reference(blk.mlp, yn, 4, 4)
    # float64 with O(1) values through ~10 layers of O(C) sums: rounding stays far below 1e-12
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_forward_features_and_head():
    m = _tiny("symfan_tiny_12_p16_224").eval()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 1 + 16, 32)
    assert torch.equal(m.forward_head(feats), m(x))
    assert torch.equal(m.forward_head(feats, pre_logits=True), feats[:, 0])
    # the Fourier positions work at any grid: a non-square input runs too
    assert m(torch.randn(1, 3, 48, 32)).shape == (1, 5)


def test_forward_intermediates():
    m = _tiny("rpc_fan_tiny_12_p16_224", depth=3).eval()
    x = torch.randn(2, 3, 32, 32)
    seen = []
    handles = [b.register_forward_hook(lambda mod, args, out: seen.append(out)) for b in m.blocks]
    final, inter = m.forward_intermediates(x)
    for h in handles:
        h.remove()
    assert len(inter) == 3 and all(t.shape == (2, 32, 4, 4) for t in inter)
    for t, s in zip(inter, seen):
        assert torch.equal(t, s.reshape(2, 4, 4, 32).permute(0, 3, 1, 2))
    assert torch.equal(final, m.forward_features(x))
    only = m.forward_intermediates(x, indices=[0, 2], output_fmt="NLC", norm=True, intermediates_only=True)
    assert len(only) == 2 and torch.allclose(only[1], m.norm(seen[2]))


def test_features_only():
    torch.manual_seed(0)
    m = timm.create_model("rpc_fan_tiny_12_p16_224", features_only=True, out_indices=(0, 1), **TINY).eval()
    assert m.feature_info.channels() == [32, 32] and m.feature_info.reduction() == [8, 8]
    feats = m(torch.randn(2, 3, 32, 32))
    assert [tuple(f.shape) for f in feats] == [(2, 32, 4, 4), (2, 32, 4, 4)]


def test_grad_checkpointing_gives_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    a = _tiny("rpc_fan_tiny_12_p16_224")
    b = _tiny("rpc_fan_tiny_12_p16_224")
    b.load_state_dict(a.state_dict())
    b.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 32, 32)
    ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=n)


def test_reset_classifier():
    m = _tiny("fan_tiny_12_p16_224").eval()
    m.reset_classifier(11)
    assert m.get_classifier().out_features == 11 and m(torch.randn(1, 3, 32, 32)).shape == (1, 11)
    m.reset_classifier(0, "avg")
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(m(x), m.forward_features(x)[:, 1:].mean(1))
    assert timm.create_model("fan_tiny_12_p16_224", **dict(TINY, num_classes=0))(x).shape == (1, 32)


@pytest.mark.parametrize("name", ["fan_tiny_12_p16_224", "rpc_fan_tiny_12_p16_224"])
def test_fx_graph_keeps_the_grid_size_symbolic(name):
    # the stem, the Fourier positions and the channel attention trace with the grid size as a graph
    # value, so one traced graph serves every input size (the Fourier positions have no fixed table)
    m = _tiny(name).eval()
    traced = torch.fx.symbolic_trace(m)
    for shape in ((2, 3, 32, 32), (1, 3, 48, 32)):
        x = torch.randn(shape)
        assert torch.equal(traced(x), m(x))


def test_pretrained_without_a_file_is_timms_runtime_error():
    with pytest.raises(RuntimeError, match="No pretrained weights exist for fan_tiny_12_p16_224"):
        timm.create_model("fan_tiny_12_p16_224", pretrained=True)


def test_init_follows_the_authors():
    torch.manual_seed(0)
    m = timm.create_model("fan_tiny_12_p16_224", img_size=32, embed_dim=64, depth=2, num_heads=4)
    w = m.blocks[0].attn.qkv.weight
    assert abs(float(w.detach().std()) - 0.02) < 0.003 and torch.count_nonzero(m.blocks[0].attn.qkv.bias) == 0
    dw = m.blocks[0].mlp.mlp_v.dwconv.conv1.weight
    assert abs(float(dw.detach().std()) - math.sqrt(2 / 9)) < 0.03  # normal(0, sqrt(2 / fan_out)), fan_out = 9
    assert torch.equal(m.blocks[1].gamma1, torch.ones(64)) and torch.equal(m.blocks[0].mlp.temperature, torch.ones(4, 1, 1))


# ----------------------------------------------------------------- library tools on the FAN models
def test_test_time_convert_of_symfan_block0_is_rpc_fan():
    from rpc_attention.integrations.timm import convert, revert

    torch.manual_seed(0)
    sym = _tiny("symfan_tiny_12_p16_224").eval()
    rpc = _tiny("rpc_fan_tiny_12_p16_224").eval()
    rpc.load_state_dict(sym.state_dict())
    x = torch.randn(2, 3, 32, 32)
    before = sym(x)
    convert(sym, rpc_layers=[0], n_iter=4, lambd=4.0)
    assert type(sym.blocks[0].attn) is rnn.RPCAttention and type(sym.blocks[1].attn) is rnn.SymmetricAttention
    assert torch.equal(sym(x), rpc(x)) and not torch.allclose(before, rpc(x), atol=1e-6)
    assert set(sym.state_dict()) == set(rpc.state_dict())  # the authors' names survive conversion
    revert(sym)
    assert torch.equal(sym(x), before)


def test_test_time_convert_of_asymmetric_fan():
    from rpc_attention.integrations.timm import convert, converted_layers, revert

    torch.manual_seed(0)
    m = _tiny("fan_tiny_12_p16_224").eval()
    with torch.no_grad():  # init-sized (std 0.02) projections give near-uniform attention; sharpen it
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(50)
    x = torch.randn(2, 3, 32, 32)

    def block0(model):  # the converted block's output (logits of a random-init model hardly see it)
        return model.forward_intermediates(x, indices=[0], intermediates_only=True)[0]

    before, logits = block0(m), m(x)
    convert(m, rpc_layers="all", n_iter=2, lambd=1e9)  # S = 0: the layer's own attention
    assert converted_layers(m) == [0, 1]
    torch.testing.assert_close(block0(m), before, rtol=1e-5, atol=1e-6)
    convert(m, rpc_layers=[0], n_iter=2, lambd=0.01)
    assert (block0(m) - before).abs().max() > 1e-3
    revert(m)
    assert torch.equal(block0(m), before) and torch.equal(m(x), logits)


FAN_RUN_CFG = {
    "task": "classification",
    "model": {"name": "rpc_fan_tiny_12_p16_224",
              "kwargs": {"num_classes": 10, "img_size": 28, "in_chans": 1, "patch_size": 4, "embed_dim": 16,
                         "depth": 2, "num_heads": 4, "lambd": 0.05}},
    "data": {"name": "fashion_mnist", "mean": [0.2860], "std": [0.3530], "num_classes": 10, "in_chans": 1,
             "img_size": 28},
}


@pytest.fixture(scope="module")
def fan_run(tmp_path_factory):
    """A run directory holding an (untrained) tiny RPC-FAN, as the trainer writes it."""
    import os

    import yaml
    from safetensors.torch import save_file

    if not os.path.isdir(os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")):
        pytest.skip("Fashion-MNIST not installed")
    torch.manual_seed(0)
    m = timm.create_model(FAN_RUN_CFG["model"]["name"], **FAN_RUN_CFG["model"]["kwargs"])
    d = tmp_path_factory.mktemp("fan_run")
    (d / "config.yaml").write_text(yaml.safe_dump(FAN_RUN_CFG))
    save_file({k: v.contiguous().clone() for k, v in m.state_dict().items()}, str(d / "model.safetensors"))
    return d, m.eval()


def test_eval_cli_on_a_fan_run(fan_run):
    import json

    import numpy as np

    from rpc_attention.cli import main
    from rpc_attention.data.images import fashion_mnist

    run, model = fan_run
    assert main(["eval", "--run", str(run), "--suite", "clean,fgsm", "--set", "fgsm.eps=2/255", "--limit", "32"]) == 0
    rec = json.loads((run / "eval" / "clean.json").read_text())
    xi, yi = fashion_mnist("test")
    x = ((torch.from_numpy(np.array(xi[:32])).float() / 255 - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(np.array(yi[:32])).long()
    with torch.no_grad():
        top1 = 100.0 * float((model(x).argmax(1) == y).float().mean())
    assert rec["n_examples"] == 32
    assert json.dumps(rec).count(f"{top1:.4f}"[:5]) >= 1  # the suite's top-1 is this model's top-1
    assert json.loads((run / "eval" / "fgsm.json").read_text())["rows"][0]["eps"] == "2/255"


def test_analyze_cli_on_a_fan_run(fan_run, tmp_path):
    import json

    from rpc_attention.cli import main

    run, _ = fan_run
    out = tmp_path / "kpca"
    assert main(["analyze", "--run", str(run), "--out", str(out), "--limit", "2", "--no-figures",
                 "--protocol", "exact"]) == 0
    data = json.loads((out / "kpca.json").read_text())
    assert list(data["pap"]["clean"]) == ["blocks.0.attn"]  # the PAP block, with its sparse-term statistics
    assert "blocks.1.attn" in json.dumps(data["protocols"]["exact"])


def test_studies_carry_the_rpc_fan_vs_fan_comparison(tmp_path):
    from rpc_attention.report.collect import table_columns
    from rpc_attention.report.paper import PAPER_ROWS
    from rpc_attention.reproduce.studies import build_stages, get_study

    st = get_study("fmnist-full", ["seeds=0"])
    fan = {m.key: m for m in st.models if m.family == "fan"}
    assert {k: m.preset for k, m in fan.items()} == {
        "fan": "fmnist-fan", "symfan": "fmnist-symfan", "rpc_fan": "fmnist-rpc-fan"}
    assert not any("num_heads" in o for m in fan.values() for o in m.overrides)  # the SymViT head override stays out
    corr = [e for e in st.evals if e.suite == "corruptions" and "rpc_fan" in e.models]
    assert len(corr) == 1 and corr[0].baseline_model == "symfan"
    claims = {c.id: (c.baseline, c.rpc, c.table) for c in st.claims if c.table == "fan"}
    assert claims == {"fan_clean": ("symfan", "rpc_fan", "fan"), "fan_mce": ("symfan", "rpc_fan", "fan")}
    names = {s.name for s in build_stages(st)}
    assert {"train.rpc_fan-s0", "eval.rpc_fan-s0.corruptions", "eval.fan-s0.pgd"} <= names
    im = get_study("imagenet", [f"data.imagenet={tmp_path}"])
    assert {m.key: m.preset for m in im.models if m.family == "fan"}["rpc_fan"] == "imagenet-rpc-fan-tiny"
    # the paper's FAN numbers were not found: no invented values, and the report says so
    for pid in ("fan_clean", "fan_mce", "fan_imagenet_a", "fan_imagenet_r"):
        row = PAPER_ROWS[pid]
        assert row["baseline"] is None and row["rpc"] is None and row["found"] is False
        assert "not found" in row["setting"]
    assert [c.paper for _, c in table_columns("fan") if c.paper] == ["fan_clean", "fan_mce", "fan_imagenet_a",
                                                                   "fan_imagenet_r"]


def test_pretrained_cfg_overlay_reaches_the_model():
    m = timm.create_model("symfan_tiny_12_p16_224", pretrained_cfg_overlay=dict(mean=(0.5,), std=(0.25,)), **TINY)
    assert m.pretrained_cfg["mean"] == (0.5,) and m.pretrained_cfg["std"] == (0.25,)
    assert m.pretrained_cfg["rpc_cfg"] == m.rpc_cfg and m.pretrained_cfg["crop_pct"] == 1.0
