"""Segmentation metrics against a hand-computed confusion matrix, and the seg / seg-corruptions suites."""

import math

import numpy as np
import pytest
import torch

from rpc_attention.evaluate.per_example import example_data
from rpc_attention.evaluate.segmentation import (
    IGNORE_INDEX,
    SegEvaluator,
    confusion_matrix,
    metrics_from_confusion,
    miou_of_stats,
    seg_corruptions_suite,
    seg_suite,
)
from rpc_attention.evaluate.suites import get_suite, list_suites


def test_confusion_matrix_and_miou_by_hand():
    # 3 classes; one ignored pixel; class 2 never predicted
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 1, IGNORE_INDEX]])
    pred = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 2]])
    cm = confusion_matrix(pred, target, 3)
    # rows = ground truth, columns = prediction
    want = torch.tensor([[1, 1, 0],
                         [0, 3, 0],
                         [1, 1, 0]])
    assert torch.equal(cm, want)
    m = metrics_from_confusion(cm)
    # pixel acc = (1 + 3 + 0) / 7; per-class acc = 1/2, 3/3, 0/2
    assert m["pixel_acc"] == pytest.approx(100 * 4 / 7)
    assert m["mean_acc"] == pytest.approx(100 * (0.5 + 1.0 + 0.0) / 3)
    # IoU: class0 = 1 / (2 + 2 - 1) = 1/3; class1 = 3 / (3 + 5 - 3) = 3/5; class2 = 0 / (2 + 0 - 0) = 0
    assert m["iou"] == pytest.approx([100 / 3, 60.0, 0.0])
    assert m["miou"] == pytest.approx(100 * (1 / 3 + 3 / 5 + 0) / 3)


def test_absent_classes_are_left_out_of_the_means():
    cm = torch.tensor([[4, 0, 0], [0, 0, 0], [1, 0, 5]])  # class 1 neither in ground truth nor predicted
    m = metrics_from_confusion(cm)
    assert math.isnan(m["iou"][1]) and math.isnan(m["acc"][1])
    assert m["miou"] == pytest.approx(100 * (4 / 5 + 5 / 6) / 2)
    assert m["mean_acc"] == pytest.approx(100 * (1.0 + 5 / 6) / 2)


def test_evaluator_accumulates_over_batches():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 6, 7)
    target = torch.randint(0, 5, (4, 6, 7))
    target[0, 0, :3] = IGNORE_INDEX
    ev = SegEvaluator(5)
    ev.update(logits[:1], target[:1])
    ev.update(logits[1:], target[1:])
    assert torch.equal(ev.cm, confusion_matrix(logits.argmax(1), target, 5))
    res = ev.result()
    assert res["n"] == 4
    # per-image counts: tp, ground truth, prediction per class, summing to the accumulated matrix's
    stats = ev.image_stats()
    assert stats.shape == (4, 15)
    np.testing.assert_array_equal(stats.sum(0), torch.cat([ev.cm.diag(), ev.cm.sum(1), ev.cm.sum(0)]).numpy())
    assert miou_of_stats(stats, 5) == pytest.approx(metrics_from_confusion(ev.cm)["miou"], abs=1e-12)
    want_loss = torch.nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)
    # the evaluator accumulates the float32 loss batch by batch, cross_entropy in one mean: rounding only
    assert res["loss"] == pytest.approx(float(want_loss), rel=128 * torch.finfo(torch.float32).eps)


def test_suites_registered_for_segmentation():
    names = list_suites("segmentation")
    assert "seg" in names and "seg-corruptions" in names
    assert get_suite("seg").tasks == ("segmentation",)


class _Oracle(torch.nn.Module):
    """Predicts from the pixel intensity: bright (object) -> class 1, dark -> background."""

    num_classes = 11

    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = mean, std
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        x01 = x * self.std + self.mean
        out = torch.zeros(x.shape[0], 11, *x.shape[-2:])
        out[:, 1] = (x01[:, 0] - 0.35) * 10
        return out


