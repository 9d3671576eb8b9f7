"""The robust PAP options (lowrank, shrink, dual_step, threshold='mad') reach the kernel through
RPCAttention and the SymViT family, and are validated up front there."""

import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the timm entry points)
from rpc_attention import functional as RF
from rpc_attention.nn import RPCAttention

ROBUST = dict(threshold="mad", lambd=8.0, lowrank="keys", shrink="hard", dual_step=0.0)


def test_rpc_attention_runs_the_kernel_with_the_robust_options():
    torch.manual_seed(0)
    layer = RPCAttention(8, num_heads=2, n_iter=3, **ROBUST).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    k, v = layer.qkv(x).reshape(2, 7, 2, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
    ref = RF.pap_attention(k, v, n_iter=3, model_dim=8, **ROBUST)
    torch.testing.assert_close(layer(x), layer.proj(ref.transpose(1, 2).reshape(2, 7, 8)), rtol=0, atol=1e-12)
    assert layer.pap_options()["lowrank"] == "keys" and "dual_step=0.0" in repr(layer)
    official = RPCAttention(8, num_heads=2, n_iter=3).double()
    official.load_state_dict(layer.state_dict())
    assert (official(x) - layer(x)).abs().max() > 1e-6


def test_symvit_threads_the_robust_options_into_its_rpc_blocks():
    model = timm.create_model("rpc_symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10,
                         embed_dim=16, depth=2, num_heads=2, rpc_layers=[0], n_iter=2, **ROBUST)
    opts = model.blocks[0].attn.pap_options()
    assert (opts["threshold"], opts["lowrank"], opts["shrink"], opts["dual_step"]) == ("mad", "keys", "hard", 0.0)
    assert (model.rpc_cfg["lowrank"], model.rpc_cfg["dual_step"]) == ("keys", 0.0)


@pytest.mark.parametrize("bad, match", [(dict(shrink="firm"), "shrink"), (dict(lowrank="svd"), "lowrank"),
                                        (dict(dual_step=-1.0), "dual_step")])
def test_bad_robust_options_fail_at_construction(bad, match):
    with pytest.raises(ValueError, match=match):
        RPCAttention(8, num_heads=2, **bad)
    with pytest.raises(ValueError, match=match):
        timm.create_model("rpc_symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=2,
                     num_heads=2, rpc_layers=[0], **bad)


def test_fan_lm_and_integrations_take_the_robust_options():
    from rpc_attention.integrations import asymmetric_rpc_attention
    from rpc_attention.integrations import timm as rpc_timm
    from rpc_attention.models.lm import lm_config

    fan = timm.create_model("rpc_fan_tiny_12_p16_224", img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2,
                            num_classes=10, **ROBUST)
    assert any(isinstance(m, RPCAttention) and (m.lowrank, m.shrink) == ("keys", "hard") for m in fan.modules())
    cfg = lm_config("symlm-small", rpc_layers=[0], shrink="hard", dual_step=0.5)
    assert (cfg.shrink, cfg.dual_step) == ("hard", 0.5)
    with pytest.raises(ValueError, match="dual_step"):
        lm_config("symlm-small", rpc_layers=[0], dual_step=-1.0)
    vit = timm.create_model("symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, embed_dim=16, depth=1,
                            num_heads=2)
    rpc_timm.convert(vit, rpc_layers=[0], n_iter=2, **ROBUST)
    assert vit.blocks[0].attn.pap_options()["dual_step"] == 0.0
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    k[0, 0, 2, 1] = 40.0
    out, state = asymmetric_rpc_attention(q, k, v, n_iter=2, return_state=True, **ROBUST)
    assert state.sparse[0, 0, 2, 1] != 0 and state.sparse.count_nonzero() <= 3
    with pytest.raises(ValueError, match="shrink"):
        rpc_timm.convert(vit, rpc_layers=[0], shrink="firm")


def test_token_rule_reaches_the_kernel_through_rpc_attention_and_symvit():
    torch.manual_seed(1)
    rule = dict(ROBUST, lambd=6.0, row_lambd=3.0)
    layer = RPCAttention(8, num_heads=2, n_iter=2, **rule).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    x[:, 4] += 25.0  # one token far out
    k, v = layer.qkv(x).reshape(2, 9, 2, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
    ref = RF.pap_attention(k, v, n_iter=2, model_dim=8, **rule)
    torch.testing.assert_close(layer(x), layer.proj(ref.transpose(1, 2).reshape(2, 9, 8)), rtol=0, atol=1e-12)
    assert layer.pap_options()["row_lambd"] == 3.0 and "row_lambd=3.0" in repr(layer)
    model = timm.create_model("rpc_symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1, num_classes=10,
                              embed_dim=16, depth=2, num_heads=2, rpc_layers=[0], n_iter=2, **rule)
    assert model.blocks[0].attn.row_lambd == 3.0 and model.rpc_cfg["row_lambd"] == 3.0
    assert "row_lambd" not in timm.create_model("rpc_symvit_tiny_patch16_224", img_size=28, patch_size=7, in_chans=1,
                                                embed_dim=16, depth=1, num_heads=2, rpc_layers=[0]).rpc_cfg
    with pytest.raises(ValueError, match="row_lambd"):
        RPCAttention(8, num_heads=2, row_lambd=-1.0)
