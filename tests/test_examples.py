"""The scripts in examples/ run as a user copies them: each one's ``main([..., "--tiny"])`` is imported from
its file and run, and what it prints is checked against what it claims (the losses are finite and fall,
the kernel-PCA numbers are in range, generate() gives the same tokens with and without a cache, the
certified images are a subset of the defended ones and survive the attack, a saved model reloads to the
same logits). An example that needs an optional package is skipped without it; rpc_in_your_module.py
runs once more with every optional package hidden, because it needs only the core."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def load_example(name: str):
    """The module of ``examples/NAME.py`` (not on sys.path: imported from its file)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def falls(losses) -> bool:
    return all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_every_example_has_a_tiny_main_and_names_its_extra():
    names = sorted(p.stem for p in EXAMPLES.glob("*.py"))
    assert names == ["certify_patch", "hf_generate", "kpca_analysis", "rpc_in_your_module", "timm_image_folder"]
    readme = (EXAMPLES / "README.md").read_text()
    for name in names:
        text = (EXAMPLES / f"{name}.py").read_text()
        assert "def main(argv=None)" in text and '"--tiny"' in text, name
        assert "pip install 'rpc-attention" in text or name == "rpc_in_your_module", name
        assert f"examples/{name}.py" in readme, f"examples/README.md does not list {name}"
    assert "pip install rpc-attention`" in (EXAMPLES / "rpc_in_your_module.py").read_text()


def test_rpc_in_your_module_trains_three_attentions():
    res = load_example("rpc_in_your_module").main(["--tiny"])
    assert sorted(res) == ["plain", "rpc", "symmetric"]
    for kind, r in res.items():
        assert falls(r["losses"]), (kind, r["losses"])
        assert 0.0 <= r["accuracy"] <= 1.0
    # RPC has symmetric attention's parameters: its weights load into the symmetric model unchanged
    assert res["rpc"]["params"] == res["symmetric"]["params"]
    res["symmetric"]["model"].load_state_dict(res["rpc"]["model"].state_dict())
    s = res["rpc"]["sparsity"]
    assert 0.0 <= s["frac_nonzero"] <= 1.0 and s["s_over_k"] >= 0.0


def test_rpc_in_your_module_needs_only_the_core():
    # every optional import name of rpc_attention.extras made unimportable (None in sys.modules: import raises
    # ModuleNotFoundError, find_spec answers None), in a fresh interpreter
    code = ("import sys, runpy\n"
            "from rpc_attention.extras import PROVIDERS\n"
            "sys.modules.update(dict.fromkeys(PROVIDERS))\n"
            "sys.argv = ['x', '--tiny', '--attention', 'rpc']\n"
            f"runpy.run_path({str(EXAMPLES / 'rpc_in_your_module.py')!r}, run_name='__main__')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "S non-zero in" in out.stdout


def test_timm_image_folder_trains_saves_and_reloads(tmp_path):
    for name in ("timm", "torchvision", "safetensors", "PIL", "yaml"):
        pytest.importorskip(name)
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            folder = tmp_path / "images" / split / cls
            folder.mkdir(parents=True)
            for i in range(3):  # any size: the script resizes and crops
                Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    res = load_example("timm_image_folder").main([str(tmp_path / "images"), "--tiny", "--out", str(tmp_path / "out")])
    assert res["classes"] == ["cat", "dog"]
    assert all(math.isfinite(v) for v in res["losses"]) and len(res["losses"]) == 2
    assert 0.0 <= res["accuracy"] <= 1.0 and res["logits"].shape == (6, 2)
    assert res["reload_max_diff"] == 0.0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"model.safetensors", "model.json"}


def test_hf_generate_same_tokens_with_and_without_the_cache(tmp_path):
    pytest.importorskip("transformers")
    import rpc_attention.integrations.transformers as rpc_hf

    before = rpc_hf.is_registered()
    res = load_example("hf_generate").main(["--tiny", "--out", str(tmp_path / "llama")])
    assert rpc_hf.is_registered() == before  # main() leaves transformers as it found it
    assert torch.equal(res["cached"], res["uncached"]) and torch.equal(res["cached"], res["static"])
    assert torch.equal(res["reloaded"], res["cached"])
    assert res["tokens_changed"] > 0  # PAP changed the model: eager attention generates other tokens
    # lambd=inf: S = 0, the RPC layer is the model's own attention
    assert res["inf_vs_sdpa"] <= 1e-5 * res["logit_scale"] and res["inf_vs_eager"] <= 1e-4 * res["logit_scale"]


@pytest.mark.parametrize("model", ["vit_tiny_patch16_224", "rpc_symvit_tiny_patch16_224"])
def test_kpca_analysis_numbers_are_in_range(model):
    pytest.importorskip("timm")
    pytest.importorskip("rpc_attention.kpca")
    res = load_example("kpca_analysis").main(["--tiny", "--model", model, "--threads", "1"])
    layers = res["exact"]["layers"]
    assert len(layers) == 2 and not res["exact"]["failures"]
    for layer in layers:
        assert layer["jproj"]["mean"] == pytest.approx(layer["phi2"]["mean"] - layer["h2"]["mean"], rel=1e-6, abs=1e-9)
        assert layer["phi2"]["mean"] >= 0 and layer["h2"]["mean"] >= 0
        assert 0.0 <= layer["optimal_cosine"]["mean"] <= 1.0
        level = res["chance"][f"{layer['tokens']}x{layer['value_dim']}"]["optimal_cosine"]
        assert 0.0 <= level["mean"] <= 1.0 and level["std"] >= 0
    if model.startswith("rpc_"):
        assert list(res["pap"]) == ["blocks.0.attn"]
        stats = res["pap"]["blocks.0.attn"]
        assert 0.0 <= stats["zero_fraction"] <= 1.0 and stats["rel_norm"] >= 0
    else:
        assert res["pap"] == {}


@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")
def test_certify_patch_certificate_holds_and_a_run_reloads(tmp_path):
    pytest.importorskip("rpc_attention.evaluate")
    import yaml
    from safetensors.torch import save_file

    example = load_example("certify_patch")
    res = example.main(["--tiny"])
    assert all(math.isfinite(v) for v in res["losses"])
    assert sum(res["losses"][-10:]) < sum(res["losses"][:10])
    assert res["table"].shape == (32, 9, 9)  # 9 masks of 2x2 tokens on the 4x4 grid, every pair
    cert, defended, survived = res["certified"], res["defended"], res["survived"]
    assert not (cert & ~defended).any() and res["certified_top1"] <= res["defended_top1"]
    # the attack breaks no certified image and cannot lift an image the defence gets wrong
    assert res["certified_broken"] == 0 and not (cert & ~survived).any() and not (survived & ~defended).any()
    assert 0.0 <= res["clean_top1"] <= 100.0

    # the same model as a run directory (config.yaml and model.safetensors, as rpc-attention train writes
    # them): --run loads it and its test split, and gives the same pair table
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"task": "classification", "model": {"name": example.MODEL, "kwargs": example.model_kwargs(example.parse_args(["--tiny"]))},
           "data": {"name": "fashion_mnist", "mean": [0.2860], "std": [0.3530]}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_file(res["model"].state_dict(), str(run / "model.safetensors"))
    again = example.main(["--run", str(run), "--n", "32"])
    assert torch.equal(again["table"], res["table"]) and torch.equal(again["clean"], res["clean"])
    assert again["losses"] == [] and "survived" not in again
