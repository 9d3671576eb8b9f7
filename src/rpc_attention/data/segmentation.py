"""Segmentation data: a Fashion-MNIST composition (embedded default) and ADE20K (user-supplied folder).

Items are ``(image float [C, H, W], label int64 [H, W])``; label ``255`` (:data:`IGNORE_INDEX`) marks
pixels that take no part in the loss or the metrics.

**Composed Fashion-MNIST** (:class:`FashionMNISTSegmentation`): no package ships a segmentation set,
so each image is a canvas (a smooth random background texture plus noise) with a few real
Fashion-MNIST items pasted at random positions and scales (later items occlude earlier ones).
Labels: 0 = background, ``1 + c`` = Fashion-MNIST class ``c`` (11 labels). An item pixel counts as
object where its grey value exceeds ``threshold``; there the image shows the item's pixel and the
label its class. Image ``i`` of a split depends only on ``(seed, split, i)`` (deterministic, no
state). Train and val draw items from disjoint parts of the Fashion-MNIST train split, test from the
test split.

**ADE20K** (:class:`ADE20KSegmentation`): the ``ADEChallengeData2016`` folder (``images/`` and
``annotations/``, each with ``training/`` and ``validation/``). 150 classes; annotation 0 (other) is
ignored (255) and classes 1..150 become 0..149. Training: random resize of the (2048, 512) scale
by a ratio in [0.5, 2.0], random crop (pad with ignore where smaller), horizontal flip and
photometric distortion (brightness, contrast, saturation, hue). Evaluation: short side resized to
the crop size; labels stay at the original resolution (predictions are resized back), and the
model is run by sliding windows (see :func:`rpc_attention.models.segmentation.sliding_window_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

IGNORE_INDEX = 255
FMNIST_SEG_CLASSES = (
    "background", "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
    "Ankle boot",
)
# Pixel statistics of the default composition (64x64, 2-4 items), measured on 2,000 train images.
FMNIST_SEG_MEAN, FMNIST_SEG_STD = (0.2712,), (0.2586,)
ADE20K_MEAN = (0.485, 0.456, 0.406)
ADE20K_STD = (0.229, 0.224, 0.225)
_SPLIT_CODE = {"train": 0, "val": 1, "test": 2}


# ------------------------------------------------------------------------------ Fashion-MNIST canvas
def _resize_nearest(item: np.ndarray, side: int) -> np.ndarray:
    idx = np.minimum((np.arange(side) + 0.5) * item.shape[0] / side, item.shape[0] - 1).astype(np.int64)
    return item[idx][:, idx]


def compose_canvas(rng: np.random.Generator, items: np.ndarray, labels: np.ndarray, size: int = 64,
                   n_items: Tuple[int, int] = (2, 4), scale: Tuple[float, float] = (0.8, 1.5),
                   threshold: int = 20, background_max: int = 70, noise_std: float = 6.0):
    """One composed image: ``(image uint8 [size, size], label uint8 [size, size], placements)``.

    ``placements`` lists ``(item_index, class, top, left, side, flipped)`` in paste order; a pixel
    belongs to the last item pasted over it whose (resized) grey value exceeds ``threshold``.
    """
    # Background: a smooth 4x4 random grid upsampled bilinearly, plus pixel noise.
    grid = torch.from_numpy(rng.uniform(0, background_max, size=(1, 1, 4, 4)).astype(np.float32))
    bg = F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=True)[0, 0].numpy()
    bg = bg + rng.normal(0.0, noise_std, size=(size, size))
    image = np.clip(np.rint(bg), 0, 255).astype(np.uint8)
    label = np.zeros((size, size), dtype=np.uint8)
    placements = []
    k = int(rng.integers(n_items[0], n_items[1] + 1))
    for _ in range(k):
        j = int(rng.integers(len(items)))
        side = int(round(28 * rng.uniform(scale[0], scale[1])))
        side = max(4, min(side, size))
        item = _resize_nearest(items[j], side)
        flipped = bool(rng.random() < 0.5)
        if flipped:
            item = item[:, ::-1]
        top = int(rng.integers(0, size - side + 1))
        left = int(rng.integers(0, size - side + 1))
        obj = item > threshold
        win_img = image[top:top + side, left:left + side]
        win_lbl = label[top:top + side, left:left + side]
        win_img[obj] = item[obj]
        win_lbl[obj] = int(labels[j]) + 1
        placements.append((j, int(labels[j]), top, left, side, flipped))
    return image, label, placements


class FashionMNISTSegmentation(Dataset):
    """Deterministic segmentation set composed from real Fashion-MNIST items (see module docstring).

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``.
        num_images: images in the split.
        size: canvas side (64 or larger recommended).
        n_items: inclusive range of items per image.
        scale: range of the item scale (28 px times this).
        val_items: Fashion-MNIST train items reserved for the val split (the last ones).
        seed: composition seed (image ``i`` depends only on ``seed, split, i``).
        mean, std: normalisation (``None`` leaves images in [0, 1]).
        flip: random horizontal flip of image and label together (torch global RNG; training only).
        root: folder with the Fashion-MNIST IDX files (default: the Debian package's).
    """

    classes = FMNIST_SEG_CLASSES

    def __init__(self, split: str = "train", num_images: int = 2000, size: int = 64,
                 n_items: Sequence[int] = (2, 4), scale: Sequence[float] = (0.8, 1.5), val_items: int = 10000,
                 seed: int = 0, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 flip: bool = False, threshold: int = 20, background_max: int = 70, noise_std: float = 6.0,
                 root: Optional[str] = None) -> None:
        from .images import fashion_mnist

        if split not in _SPLIT_CODE:
            raise ValueError(f"segmentation split must be 'train', 'val' or 'test', got {split!r}")
        if size < 28:
            raise ValueError(f"canvas size must be at least 28, got {size}")
        n_items = (int(n_items[0]), int(n_items[1]))
        if not 1 <= n_items[0] <= n_items[1]:
            raise ValueError(f"n_items must be a range [lo, hi] with 1 <= lo <= hi, got {list(n_items)}")
        if num_images < 1:
            raise ValueError(f"num_images must be positive, got {num_images}")
        images, labels = fashion_mnist("test" if split == "test" else "train", root)
        val_items = int(val_items)
        if split != "test":
            if not 0 < val_items < len(labels):
                raise ValueError(f"val_items must be in 1..{len(labels) - 1}, got {val_items}")
            sl = slice(len(labels) - val_items, None) if split == "val" else slice(0, len(labels) - val_items)
            images, labels = images[sl], labels[sl]
        self.items, self.item_labels = images, labels
        self.split, self.num_images, self.size = split, int(num_images), int(size)
        self.n_items, self.scale = n_items, (float(scale[0]), float(scale[1]))
        self.seed, self.flip = int(seed), bool(flip)
        self.threshold, self.background_max, self.noise_std = int(threshold), int(background_max), float(noise_std)
        self.mean = None if mean is None else torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
        self.std = None if std is None else torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1)
        self.num_classes = len(FMNIST_SEG_CLASSES)

    def __len__(self) -> int:
        return self.num_images

    def compose(self, i: int):
        """``(image uint8 [H, W], label uint8 [H, W], placements)`` of image ``i`` (no flip, no normalisation)."""
        if not 0 <= i < self.num_images:
            raise IndexError(f"index {i} out of range for {self.num_images} images")
        rng = np.random.default_rng([self.seed, _SPLIT_CODE[self.split], int(i)])
        return compose_canvas(rng, self.items, self.item_labels, self.size, self.n_items, self.scale,
                              self.threshold, self.background_max, self.noise_std)

    def __getitem__(self, i: int):
        image, label, _ = self.compose(int(i))
        x = torch.from_numpy(image).float().div_(255.0).unsqueeze(0)
        y = torch.from_numpy(label.astype(np.int64))
        if self.flip and bool(torch.rand(()) < 0.5):
            x, y = x.flip(-1), y.flip(-1)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x, y


# -------------------------------------------------------------------------------------------- ADE20K
ADE20K_NUM_CLASSES = 150


def _ade_pairs(root: Path, split: str) -> List[Tuple[Path, Path]]:
    sub = "training" if split == "train" else "validation"
    img_dir, ann_dir = root / "images" / sub, root / "annotations" / sub
    for d in (img_dir, ann_dir):
        if not d.is_dir():
            raise FileNotFoundError(
                f"ADE20K: expected the folder {d} (data.root must be an ADEChallengeData2016 directory with "
                f"images/{{training,validation}} and annotations/{{training,validation}})")
    pairs = []
    for img in sorted(img_dir.glob("*.jpg")):
        ann = ann_dir / (img.stem + ".png")
        if not ann.is_file():
            raise FileNotFoundError(f"ADE20K: annotation {ann} missing for image {img}")
        pairs.append((img, ann))
    if not pairs:
        raise FileNotFoundError(f"ADE20K: no .jpg images in {img_dir}")
    return pairs


def _photometric(x: torch.Tensor) -> torch.Tensor:
    """mmseg-style photometric distortion on a float [3, H, W] image in [0, 255] (torch global RNG)."""
    import torchvision.transforms.functional as TF

    def coin() -> bool:
        return bool(torch.rand(()) < 0.5)

    if coin():  # brightness: additive delta in [-32, 32]
        x = (x + float(torch.empty(()).uniform_(-32, 32))).clamp_(0, 255)
    contrast_first = coin()
    if contrast_first and coin():
        x = (x * float(torch.empty(()).uniform_(0.5, 1.5))).clamp_(0, 255)
    x01 = x / 255.0
    if coin():
        x01 = TF.adjust_saturation(x01, float(torch.empty(()).uniform_(0.5, 1.5)))
    if coin():
        x01 = TF.adjust_hue(x01, float(torch.empty(()).uniform_(-18, 18)) / 360.0)
    x = x01.clamp(0, 1) * 255.0
    if not contrast_first and coin():
        x = (x * float(torch.empty(()).uniform_(0.5, 1.5))).clamp_(0, 255)
    return x


class ADE20KSegmentation(Dataset):
    """ADE20K (``ADEChallengeData2016``) for training (random crops) or evaluation (whole images).

    Training items are ``crop_size`` squares (padded with 0 / ignore where the resized image is
    smaller). Evaluation items are the image resized so that its short side is ``crop_size`` (capped
    so the long side is at most 4x) and the label at its original resolution.
    """

    num_classes = ADE20K_NUM_CLASSES

    def __init__(self, root: str, split: str = "train", crop_size: int = 512, train: Optional[bool] = None,
                 ratio_range: Sequence[float] = (0.5, 2.0), scale: Sequence[int] = (2048, 512),
                 mean: Optional[Sequence[float]] = ADE20K_MEAN, std: Optional[Sequence[float]] = ADE20K_STD,
                 limit: Optional[int] = None) -> None:
        if not root:
            raise FileNotFoundError("ADE20K needs data.root=PATH to an ADEChallengeData2016 directory")
        root_p = Path(root).expanduser()
        if not root_p.is_dir():
            raise FileNotFoundError(f"ADE20K root {root_p} does not exist (expected an ADEChallengeData2016 directory)")
        if split not in ("train", "val", "test"):
            raise ValueError(f"ADE20K split must be 'train', 'val' or 'test', got {split!r}")
        self.pairs = _ade_pairs(root_p, split)
        if limit:
            self.pairs = self.pairs[: int(limit)]
        self.train = (split == "train") if train is None else bool(train)
        self.crop_size = int(crop_size)
        self.ratio_range = (float(ratio_range[0]), float(ratio_range[1]))
        self.scale = (int(scale[0]), int(scale[1]))
        self.mean = None if mean is None else torch.tensor(list(mean), dtype=torch.float32).view(-1, 1, 1)
        self.std = None if std is None else torch.tensor(list(std), dtype=torch.float32).view(-1, 1, 1)
        self.classes = tuple(str(i) for i in range(ADE20K_NUM_CLASSES))

    def __len__(self) -> int:
        return len(self.pairs)

    def _load(self, i: int):
        from PIL import Image

        img_p, ann_p = self.pairs[i]
        with Image.open(img_p) as im:
            img = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1).float()
        with Image.open(ann_p) as an:
            ann = np.asarray(an, dtype=np.uint8).astype(np.int64)
        lbl = torch.from_numpy(ann) - 1
        lbl[lbl < 0] = IGNORE_INDEX  # class 0 ("other") is ignored
        return img, lbl

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        x = x / 255.0
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x

    def __getitem__(self, i: int):
        img, lbl = self._load(int(i))
        h, w = img.shape[-2:]
        if not self.train:
            s = self.crop_size / min(h, w)
            s = min(s, 4 * self.crop_size / max(h, w))
            nh, nw = max(1, int(round(h * s))), max(1, int(round(w * s)))
            x = F.interpolate(img[None], size=(nh, nw), mode="bilinear", align_corners=False)[0]
            return self._normalise(x.clamp(0, 255)), lbl
        # random rescale of the (long, short) scale by a ratio, keeping the aspect ratio
        ratio = float(torch.empty(()).uniform_(*self.ratio_range))
        long_t, short_t = self.scale[0] * ratio, self.scale[1] * ratio
        s = min(long_t / max(h, w), short_t / min(h, w))
        nh, nw = max(1, int(round(h * s))), max(1, int(round(w * s)))
        img = F.interpolate(img[None], size=(nh, nw), mode="bilinear", align_corners=False)[0].clamp(0, 255)
        lbl = F.interpolate(lbl[None, None].float(), size=(nh, nw), mode="nearest")[0, 0].long()
        c = self.crop_size
        top = int(torch.randint(0, max(nh - c, 0) + 1, ()))
        left = int(torch.randint(0, max(nw - c, 0) + 1, ()))
        img, lbl = img[:, top:top + c, left:left + c], lbl[top:top + c, left:left + c]
        if bool(torch.rand(()) < 0.5):
            img, lbl = img.flip(-1), lbl.flip(-1)
        img = _photometric(img)
        x = self._normalise(img)
        ph, pw = c - x.shape[-2], c - x.shape[-1]
        if ph > 0 or pw > 0:
            x = F.pad(x, (0, pw, 0, ph), value=0.0)
            lbl = F.pad(lbl, (0, pw, 0, ph), value=IGNORE_INDEX)
        return x, lbl


# ----------------------------------------------------------------------------------- config -> dataset
def seg_collate(batch):
    """Stack ``(image, label)`` pairs; when sizes differ, return lists instead of stacked tensors."""
    xs, ys = zip(*batch)
    if all(x.shape == xs[0].shape for x in xs) and all(y.shape == ys[0].shape for y in ys):
        return torch.stack(xs), torch.stack(ys)
    return list(xs), list(ys)


def dataset_info(name: str) -> dict:
    """Default ``mean``, ``std``, ``num_classes``, ``in_chans``, ``classes`` of a segmentation data set."""
    name = str(name).lower()
    if name in ("fmnist_seg", "fashion_mnist_seg", "fashion-mnist-seg"):
        return {"mean": list(FMNIST_SEG_MEAN), "std": list(FMNIST_SEG_STD), "num_classes": 11, "in_chans": 1,
                "classes": list(FMNIST_SEG_CLASSES)}
    if name in ("ade20k", "ade"):
        return {"mean": list(ADE20K_MEAN), "std": list(ADE20K_STD), "num_classes": 150, "in_chans": 3,
                "classes": [str(i) for i in range(150)]}
    raise ValueError(f"unknown segmentation data set {name!r}; expected fmnist_seg or ade20k")


@dataclass(frozen=True)
class SegData:
    """The ``data`` section of a segmentation config, typed; every default is written here.

    Composed Fashion-MNIST scenes (``fmnist_seg``): ``train_images`` / ``val_images`` / ``test_images``
    scenes of ``img_size`` pixels holding ``n_items`` garments scaled by ``item_scale`` (validation and
    test garments from the last ``val_items`` training images), drawn with ``seed``; a pixel is a
    garment's where it is brighter than ``threshold``; backgrounds up to ``background_max`` with
    Gaussian ``noise_std``. ADE20K (``root``): random crops of ``crop_size`` after rescaling to
    ``scale`` times ``ratio_range``, ``<split>_limit`` images per split. ``flip``: horizontal flips in
    training. ``mean`` / ``std`` default to the data set's.
    """

    name: str = "fmnist_seg"
    root: Optional[str] = None
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None
    crop_size: int = 512
    ratio_range: Tuple[float, float] = (0.5, 2.0)
    scale: Tuple[int, int] = (2048, 512)
    train_limit: Optional[int] = None
    val_limit: Optional[int] = None
    test_limit: Optional[int] = None
    train_images: int = 2000
    val_images: int = 200
    test_images: int = 500
    img_size: int = 64
    n_items: Tuple[int, int] = (2, 4)
    item_scale: Tuple[float, float] = (0.8, 1.5)
    val_items: int = 10000
    seed: int = 0
    flip: bool = True
    threshold: int = 20
    background_max: int = 70
    noise_std: float = 6.0

    @classmethod
    def from_config(cls, dcfg: Mapping[str, Any]) -> SegData:
        """The typed view of a ``data`` dict (other keys belong to the task; a key set to null takes the default)."""
        values = {f.name: dcfg[f.name] for f in fields(cls) if dcfg.get(f.name) is not None}
        for key in ("mean", "std", "ratio_range", "scale", "n_items", "item_scale"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    @property
    def is_ade20k(self) -> bool:
        return self.name.lower() in ("ade20k", "ade")


def _build(dcfg: Mapping[str, Any], split: str, normalize: bool, train_aug: bool) -> Dataset:
    d = SegData.from_config(dcfg)
    info = dataset_info(d.name)
    mean = (d.mean if d.mean is not None else info["mean"]) if normalize else None
    std = (d.std if d.std is not None else info["std"]) if normalize else None
    if d.is_ade20k:
        return ADE20KSegmentation(d.root, split, crop_size=int(d.crop_size), train=train_aug,
                                  ratio_range=d.ratio_range, scale=d.scale, mean=mean, std=std,
                                  limit=getattr(d, f"{split}_limit"))
    return FashionMNISTSegmentation(
        split, num_images=int(getattr(d, f"{split}_images")), size=int(d.img_size), n_items=d.n_items,
        scale=d.item_scale, val_items=int(d.val_items), seed=int(d.seed), mean=mean, std=std,
        flip=train_aug and bool(d.flip), threshold=int(d.threshold), background_max=int(d.background_max),
        noise_std=float(d.noise_std), root=d.root,
    )


def build_datasets(cfg: dict) -> Dict[str, Dataset]:
    """``{"train", "val", "test"}`` segmentation data sets of a trainer config (train set augmented).

    The train set is wrapped in :class:`rpc_attention.data.images.SeededTransformDataset` so its
    random augmentation depends only on ``(train.seed, epoch, position)`` (exact resume).
    """
    from .images import SeededTransformDataset

    dcfg = cfg["data"]
    seed = int(cfg.get("train", {}).get("seed", 0))
    train = SeededTransformDataset(_build(dcfg, "train", True, True), seed=seed)
    val = _build(dcfg, "val", True, False)
    test = val if SegData.from_config(dcfg).is_ade20k else _build(dcfg, "test", True, False)
    return {"train": train, "val": val, "test": test}


def build_eval_dataset(cfg: dict, split: str = "test", normalize: bool = True) -> Dataset:
    """The evaluation split of a segmentation run's data, without augmentation (ADE20K: validation)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    return _build(cfg["data"], split, normalize, False)
