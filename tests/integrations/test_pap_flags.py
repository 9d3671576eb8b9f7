"""The robust PAP options on the command line: eval-external has a --rpc-NAME flag for every option of
the kernel (one table, checked against functional.check_pap_options), and train takes each through
model.kwargs."""

import argparse
import inspect

import pytest

from rpc_attention import functional as RF
from rpc_attention.evaluate import external as ext

KERNEL_OPTIONS = [p for p in inspect.signature(RF.check_pap_options).parameters if p != "is_causal"]
ROBUST = ["--rpc-layers", "0", "--rpc-threshold", "mad", "--rpc-lambd", "6", "--rpc-lowrank", "keys",
          "--rpc-shrink", "hard", "--rpc-dual-step", "0", "--rpc-mu-mode", "head_dim", "--rpc-tol", "1e-3",
          "--rpc-model-dim", "64", "--rpc-n-iter", "2"]


def _parse(argv):
    parser = argparse.ArgumentParser()
    ext.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_kernel_option_has_a_flag():
    assert sorted(ext.PAP_FLAGS) == sorted(KERNEL_OPTIONS)
    parser = argparse.ArgumentParser()
    ext.add_arguments(parser)
    flags = {s for a in parser._actions for s in a.option_strings}
    assert {"--rpc-" + name.replace("_", "-") for name in KERNEL_OPTIONS} <= flags


def test_robust_options_reach_the_conversion():
    opts = ext.rpc_options_from_args(_parse(ROBUST))
    assert (opts["threshold"], opts["lowrank"], opts["shrink"], opts["dual_step"]) == ("mad", "keys", "hard", 0.0)
    assert (opts["mu_mode"], opts["tol"], opts["model_dim"], opts["n_iter"], opts["lambd"]) == (
        "head_dim", 1e-3, 64, 2, 6.0)
    assert ext.rpc_options_from_args(_parse(["--rpc-layers", "0", "--rpc-tol", "none"]))["tol"] is None
    with pytest.raises(ValueError, match="target_fraction"):
        ext.rpc_options_from_args(_parse(["--rpc-layers", "0", "--rpc-threshold", "target_fraction"]))


def test_output_folder_names_the_robust_options():
    from rpc_attention.cli.eval_external import _tag

    tag = _tag(ext.rpc_options_from_args(_parse(ROBUST)))
    assert tag.startswith("eval-rpc-0-2it-l6-mad") and "lowrankkeys" in tag and "shrinkhard" in tag
    assert "dualstep0" in tag and "mumodehead_dim" in tag
    assert _tag(ext.rpc_options_from_args(_parse(["--rpc-layers", "0"]))) == "eval-rpc-0-6it-l4"


def test_train_takes_every_kernel_option_through_model_kwargs():
    from rpc_attention.nn import RPCAttention
    from rpc_attention.train.config import resolve_config
    from rpc_attention.train.tasks import get_task

    values = {"n_iter": 2, "lambd": 6.0, "threshold": "mad", "mu_mode": "head_dim", "tol": 0.001,
              "model_dim": 64, "lowrank": "keys", "shrink": "hard", "dual_step": 0.0, "row_lambd": 3.0}
    assert sorted(values) == sorted(KERNEL_OPTIONS)
    cfg = resolve_config("fmnist-rpc-symvit", ["model.kwargs.depth=1", "model.kwargs.embed_dim=24"]
                         + [f"model.kwargs.{k}={v}" for k, v in values.items()])
    attn = get_task("classification").build_model(cfg).blocks[0].attn
    assert type(attn) is RPCAttention
    assert (attn.lowrank, attn.shrink, attn.dual_step, attn.row_lambd) == ("keys", "hard", 0.0, 3.0)


def test_integrations_doc_shows_the_whole_convert_signature():
    from pathlib import Path

    from rpc_attention.integrations.timm import convert

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    block = text[text.index("## timm"):]
    block = block[block.index("```python"):]
    block = block[:block.index("```", 3)]
    missing = [p for p in list(inspect.signature(convert).parameters)[1:] if f"{p}=" not in block]
    assert not missing
    flags = [f"--rpc-{name.replace('_', '-')}" for name in ext.PAP_FLAGS]
    assert all(flag in text for flag in flags)


def test_the_token_rule_reaches_the_asymmetric_extension_and_is_refused_with_a_cache():
    import pytest
    import torch

    from rpc_attention.integrations._core import (
        asymmetric_rpc_attention,
        cached_asymmetric_rpc_attention,
        check_options,
    )

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k[:, :, 3] += 40.0  # one token's whole key row far out
    opts = dict(n_iter=2, lambd=6.0, threshold="mad", lowrank="keys", shrink="hard", dual_step=0.0)
    plain = asymmetric_rpc_attention(q, k, v, **opts)
    ruled, state = asymmetric_rpc_attention(q, k, v, row_lambd=3.0, return_state=True, **opts)
    assert not torch.allclose(plain, ruled)
    assert torch.equal(state.sparse[:, :, 3] != 0, torch.ones_like(state.sparse[:, :, 3], dtype=torch.bool))
    assert check_options({"row_lambd": 3})["row_lambd"] == 3.0
    with pytest.raises(ValueError, match="row_lambd"):
        cached_asymmetric_rpc_attention(q, k, v, None, row_lambd=3.0)
