"""Segmentation data: the composed Fashion-MNIST set (labels match images, determinism, split pools)
and ADE20K reading (label mapping, crops, clear errors) on a synthetic ADEChallengeData2016 tree."""

import numpy as np
import pytest
import torch

from rpc_attention.data.images import fashion_mnist
from rpc_attention.data.segmentation import (
    IGNORE_INDEX,
    ADE20KSegmentation,
    FashionMNISTSegmentation,
    build_datasets,
    seg_collate,
)


def _reference_render(ds, placements, base_image):
    """Re-render the objects of one composed image from its placements with a plain pixel loop."""
    size = ds.size
    label = np.zeros((size, size), dtype=np.int64)
    image = base_image.astype(np.int64).copy()
    for j, cls, top, left, side, flipped in placements:
        item = ds.items[j]
        assert ds.item_labels[j] == cls
        for r in range(side):
            for c in range(side):
                sr = min(int((r + 0.5) * 28 / side), 27)
                cc = side - 1 - c if flipped else c
                sc = min(int((cc + 0.5) * 28 / side), 27)
                v = int(item[sr, sc])
                if v > ds.threshold:
                    image[top + r, left + c] = v
                    label[top + r, left + c] = cls + 1
    return image, label


def test_composer_labels_match_its_images():
    ds = FashionMNISTSegmentation("train", num_images=4, size=64, seed=3)
    overlaps = 0
    for i in range(len(ds)):
        image, label, placements = ds.compose(i)
        assert image.shape == label.shape == (64, 64) and image.dtype == np.uint8
        assert 2 <= len(placements) <= 4
        ref_img, ref_lbl = _reference_render(ds, placements, image)
        np.testing.assert_array_equal(label, ref_lbl)
        np.testing.assert_array_equal(image, ref_img)  # object pixels show exactly the item's grey value
        assert set(np.unique(label)) <= set(range(11))
        assert (label > 0).any() and (label == 0).any()
        # occlusion: boxes of different items overlap somewhere in this small sample
        boxes = [(t, l, s) for _, _, t, l, s, _ in placements]
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                (t1, l1, s1), (t2, l2, s2) = boxes[a], boxes[b]
                overlaps += (t1 < t2 + s2 and t2 < t1 + s1 and l1 < l2 + s2 and l2 < l1 + s1)
    assert overlaps > 0


def test_items_tensors_and_flip():
    ds = FashionMNISTSegmentation("test", num_images=3, size=64, mean=(0.5,), std=(0.25,))
    x, y = ds[1]
    image, label, _ = ds.compose(1)
    assert x.shape == (1, 64, 64) and x.dtype == torch.float32
    assert y.shape == (64, 64) and y.dtype == torch.int64
    torch.testing.assert_close(x[0], (torch.from_numpy(image).float() / 255 - 0.5) / 0.25)
    assert torch.equal(y, torch.from_numpy(label.astype(np.int64)))
    flip = FashionMNISTSegmentation("test", num_images=3, size=64, flip=True)
    seen = set()
    for s in range(8):
        torch.manual_seed(s)
        xf, yf = flip[1]
        flipped = torch.equal(yf, y.flip(-1)) and not torch.equal(yf, y)
        assert flipped or torch.equal(yf, y)
        if flipped:
            torch.testing.assert_close(xf[0], torch.from_numpy(image).float().flip(-1) / 255)
        seen.add(flipped)
    assert seen == {True, False}


def test_deterministic_by_seed_and_split_pools():
    a = FashionMNISTSegmentation("val", num_images=4, seed=7)
    b = FashionMNISTSegmentation("val", num_images=4, seed=7)
    c = FashionMNISTSegmentation("val", num_images=4, seed=8)
    for i in range(4):
        np.testing.assert_array_equal(a.compose(i)[0], b.compose(i)[0])
        np.testing.assert_array_equal(a.compose(i)[1], b.compose(i)[1])
    assert any(not np.array_equal(a.compose(i)[0], c.compose(i)[0]) for i in range(4))
    # image i does not depend on the split size
    np.testing.assert_array_equal(FashionMNISTSegmentation("val", num_images=9, seed=7).compose(3)[1],
                                  a.compose(3)[1])
    train_items, _ = fashion_mnist("train")
    test_items, _ = fashion_mnist("test")
    tr = FashionMNISTSegmentation("train", num_images=2, val_items=10000)
    va = FashionMNISTSegmentation("val", num_images=2, val_items=10000)
    te = FashionMNISTSegmentation("test", num_images=2)
    assert len(tr.items) == 50000 and len(va.items) == 10000 and len(te.items) == 10000
    np.testing.assert_array_equal(tr.items[0], train_items[0])
    np.testing.assert_array_equal(va.items[0], train_items[50000])
    np.testing.assert_array_equal(te.items[5], test_items[5])
    with pytest.raises(ValueError, match="split"):
        FashionMNISTSegmentation("dev")