def _cfg():
    return {"task": "segmentation", "model": {"num_classes": 11},
            "data": {"name": "fmnist_seg", "img_size": 64, "test_images": 6, "val_images": 2, "train_images": 2,
                     "mean": [0.27], "std": [0.26]}, "eval": {}}


def test_seg_suite_metrics_and_examples(tmp_path):
    from PIL import Image

    from rpc_attention.data.segmentation import build_eval_dataset

    cfg = _cfg()
    model = _Oracle(0.27, 0.26)
    out = seg_suite(model, cfg, str(tmp_path), {"split": "test", "save_examples": 2, "batch_size": 4,
                                                "limit": None, "device": "cpu"})
    # the same numbers computed directly
    ds = build_eval_dataset(cfg, "test", normalize=True)
    ev = SegEvaluator(11)
    for i in range(len(ds)):
        x, y = ds[i]
        ev.update(model(x[None]), y[None])
    ref = metrics_from_confusion(ev.cm)
    assert out["metrics"]["miou"] == pytest.approx(ref["miou"])
    assert out["metrics"]["pixel_acc"] == pytest.approx(ref["pixel_acc"])
    assert out["metrics"]["mean_acc"] == pytest.approx(ref["mean_acc"])
    assert out["n_examples"] == 6 and len(out["rows"]) == 11
    assert out["metrics"]["baseline_all_class0_miou"] < out["metrics"]["miou"]
    # per-image counts: summed over the images they give the suite's mIoU (the report's bootstrap unit)
    data = example_data(out["per_example"], "miou")
    assert data.values.shape == (6, 33)
    assert data.statistic(data.values, None) == pytest.approx(out["metrics"]["miou"], abs=1e-9)
    pngs = sorted((tmp_path / "eval" / "seg_examples").glob("*.png"))
    assert len(pngs) == 2
    img = np.asarray(Image.open(pngs[0]))
    assert img.shape[0] == 64 * 4 and img.shape[1] == (3 * 64 + 4) * 4  # input | gt | prediction


def test_seg_corruptions_suite_labels_unchanged():
    cfg = _cfg()
    model = _Oracle(0.27, 0.26)
    opts = {"split": "test", "limit": 3, "batch_size": 2, "corruptions": ["contrast", "gaussian_noise"],
            "severities": "1,5", "seed": 0, "device": "cpu"}
    out = seg_corruptions_suite(model, cfg, None, opts)
    rows = out["rows"]
    assert [(r["corruption"], r["severity"]) for r in rows] == [
        ("clean", 0), ("contrast", 1), ("contrast", 5), ("gaussian_noise", 1), ("gaussian_noise", 5)]
    clean = seg_suite(model, cfg, None, {"split": "test", "limit": 3, "batch_size": 2, "device": "cpu"})
    assert rows[0]["miou"] == pytest.approx(clean["metrics"]["miou"])
    # the intensity oracle is hurt by strong contrast loss
    assert rows[2]["miou"] < rows[0]["miou"]
    assert out["metrics"]["corrupted_miou"] == pytest.approx(np.mean([r["miou"] for r in rows[1:]]))
    for key in ("clean_miou", "corrupted_miou"):  # per-image counts reproduce both metrics
        data = example_data(out["per_example"], key)
        assert data.statistic(data.values, None) == pytest.approx(out["metrics"][key], abs=1e-9), key
    # deterministic
    again = seg_corruptions_suite(model, cfg, None, opts)
    assert again["rows"] == rows


def test_save_examples_resizes_input_to_label_resolution(tmp_path):
    """ADE20K eval items: the input is resized, the label kept at the original size."""
    from PIL import Image

    from rpc_attention.evaluate.segmentation import save_examples

    x = torch.rand(1, 3, 8, 10)
    y = torch.randint(0, 4, (1, 16, 20))
    y[0, 0, 0] = IGNORE_INDEX
    (path,) = save_examples(x, y, y.clamp(max=3), 4, str(tmp_path), scale=1)
    assert np.asarray(Image.open(path)).shape == (16, 3 * 20 + 4, 3)
