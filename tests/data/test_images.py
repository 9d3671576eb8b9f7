"""Image data: Fashion-MNIST IDX reader, MNIST-5k CSV, eval datasets, seeded augmentation, clear errors."""

import gzip
import struct

import numpy as np
import pytest
import torch

from rpc_attention.data import images as I


def test_fashion_mnist_splits():
    x, y = I.fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert np.bincount(y).tolist() == [1000] * 10
    xt, yt = I.fashion_mnist("train")
    assert xt.shape == (60000, 28, 28) and np.bincount(yt).tolist() == [6000] * 10
    with pytest.raises(ValueError, match="split"):
        I.fashion_mnist("val")


def test_idx_reader_and_missing_or_truncated_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        I.fashion_mnist("test", root=str(tmp_path))
    imgs = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, 3) + struct.pack(">III", 2, 3, 4) + imgs.tobytes())
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 2) + bytes([3, 7]))
    x, y = I.fashion_mnist("test", root=str(tmp_path))
    assert np.array_equal(x, imgs) and y.tolist() == [3, 7]
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, 3) + struct.pack(">III", 2, 3, 4) + imgs.tobytes()[:-5])
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, 1) + struct.pack(">I", 2) + bytes([3, 7]))
    with pytest.raises(ValueError, match="truncated"):
        I.fashion_mnist("train", root=str(tmp_path))


def test_mnist5k():
    x, y = I.mnist5k()
    assert x.shape == (5000, 28, 28) and x.dtype == np.uint8 and x.max() == 255
    assert y.shape == (5000,) and set(np.unique(y)) == set(range(10))


def test_digits8x8_are_scikit_learns_digits_on_the_uint8_scale():
    from sklearn.datasets import load_digits

    x, y = I.digits8x8()
    assert x.shape == (1797, 8, 8) and x.dtype == np.uint8 and x.max() == 255 and x.min() == 0
    ref = load_digits()
    assert np.array_equal(y, ref.target) and np.array_equal(x, np.rint(ref.images * 255 / 16).astype(np.uint8))


def test_eval_dataset_normalisation_and_pixel_space():
    cfg = {"data": {"name": "fashion_mnist", "test_subset": 50, "mean": [0.286], "std": [0.353]}}
    raw = I.build_eval_dataset(cfg, "test", normalize=False)
    norm = I.build_eval_dataset(cfg, "test", normalize=True)
    assert len(raw) == 50
    x0, y0 = raw[3]
    x1, y1 = norm[3]
    assert x0.shape == (1, 28, 28) and x0.dtype == torch.float32 and y0 == y1
    assert float(x0.min()) >= 0 and float(x0.max()) <= 1
    torch.testing.assert_close(x1, (x0 - 0.286) / 0.353)
    full_x, full_y = I.fashion_mnist("test")
    # the subset is drawn with a fixed seed; item 3 is one of the real test images
    matches = np.where((full_x == (x0[0].numpy() * 255).round().astype(np.uint8)).all(axis=(1, 2)))[0]
    assert len(matches) >= 1 and full_y[matches[0]] == y0
    with pytest.raises(ValueError, match="split"):
        I.build_eval_dataset(cfg, "dev")


def test_train_val_split_disjoint():
    cfg = {"data": {"name": "fashion_mnist", "val_size": 100, "augment": {"enabled": False},
                    "mean": [0.0], "std": [1.0]}, "train": {"seed": 0}}
    ds = I.build_datasets(cfg)
    assert len(ds["val"]) == 100 and len(ds["train"]) == 59900 and len(ds["test"]) == 10000
    xt, _ = I.fashion_mnist("train")
    assert torch.equal(ds["val"][0][0][0], torch.from_numpy(xt[59900]).float() / 255)


def test_seeded_augmentation_is_per_sample_and_leaves_global_rng_alone():
    x = np.random.RandomState(0).randint(0, 256, (4, 28, 28)).astype(np.uint8)
    base = I.TensorImageDataset(x, np.arange(4), transform=I.RandomCropFlip(padding=3, flip=True))
    ds = I.SeededTransformDataset(base, seed=11)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = ds[(2, 5, 17)][0]
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, ds[(2, 5, 17)][0])  # same (index, epoch, position) -> same augmentation
    outs = {tuple(ds[(2, e, p)][0].flatten()[:200].tolist()) for e in range(4) for p in range(4)}
    assert len(outs) > 4  # different epochs/positions -> different crops/flips


