"""Every registered suite gives bit-identical results for the same (model, settings, seed): run twice,
and once more at another intra-op thread count.

A suite that draws from an unseeded generator (imagecorruptions' impulse noise did: scikit-image's
``random_noise`` seeds itself from the operating system unless given a generator) fails here.  A new
suite must be added to ``CASES`` (the coverage test fails otherwise)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from corpora import random_wikitext, wikitext_settings

from rpc_attention.evaluate import suites as S
from rpc_attention.kpca import register_suites

register_suites()  # the analysis toolkit's suite (a floor above the registry) is covered too


def _rgb():
    """An untrained 32x32 RGB RPC-SymViT for the ImageNet-A/-R style suites."""
    import timm

    import rpc_attention.models  # noqa: F401  (registers the models in timm)

    kw = {"num_classes": 10, "img_size": 32, "in_chans": 3, "patch_size": 8, "embed_dim": 32, "depth": 1,
          "num_heads": 2, "rpc_layers": "all", "n_iter": 2}
    cfg = {"task": "classification", "model": {"name": "rpc_symvit_tiny_patch16_224", "kwargs": kw},
           "data": {"name": "imagefolder", "mean": [0.5] * 3, "std": [0.25] * 3, "num_classes": 10, "in_chans": 3,
                    "img_size": 32}}
    torch.manual_seed(0)
    return timm.create_model(cfg["model"]["name"], **kw).eval(), cfg


def _image_folder(root):
    """Two class folders of three 40x40 RGB images each, and the class list "0, 1"."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("n0", "n1"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    (root / "classes.txt").write_text("0\n1\n")
    return root


def _lm(tmp):
    from rpc_attention.train import resolve_config
    from rpc_attention.train.tasks import get_task

    root = random_wikitext(tmp / "wt")
    cfg = resolve_config("wiki-rpc-symlm", [
        *wikitext_settings(root, tmp / "cache"),
        "model.kwargs.n_layer=1", "model.kwargs.d_model=16", "model.kwargs.n_head=2", "model.kwargs.d_inner=32",
        "model.kwargs.context=16", "model.kwargs.rpc_layers=[0]", "model.kwargs.n_iter=2",
        "model.kwargs.cutoffs=[6]"])
    torch.manual_seed(0)
    return get_task("lm").build_model(cfg).eval(), cfg


class _SegModel(torch.nn.Module):
    """A fixed random 1x1-conv segmenter: logits depend on every pixel value."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 11, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g))

    def forward(self, x):
        return self.conv(x)


def _seg_cfg():
    return {"task": "segmentation", "model": {"num_classes": 11},
            "data": {"name": "fmnist_seg", "img_size": 64, "test_images": 4, "val_images": 2, "train_images": 2,
                     "mean": [0.27], "std": [0.26]}, "eval": {}}


# suite -> (model kind, --set options, limit); small but exercising every random draw of the suite
CASES = {
    "clean": ("gray", {}, 8),
    "fgsm": ("gray", {"fgsm.eps": "2/255,8/255"}, 8),
    "pgd": ("gray", {"pgd.eps": "8/255", "pgd.steps": "3"}, 8),
    "noise": ("gray", {"noise.eps": "8/255"}, 8),
    "sld": ("gray", {"sld.steps": "2"}, 4),
    "cw": ("gray", {"cw.steps": "3"}, 4),
    "spsa": ("gray", {"spsa.steps": "1", "spsa.n_samples": "8", "spsa.max_batch_size": "8"}, 4),
    "square": ("gray", {"square.n_queries": "10", "square.eps": "8/255"}, 4),
    "autoattack": ("gray", {"autoattack.steps": "2", "autoattack.targets": "1", "autoattack.n_queries": "5",
                            "autoattack.eps": "8/255"}, 4),
    "corruptions": ("gray", {}, 3),  # all 15 corruptions x 5 severities
    "ood": ("gray", {}, 16),
    "sparse": ("gray", {}, 8),
    "patch": ("gray", {"patch.steps": "2", "patch.restarts": "2"}, 8),
    "certify": ("gray", {"certify.attack_steps": "1", "certify.attack_certified": "true"}, 4),
    "imagenet-a": ("rgb", {}, 6),
    "imagenet-r": ("rgb", {}, 6),
    "ppl": ("lm", {"ppl.stride": "4"}, 60),
    "wordswap": ("lm", {"wordswap.stride": "4", "wordswap.rate": "0.2"}, 60),
    "seg": ("seg", {}, 4),
    "seg-corruptions": ("seg", {"seg-corruptions.severities": "3,5"}, 2),
    "kpca": ("gray", {}, 2),
}


def test_every_registered_suite_is_covered():
    assert set(S.list_suites()) == set(CASES)


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("det")
    gray, gray_cfg = tiny_model
    rgb, rgb_cfg = _rgb()
    return {"gray": (gray, gray_cfg, {}), "rgb": (rgb, rgb_cfg, {"root": _image_folder(tmp / "in-a")}),
            "lm": (*_lm(tmp), {}), "seg": (_SegModel().eval(), _seg_cfg(), {})}


def _result(name, models):
    kind, sets, limit = CASES[name]
    model, cfg, extra = models[kind]
    sets = dict(sets)
    if "root" in extra:
        sets.update({f"{name}.root": str(extra["root"]), f"{name}.classes": str(extra["root"] / "classes.txt")})
    suite = S.get_suite(name)
    opts = S.resolve_options(suite, sets, limit)
    if suite.check is not None:
        suite.check(cfg, opts)
    rec = S.run_suite(suite, model, cfg, None, opts)
    keep = {k: v for k, v in rec.items() if k not in ("wall_time_s", "finished", "environment")}
    # JSON text: floats written with repr (exact), and NaN (an absent class's IoU) equal to itself
    return json.dumps(keep, sort_keys=True, default=str)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_suite_gives_identical_results_twice_and_at_another_thread_count(name, models):
    first = _result(name, models)
    # draws between the runs must not matter either (each run seeds its own generators)
    torch.rand(3), np.random.rand(3), random.random()
    assert _result(name, models) == first
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        assert _result(name, models) == first
    finally:
        torch.set_num_threads(threads)
    assert json.loads(first)["metrics"]