def test_build_datasets_from_config():
    cfg = {"data": {"name": "fmnist_seg", "img_size": 48, "train_images": 5, "val_images": 3, "test_images": 4,
                    "mean": [0.3], "std": [0.3]}, "train": {"seed": 1}}
    ds = build_datasets(cfg)
    assert (len(ds["train"]), len(ds["val"]), len(ds["test"])) == (5, 3, 4)
    x, y = ds["train"][(2, 0, 2)]  # seeded augmentation index (index, epoch, position)
    x2, y2 = ds["train"][(2, 0, 2)]
    assert x.shape == (1, 48, 48) and torch.equal(x, x2) and torch.equal(y, y2)
    xb, yb = seg_collate([ds["val"][0], ds["val"][1]])
    assert xb.shape == (2, 1, 48, 48) and yb.shape == (2, 48, 48)


def _fake_ade(root, n=2):
    from PIL import Image

    rng = np.random.RandomState(0)
    for sub in ("training", "validation"):
        (root / "images" / sub).mkdir(parents=True)
        (root / "annotations" / sub).mkdir(parents=True)
        for i in range(n):
            h, w = 40 + 10 * i, 60
            Image.fromarray(rng.randint(0, 255, (h, w, 3), dtype=np.uint8)).save(root / "images" / sub / f"ADE_{i}.jpg")
            ann = rng.randint(0, 151, (h, w)).astype(np.uint8)
            ann[0, :3] = [0, 1, 150]
            Image.fromarray(ann).save(root / "annotations" / sub / f"ADE_{i}.png")


def test_ade20k_labels_crops_and_eval_items(tmp_path):
    from PIL import Image

    _fake_ade(tmp_path)
    val = ADE20KSegmentation(str(tmp_path), "val", crop_size=32, mean=None, std=None)
    assert len(val) == 2
    x, y = val[1]
    ann = np.asarray(Image.open(tmp_path / "annotations" / "validation" / "ADE_1.png")).astype(np.int64)
    want = np.where(ann == 0, IGNORE_INDEX, ann - 1)
    np.testing.assert_array_equal(y.numpy(), want)  # 0 -> ignore, k -> k - 1, original resolution
    assert y[0, :3].tolist() == [IGNORE_INDEX, 0, 149]
    assert x.shape[0] == 3 and min(x.shape[-2:]) == 32  # short side resized to the crop size
    train = ADE20KSegmentation(str(tmp_path), "train", crop_size=48, ratio_range=(0.05, 0.05))
    torch.manual_seed(0)
    xt, yt = train[0]
    assert xt.shape == (3, 48, 48) and yt.shape == (48, 48)
    assert (yt == IGNORE_INDEX).any()  # the image is smaller than the crop: padded with ignore
    assert int(yt[yt != IGNORE_INDEX].max()) <= 149


def test_ade20k_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="ADEChallengeData2016"):
        ADE20KSegmentation(str(tmp_path / "nope"), "train")
    (tmp_path / "images" / "training").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="annotations"):
        ADE20KSegmentation(str(tmp_path), "train")
    from rpc_attention.train.config import resolve_config

    with pytest.raises(ValueError, match="data.root"):
        resolve_config("ade20k-segmenter-symvit-tiny", [])
    with pytest.raises(FileNotFoundError, match="ADEChallengeData2016"):
        resolve_config("ade20k-segmenter-symvit-tiny", [f"data.root={tmp_path / 'nope'}"])


def test_seg_data_config_is_typed():
    from rpc_attention.data.segmentation import SegData, build_eval_dataset

    d = SegData.from_config({"name": "fmnist_seg", "n_items": [1, 2], "val_images": None, "num_classes": 11})
    assert d.n_items == (1, 2) and d.val_images == SegData().val_images == 200 and not d.is_ade20k
    assert SegData.from_config({"name": "ADE20K"}).is_ade20k
    ds = build_eval_dataset({"data": {"name": "fmnist_seg", "test_images": 3, "img_size": 32}}, "test")
    assert len(ds) == 3 and tuple(ds[0][0].shape[-2:]) == (32, 32)
