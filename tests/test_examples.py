"""Every script in examples/ runs at its test size and does what its docstring says (a user copies these)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_example_is_tested_here():
    tested = {"rpc_in_your_module", "timm_image_folder", "hf_generate", "kpca_analysis", "certify_patch"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_rpc_in_your_own_module_trains_all_three_attentions():
    res = _load("rpc_in_your_module").main(["--tiny", "--threads", "1"])
    assert set(res) == {"plain", "symmetric", "rpc"}
    for r in res.values():
        assert all(math.isfinite(v) for v in r["losses"]) and 0.0 <= r["accuracy"] <= 1.0
    # symmetric and RPC share their parameters (SymViT weights load into RPC unchanged)
    assert res["symmetric"]["params"] == res["rpc"]["params"]
    rpc = res["rpc"]["model"].state_dict()
    assert set(rpc) == set(res["symmetric"]["model"].state_dict())
    # PAP's sparse part is measured on the RPC layer only
    assert "sparsity" in res["rpc"] and "sparsity" not in res["symmetric"]


def test_timm_model_on_an_image_folder_trains_saves_and_reloads(tmp_path):
    pytest.importorskip("timm")
    from PIL import Image

    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", 6), ("val", 2)):
        for c, cls in enumerate(("cat", "dog")):
            folder = tmp_path / "data" / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                px = (torch.rand(12, 12, 3, generator=gen) * 80 + 120 * c).to(torch.uint8).numpy()
                Image.fromarray(px).save(folder / f"{i}.png")
    res = _load("timm_image_folder").main([str(tmp_path / "data"), "--tiny", "--img-size", "12", "--patch-size", "4",
                                           "--batch", "4", "--threads", "1", "--out", str(tmp_path / "out")])
    assert res["classes"] == ["cat", "dog"] and all(math.isfinite(v) for v in res["losses"])
    assert res["logits"].shape == (4, 2)
    assert res["reload_max_diff"] == 0.0  # timm rebuilds the model from model.json and loads the same weights
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "model.json").is_file()


def test_hugging_face_generate_with_rpc_attention(tmp_path):
    pytest.importorskip("transformers")
    res = _load("hf_generate").main(["--threads", "1", "--out", str(tmp_path / "hf")])
    assert torch.equal(res["cached"], res["uncached"]) and torch.equal(res["cached"], res["static"])
    assert torch.equal(res["reloaded"], res["cached"])  # the saved config.json carries the RPC options
    # with lambd = inf PAP's sparse part is 0 and the layer is symmetric attention: equal to SDPA's logits
    assert res["inf_vs_sdpa"] <= 64 * torch.finfo(torch.float32).eps * max(res["logit_scale"], 1.0)


def test_kernel_pca_analysis_of_a_timm_model():
    pytest.importorskip("timm")
    out = _load("kpca_analysis").main(["--img-size", "16", "--kwarg", "patch_size=4", "--kwarg", "depth=2",
                                       "--kwarg", "embed_dim=32", "--kwarg", "num_heads=4", "--threads", "1"])
    assert out["kwargs"]["depth"] == 2 and "exact" in out and out["chance"]
    assert set(out["pap"]) == set()  # a plain ViT has no PAP layer to report
    m = out["exact"]["model"]
    assert len(out["exact"]["layers"]) == 2
    assert m["jproj"]["mean"] == pytest.approx(m["phi2"]["mean"] - m["h2"]["mean"], rel=1e-5, abs=1e-9)
    assert 0.0 <= m["optimal_cosine"]["mean"] <= 1.0 and m["phi2"]["mean"] >= 0.0


def test_certifying_a_model_against_a_patch():
    pytest.importorskip("timm")
    res = _load("certify_patch").main(["--tiny", "--threads", "1"])
    assert res["losses"][-1] < res["losses"][0]
    # a certified image is correct under the defence, and no random patch changes a certified decision
    assert not (res["certified"] & ~res["defended"]).any()
    assert res["certified"].any() and bool(res["held"].all())
    assert res["masks"] == 9  # a one-token patch on a 4x4 token grid: 2x2-token masks at stride 1