def test_unknown_dataset_and_imagefolder_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown data set"):
        I.dataset_info("cifar")
    cfg = {"data": {"name": "imagefolder", "root": str(tmp_path)}}
    with pytest.raises(FileNotFoundError, match="val"):
        I.build_eval_dataset(cfg, "test")
    with pytest.raises(FileNotFoundError, match="data.root"):
        I.build_eval_dataset({"data": {"name": "imagefolder"}}, "val")


def test_imagefolder_tree(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.full((40, 48, 3), 60 * i + (100 if c == "b" else 0), np.uint8)).save(
                    tmp_path / split / c / f"{i}.png")
    cfg = {"data": {"name": "imagefolder", "root": str(tmp_path), "img_size": 32}, "train": {"seed": 0}}
    ds = I.build_datasets(cfg)
    assert len(ds["train"]) == 4 and ds["val"].classes == ["a", "b"]
    x, y = ds["val"][3]
    assert x.shape == (3, 32, 32) and y == 1
    xr, _ = I.build_eval_dataset(cfg, "test", normalize=False)[3]
    assert float(xr.min()) >= 0 and float(xr.max()) <= 1
    xt, _ = ds["train"][(0, 0, 0)]
    assert xt.shape == (3, 32, 32)


def test_randaugment_posterize_zero_bits_is_safe(tmp_path):
    from PIL import Image
    from timm.data import auto_augment as aa

    img = Image.fromarray(np.full((4, 4, 3), 200, np.uint8))
    assert np.asarray(I._posterize_any_bits(img, 0)).max() == 0
    assert np.asarray(I._posterize_any_bits(img, 1)).max() == 128
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "train" / c / "0.png")
    ds = I._imagefolder(I.ImageData(name="imagefolder", root=str(tmp_path), img_size=8), "train", True, True)
    ops = [op for t in ds.transform.transforms for op in (getattr(t, "ops", None) or [])]
    assert ops and not any(op.aug_fn is aa.posterize for op in ops)
    assert any(op.aug_fn is I._posterize_any_bits for op in ops)


def test_image_data_config_is_typed_with_one_set_of_defaults():
    from rpc_attention.train.task_classification import ClassificationTask, MixupConfig

    d = I.ImageData.from_config({"name": "fashion_mnist", "val_size": None, "mean": [0.5], "num_classes": 10,
                                 "augment": {"enabled": False, "padding": 3}})
    assert d.val_size == 0 and d.mean == (0.5,) and d.augment == I.Augment(enabled=False, padding=3)
    assert d.stats(True) == ((0.5,), tuple(I.dataset_info("fashion_mnist")["std"])) and d.stats(False) == (None, None)
    with pytest.raises(ValueError, match="did you mean data.augment.padding"):
        I.ImageData.from_config({"name": "fashion_mnist", "augment": {"paddin": 3}})
    # the task's defaults are the dataclasses' (crop_pct and the mixup block are written once)
    defaults = ClassificationTask().default_config()
    assert defaults["data"]["crop_pct"] == I.ImageData().crop_pct
    assert defaults["train"]["mixup"] == {"mixup": 0.0, "cutmix": 0.0, "prob": 1.0, "switch_prob": 0.5,
                                          "label_smoothing": 0.0}
    assert MixupConfig.from_config({"mixup": 0.8, "label_smoothing": 0.1}) == MixupConfig(mixup=0.8, label_smoothing=0.1)
    with pytest.raises(ValueError, match="did you mean train.mixup.cutmix"):
        MixupConfig.from_config({"cutmx": 1.0})


def test_test_offset_leaves_the_first_test_images_out():
    from rpc_attention.data.images import ImageData, _small_dataset, fashion_mnist

    full, labels = fashion_mnist("test")
    ds = _small_dataset(ImageData(test_offset=2000), "test", False, False)
    assert len(ds) == 8000 and torch.equal(torch.as_tensor(ds.images[:5]).reshape(5, 28, 28), torch.as_tensor(full[2000:2005]))
    sub = _small_dataset(ImageData(test_offset=2000, test_subset=100, subset_seed=7), "test", False, False)
    rest = {bytes(x.tobytes()) for x in np.asarray(full[2000:])}
    assert len(sub) == 100 and all(bytes(np.asarray(x).reshape(28, 28).tobytes()) in rest for x in np.asarray(sub.images))
    with pytest.raises(ValueError, match="test_offset=10000"):
        _small_dataset(ImageData(test_offset=10000), "test", False, False)
