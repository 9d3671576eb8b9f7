"""Attention modules: parameter layout, agreement with the kernels, validation."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpc_attention import functional as RF
from rpc_attention.nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention


def test_symmetric_parameter_layout_matches_official_symvit():
    m = SymmetricAttention(12, num_heads=3, qkv_bias=True)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"qkv.weight": (24, 12), "qkv.bias": (24,), "proj.weight": (12, 12), "proj.bias": (12,)}
    # RPC attention has exactly the same parameters: a SymViT checkpoint loads unchanged
    r = RPCAttention(12, num_heads=3, qkv_bias=True)
    r.load_state_dict(m.state_dict())


def test_symmetric_forward_matches_explicit_formula():
    torch.manual_seed(0)
    m = SymmetricAttention(12, num_heads=3, qkv_bias=True).double().eval()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out = m(x)
    W, b = m.qkv.weight, m.qkv.bias
    kv = x @ W.T + b  # (B, N, 2C): keys then values
    k, v = kv[..., :12], kv[..., 12:]
    heads = []
    for h in range(3):
        kh, vh = k[..., 4 * h: 4 * h + 4], v[..., 4 * h: 4 * h + 4]
        heads.append(torch.softmax(kh @ kh.transpose(-2, -1) / 2, -1) @ vh)
    ref = torch.cat(heads, dim=-1) @ m.proj.weight.T + m.proj.bias
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_rpc_module_uses_pap_with_its_options():
    torch.manual_seed(0)
    r = RPCAttention(16, num_heads=4, qkv_bias=True, n_iter=3, lambd=0.5).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    k, v = r.qkv(x).reshape(2, 7, 2, 4, 4).permute(2, 0, 3, 1, 4)
    expected = RF.pap_attention(k, v, n_iter=3, lambd=0.5, model_dim=16)
    expected = r.proj(expected.transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(r(x), expected, rtol=0, atol=1e-12)
    # n_iter=1 with a huge lambda is the symmetric layer
    s = SymmetricAttention(16, num_heads=4, qkv_bias=True).double().eval()
    r1 = RPCAttention(16, num_heads=4, qkv_bias=True, n_iter=1, lambd=1e12).double().eval()
    r1.load_state_dict(s.state_dict())
    torch.testing.assert_close(r1(x), s(x), rtol=0, atol=1e-12)


def test_rpc_keep_state_records_pap_state():
    r = RPCAttention(8, num_heads=2, n_iter=4).eval()
    r.keep_state = True
    r(torch.randn(3, 5, 8))
    assert r.last_state is not None and r.last_state.n_iter_run == 4
    assert r.last_state.sparse.shape == (3, 2, 5, 4)


@pytest.mark.parametrize("cls", [Attention, SymmetricAttention, RPCAttention])
def test_fused_and_explicit_modules_agree(cls):
    torch.manual_seed(0)
    a = cls(24, num_heads=3, qkv_bias=True).eval()
    b = cls(24, num_heads=3, qkv_bias=True, fused_attn=False).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 11, 24)
    # float32: the two paths round differently. One attention moves outputs by a few eps of their scale
    # (measured <= 2.8 eps max|y| over 20 seeds, 1-3 threads): allow 32. PAP's passes feed each pass's
    # rounding into the next keys (measured <= 60): allow 512, as the kernel test does.
    budget = 512 if cls is RPCAttention else 32
    for is_causal in (False, True):
        expected = b(x, is_causal=is_causal)
        atol = budget * torch.finfo(torch.float32).eps * expected.abs().max().item()
        torch.testing.assert_close(a(x, is_causal=is_causal), expected, rtol=0, atol=atol)


def test_scaled_attention_starts_as_plain_attention():
    torch.manual_seed(0)
    base = Attention(12, num_heads=3, qkv_bias=True).double().eval()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    for mode in ("s", "alpha"):
        m = ScaledAttention(12, num_heads=3, qkv_bias=True, mode=mode, num_tokens=6).double().eval()
        m.load_state_dict({**base.state_dict(), **{k: v for k, v in m.state_dict().items() if k in ("s_matrix", "alpha")}})
        # float64: (I - 0) V takes an extra matmul, so agreement is at rounding level (~1e-16), not bitwise
        torch.testing.assert_close(m(x), base(x), rtol=0, atol=1e-12)
        # and the re-parameterisation is trainable
        m(x).sum().backward()
        p = m.s_matrix if mode == "s" else m.alpha
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_device_and_dtype_threading():
    m = RPCAttention(8, num_heads=2, dtype=torch.float64, device="cpu")
    assert m.qkv.weight.dtype == torch.float64 and m.proj.weight.device.type == "cpu"
    s = ScaledAttention(8, num_heads=2, mode="s", num_tokens=4, dtype=torch.float64)
    assert s.s_matrix.dtype == torch.float64


def test_module_validation_errors():
    with pytest.raises(ValueError, match="divisible"):
        SymmetricAttention(10, num_heads=3)
    with pytest.raises(ValueError, match="n_iter"):
        RPCAttention(8, num_heads=2, n_iter=0)
    with pytest.raises(ValueError, match="lambd"):
        RPCAttention(8, num_heads=2, lambd=-1)
    with pytest.raises(ValueError, match="threshold"):
        RPCAttention(8, num_heads=2, threshold="nope")
    with pytest.raises(ValueError, match="num_tokens"):
        ScaledAttention(8, num_heads=2, mode="s")
    with pytest.raises(ValueError, match="mode"):
        ScaledAttention(8, num_heads=2, mode="beta")
    with pytest.raises(ValueError, match="input width"):
        SymmetricAttention(8, num_heads=2)(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="built for 4 tokens"):
        ScaledAttention(8, num_heads=2, mode="s", num_tokens=4)(torch.randn(1, 5, 8))


def test_import_is_light():
    """`import rpc_attention` must not pull in the heavy optional stacks (import time budget)."""
    code = (
        "import sys, torch, rpc_attention\n"
        "heavy = [m for m in ('timm', 'transformers', 'matplotlib', 'torchattacks', 'imagecorruptions', 'tensorboard',"
        " 'sklearn') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported by `import rpc_attention`: {out.stdout}"


def test_timm_models_need_rpc_attention_models_and_the_docs_say_so():
    """`import rpc_attention` registers nothing in timm (it does not import timm); timm's own error is then
    "Unknown model", and timm has no hook to say more (no monkeypatching), so the README's first model
    block and the package docstring quote it and import rpc_attention.models first."""
    import rpc_attention

    code = ("import timm, rpc_attention\n"
            "try:\n    timm.create_model('rpc_symvit_tiny_patch16_224')\n"
            "except RuntimeError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = "Unknown model (rpc_symvit_tiny_patch16_224)"
    assert out.stdout.strip() == message
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    first_block = readme.split("## Models", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "import rpc_attention.models   # needed:" in first_block
    assert f"`RuntimeError: {message}`" in readme.split("## Models", 1)[1].split("##", 1)[0]
    assert f"``RuntimeError: {message}``" in rpc_attention.__doc__
    assert "import rpc_attention.models  # needed:" in rpc_attention.__doc__


SYMVIT_NAMES = sorted([
    "rpc_symvit_base_patch16_224", "rpc_symvit_small_patch16_224", "rpc_symvit_tiny_patch16_224",
    "scaled_alpha_vit_tiny_patch16_224", "scaled_vit_tiny_patch16_224", "symvit_base_patch16_224",
    "symvit_small_patch16_224", "symvit_tiny_patch16_224"])


def _registered_after(imports: str) -> str:
    code = (f"{imports}\nimport timm\n"
            "print(sorted(n for n in timm.list_models() if 'symvit' in n or n.startswith('scaled')))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("imports", ["import rpc_attention.models, timm", "import timm, rpc_attention.models",
                                     "import timm; from rpc_attention.models import vision"])
def test_importing_models_registers_them_in_timm(imports):
    assert _registered_after(imports) == str(SYMVIT_NAMES)


def test_importing_the_package_alone_registers_nothing():
    """No import hook: `import rpc_attention` then `import timm` leaves timm's registry untouched
    (registration is `import rpc_attention.models`, as for any timm extension)."""
    assert _registered_after("import rpc_attention") == "[]"
    code = "import sys, rpc_attention\nprint([type(f).__name__ for f in sys.meta_path if 'rpc' in type(f).__module__])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parse_layers_is_the_one_layer_spec():
    from rpc_attention.nn import parse_layers

    assert parse_layers("all", 4) == [0, 1, 2, 3] and parse_layers("all") == "all"
    assert parse_layers(None, 4) == parse_layers("none", 4) == parse_layers([], 4) == parse_layers("", 4) == []
    assert parse_layers("0-2, 5", 6) == [0, 1, 2, 5] and parse_layers("[3, 1, 1]", 4) == [1, 3]
    assert parse_layers(2, 3) == [2] and parse_layers((2, 0), 3) == [0, 2]
    for bad, match in [("x", "ranges"), ([5], "out of range"), ([-1], ">= 0"), (True, "block indices"),
                       ([1.5], "integer"), ("1-x", "ranges")]:
        with pytest.raises(ValueError, match=match):
            parse_layers(bad, 4, name="decoder_rpc")
    with pytest.raises(ValueError, match="^decoder_rpc"):
        parse_layers([9], 4, name="decoder_rpc")
