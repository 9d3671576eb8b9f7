"""Test-time RPC for evaluation: apply_test_time_rpc and the `rpc-attention eval-external` command."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from rpc_attention.cli import main
from rpc_attention.evaluate import external as ext
from rpc_attention.nn import RPCAttention, SymmetricAttention

FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
TINY_SETS = ["model.kwargs.embed_dim=32", "model.kwargs.depth=2", "model.kwargs.num_heads=2"]


def _tiny_run(tmp_path, preset):
    from safetensors.torch import save_file

    from rpc_attention.train.config import dump_config, resolve_config
    from rpc_attention.train.tasks import get_task

    cfg = resolve_config(preset, TINY_SETS)
    torch.manual_seed(0)
    model = get_task("classification").build_model(cfg)
    run = tmp_path / preset
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / "model.safetensors"))
    return str(run), model


def test_apply_to_symmetric_and_hf_models():
    import timm

    import rpc_attention.models  # noqa: F401  (registers the models in timm)

    sym = timm.create_model("symvit_tiny_patch16_224", img_size=28, in_chans=1, patch_size=7, embed_dim=32, depth=2,
                            num_heads=2, num_classes=10)
    rec = ext.apply_test_time_rpc(sym, dict(rpc_layers="0", n_iter=2))
    assert type(sym.blocks[0].attn) is RPCAttention and type(sym.blocks[1].attn) is SymmetricAttention
    assert rec["converted_blocks"] == [0] and rec["n_iter"] == 2
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                 image_size=28, patch_size=7, num_channels=1, num_labels=10)
    hf = ext.HFClassifier(transformers.AutoModelForImageClassification.from_config(cfg).eval())
    x = torch.randn(2, 1, 28, 28)
    ref = hf(x)
    rec = ext.apply_test_time_rpc(hf, dict(rpc_layers="all", lambd=float("inf")))
    assert hf.hf.config._attn_implementation == "rpc" and "transformers" in rec["via"]
    # lambd = inf: the same attention on sdpa vs through the RPC backend in float32 (different kernels
    # and summation order): rounding of a few eps per layer on logits of this size
    torch.testing.assert_close(hf(x), ref, rtol=0, atol=64 * torch.finfo(torch.float32).eps * float(ref.abs().max()))
    with pytest.raises(ValueError, match="does not know"):
        ext.apply_test_time_rpc(torch.nn.Linear(2, 2), dict(rpc_layers="all"))


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")
def test_cli_test_time_rpc_on_a_run(tmp_path, capsys):
    run, _ = _tiny_run(tmp_path, "fmnist-vit")
    assert main(["eval", "--run", run, "--suite", "clean", "--limit", "40"]) == 0
    assert main(["eval-external", "--run", run, "--suite", "clean", "--limit", "40", "--rpc-layers", "all",
                 "--rpc-lambd", "inf", "--rpc-n-iter", "2"]) == 0
    base = json.loads(open(os.path.join(run, "eval", "clean.json")).read())
    rpc_dir = os.path.join(run, "eval-rpc-all-2it-linf")
    got = json.loads(open(os.path.join(rpc_dir, "clean.json")).read())
    assert got["metrics"]["top1"] == base["metrics"]["top1"]  # huge lambda: the model's own attention
    assert "test_time_rpc" in json.dumps(got)
    # external timm model + checkpoint, with the run's data section
    ckpt = os.path.join(run, "model.safetensors")
    kw = json.dumps({"img_size": 28, "in_chans": 1, "num_classes": 10, "patch_size": 7, "embed_dim": 32, "depth": 2,
                     "num_heads": 2, "drop_path_rate": 0.0})
    out = str(tmp_path / "ext")
    assert main(["eval-external", "--timm", "deit_tiny_patch16_224", "--checkpoint", ckpt, "--model-kwargs", kw,
                 "--data-config", run, "--suite", "clean", "--limit", "40", "--out", out]) == 0
    assert json.loads(open(os.path.join(out, "clean.json")).read())["metrics"]["top1"] == base["metrics"]["top1"]
    # the same keywords as settings in the one KEY=VALUE grammar
    sets = [x for k, v in json.loads(kw).items() for x in ("--set", f"model.kwargs.{k}={v}")]
    out2 = str(tmp_path / "ext2")
    assert main(["eval-external", "--timm", "deit_tiny_patch16_224", "--checkpoint", ckpt, *sets,
                 "--data-config", run, "--suite", "clean", "--limit", "40", "--out", out2]) == 0
    rec = json.loads(open(os.path.join(out2, "clean.json")).read())
    assert rec["metrics"]["top1"] == base["metrics"]["top1"] and rec["source"]["kwargs"] == json.loads(kw)


def test_cli_user_errors(tmp_path, capsys):
    assert main(["eval-external", "--timm", "deit_tiny_patch16_224", "--suite", "clean", "--out", str(tmp_path)]) == 2
    assert "data-config" in capsys.readouterr().err
    assert main(["eval-external", "--run", str(tmp_path), "--rpc-layers", "first"]) == 2
    assert "rpc_layers" in capsys.readouterr().err
    assert main(["eval-external", "--timm", "deit_tiny_patch16_224", "--set", "model.kwargs.depth=2",
                 "--model-kwargs", '{"depth": 3}', "--out", str(tmp_path)]) == 2
    assert "given twice" in capsys.readouterr().err


@pytest.mark.parametrize("name, content, problem", [
    ("bad.safetensors", b"not a safetensors file", "Error while deserializing header: header too large"),
    # torch's reason is the line after its paragraph on weights_only defaults ('n' is pickle operand 110)
    ("bad.pth", b"not a torch file", "torch.load(weights_only=True) refused it: Unsupported operand 110"),
])
def test_cli_unreadable_checkpoint_is_one_line_naming_the_file(tmp_path, capsys, name, content, problem):
    """A corrupt or foreign --checkpoint: one line naming the file and what is wrong, exit 2, no traceback."""
    (tmp_path / "data.yaml").write_text("data: {name: fashion_mnist}\n")
    (tmp_path / name).write_bytes(content)
    rc = main(["eval-external", "--timm", "rpc_symvit_tiny_patch16_224", "--checkpoint", str(tmp_path / name),
               "--data-config", str(tmp_path / "data.yaml"), "--set", "model.kwargs.depth=1",
               "--out", str(tmp_path / "e"), "--limit", "4"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"rpc-attention eval-external: error: cannot read checkpoint {tmp_path / name}: {problem}\n"
