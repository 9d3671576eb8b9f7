"""Segmentation metrics and the evaluation suites ``seg`` and ``seg-corruptions``.

Metrics (docs/method.md#segmentation-metrics) come from one confusion matrix ``cm[gt, pred]`` accumulated over the whole
split (pixels labelled 255 are ignored):

- pixel accuracy ``sum_c cm[c, c] / sum cm``;
- mean accuracy: mean over classes present in the ground truth of ``cm[c, c] / sum_j cm[c, j]``;
- IoU_c = ``cm[c, c] / (sum_j cm[c, j] + sum_i cm[i, c] - cm[c, c])``, mIoU the mean over classes
  that occur in the ground truth or the predictions (a class absent from both is left out, ``nan``).

All reported in percent. ``seg`` evaluates clean images (``--set seg.split=val|test``,
``--set seg.save_examples=N`` writes N PNGs ``input | ground truth | prediction`` to
``RUN/eval/seg_examples/``). ``seg-corruptions`` evaluates the same metrics on images corrupted
with the 15 ImageNet-C corruptions at severities 1..5 (labels unchanged), via
:func:`rpc_attention.evaluate.corruptions.corrupt_images`; corruption of image ``i`` is seeded by
``(seed, corruption, severity, i)``. Large images (ADE20K) are evaluated by sliding windows of the
training crop size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..files import atomic_write
from ._imagecorruptions_compat import CORRUPTIONS
from .per_example import score_record
from .suites import Column, CommonOptions, Cost, list_option, register_suite

# Summary metrics (percent); the corrupted suite reports them as corrupted_<name>, means over corruptions.
PIXEL_ACC, MEAN_ACC, MIOU = "pixel_acc", "mean_acc", "miou"
CORRUPTED_MIOU = "corrupted_miou"

__all__ = [
    "IGNORE_INDEX", "confusion_matrix", "metrics_from_confusion", "miou_of_stats", "window_of", "predict_logits", "SegEvaluator",
    "evaluate_loader", "seg_suite", "seg_corruptions_suite", "colorize", "save_examples",
]

IGNORE_INDEX = 255


# -------------------------------------------------------------------------------------------- metrics
def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """``[K, K]`` int64 counts, rows = ground truth, columns = prediction; ``ignore_index`` pixels skipped."""
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    if pred.shape != target.shape:
        raise ValueError(f"prediction and target differ in size: {pred.numel()} vs {target.numel()}")
    keep = target != ignore_index
    pred, target = pred[keep], target[keep]
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= num_classes):
        raise ValueError(f"target labels must be in 0..{num_classes - 1} or {ignore_index}, "
                         f"found {int(target.min())}..{int(target.max())}")
    idx = target * num_classes + pred.clamp(0, num_classes - 1)
    return torch.bincount(idx.cpu(), minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def metrics_from_confusion(cm: Tensor) -> Dict[str, Any]:
    """``{"pixel_acc", "mean_acc", "miou"}`` (percent) plus ``"iou"`` and ``"acc"`` per class (lists, nan where undefined)."""
    cm = cm.double()
    tp = cm.diag()
    gt = cm.sum(1)
    pr = cm.sum(0)
    total = cm.sum()
    union = gt + pr - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    acc = torch.where(gt > 0, tp / gt.clamp(min=1), torch.full_like(tp, float("nan")))

    def nanmean(t: Tensor) -> float:
        m = ~torch.isnan(t)
        return float(t[m].mean()) * 100.0 if bool(m.any()) else float("nan")

    return {
        "pixel_acc": float(tp.sum() / total) * 100.0 if total > 0 else float("nan"),
        "mean_acc": nanmean(acc),
        "miou": nanmean(iou),
        "iou": [float(v) * 100.0 for v in iou],
        "acc": [float(v) * 100.0 for v in acc],
    }


# ------------------------------------------------------------------------------------------ inference
def window_of(cfg: Mapping[str, Any]) -> Optional[Tuple[int, int]]:
    """Sliding-window (size, stride) of a run config, or None for whole-image inference."""
    ev = cfg.get("eval") or {}
    data = cfg.get("data") or {}
    sw = ev.get("sliding_window")
    if sw is None:
        sw = str(data.get("name", "")).lower() in ("ade20k", "ade")
    if not sw:
        return None
    size = int(ev.get("window_size") or data.get("crop_size") or data.get("img_size") or 512)
    stride = int(ev.get("window_stride") or size)
    return size, stride


def predict_logits(model: nn.Module, x: Tensor, window: Optional[Tuple[int, int]] = None,
                   out_size: Optional[Tuple[int, int]] = None) -> Tensor:
    """Logits ``[B, K, H, W]`` of ``x`` (whole image, or sliding windows when ``window=(size, stride)``),
    resized bilinearly to ``out_size`` when given."""
    from ..models.segmentation import sliding_window_logits

    if window is not None:
        logits = sliding_window_logits(model, x, window[0], window[1])
    else:
        logits = model(x).float()
    if out_size is not None and tuple(logits.shape[-2:]) != tuple(out_size):
        logits = F.interpolate(logits, size=tuple(out_size), mode="bilinear", align_corners=False)
    return logits


class SegEvaluator:
    """Accumulates a confusion matrix and the summed cross-entropy over batches."""

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
        self.num_classes = int(num_classes)
        self.ignore_index = ignore_index
        self.cm = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)
        self.loss_sum = 0.0
        self.pixels = 0
        self.images = 0
        self._per_image: List[np.ndarray] = []

    def update(self, logits: Tensor, target: Tensor) -> Tensor:
        """Add ``logits [B, K, H, W]`` vs ``target [B, H, W]``; returns the predictions."""
        target = target.to(logits.device)
        valid = int((target != self.ignore_index).sum())
        if valid:
            self.loss_sum += float(F.cross_entropy(logits.float(), target, ignore_index=self.ignore_index,
                                                   reduction="sum"))
        self.pixels += valid
        self.images += int(target.shape[0])
        pred = logits.argmax(1)
        k = self.num_classes
        for p_i, t_i in zip(pred, target):  # each image's true positives, ground truth and predictions per class
            cm = confusion_matrix(p_i, t_i, k, self.ignore_index)
            self.cm += cm
            self._per_image.append(torch.cat([cm.diag(), cm.sum(1), cm.sum(0)]).numpy())
        return pred

    def image_stats(self) -> np.ndarray:
        """``(images, 3 K)`` int64: per image, the true positives, ground-truth and predicted pixels of
        each class; summed over any set of images they give that set's mIoU (:func:`miou_of_stats`)."""
        return np.stack(self._per_image) if self._per_image else np.zeros((0, 3 * self.num_classes), np.int64)

    def result(self) -> Dict[str, Any]:
        if self.images == 0:
            raise ValueError("segmentation evaluation data set is empty")
        out = metrics_from_confusion(self.cm)
        out["loss"] = self.loss_sum / max(self.pixels, 1)
        out["n"] = self.images
        return out


def miou_of_stats(stats: np.ndarray, classes: int) -> np.ndarray:
    """mIoU (percent) of summed :meth:`SegEvaluator.image_stats` rows, ``(..., n, S * 3 K)`` for S
    settings -> ``(...)``, the mean over settings of the mIoU of each (classes with an empty union are
    left out, as in :func:`metrics_from_confusion`)."""
    total = np.asarray(stats, dtype=np.float64).sum(axis=-2)
    total = total.reshape(total.shape[:-1] + (-1, 3, classes))
    tp, gt, pr = total[..., 0, :], total[..., 1, :], total[..., 2, :]
    union = gt + pr - tp
    iou = np.where(union > 0, tp / np.maximum(union, 1.0), np.nan)
    return 100.0 * np.nanmean(iou, axis=-1).mean(axis=-1)


def _iter_pairs(batch) -> Iterable[Tuple[Tensor, Tensor]]:
    """Yield ``(x [B,C,H,W], y [B,H,W])`` groups from a stacked batch or a list batch (ADE20K eval)."""
    x, y = batch
    if isinstance(x, (list, tuple)):
        for xi, yi in zip(x, y):
            yield xi.unsqueeze(0), yi.unsqueeze(0)
    else:
        yield x, y


@torch.no_grad()
def evaluate_loader(model: nn.Module, loader: Iterable, num_classes: int,
                    window: Optional[Tuple[int, int]] = None, device=None, limit: Optional[int] = None,
                    transform=None, per_image: bool = False) -> Dict[str, Any]:
    """Metrics of ``model`` over ``loader`` (batches ``(x, y)``); ``transform(x, offset)`` (optional)
    alters the inputs first (corruptions); ``per_image`` adds ``"image_stats"`` (per-image counts)."""
    if device is None:
        device = next(model.parameters()).device
    ev = SegEvaluator(num_classes)
    seen = 0
    for batch in loader:
        for x, y in _iter_pairs(batch):
            if limit is not None and seen >= limit:
                break
            if limit is not None and seen + x.shape[0] > limit:
                x, y = x[: limit - seen], y[: limit - seen]
            if transform is not None:
                x = transform(x, seen)
            x, y = x.to(device), y.to(device)
            ev.update(predict_logits(model, x, window, out_size=tuple(y.shape[-2:])), y)
            seen += x.shape[0]
        if limit is not None and seen >= limit:
            break
    out = ev.result()
    if per_image:
        out["image_stats"] = ev.image_stats()
    return out


# ------------------------------------------------------------------------------------------ examples
_BASE_COLORS = (
    (30, 30, 30), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (188, 189, 34), (23, 190, 207), (255, 255, 120), (174, 199, 232),
    (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213), (196, 156, 148), (247, 182, 210),
    (219, 219, 141), (158, 218, 229),
)


def _palette(k: int) -> np.ndarray:
    """A fixed colour per class (class 0 dark grey, then well-separated colours), deterministic."""
    pal = np.zeros((max(k, 1), 3), dtype=np.uint8)
    n = min(len(_BASE_COLORS), len(pal))
    pal[:n] = np.array(_BASE_COLORS[:n], dtype=np.uint8)
    if len(pal) > n:
        pal[n:] = np.random.RandomState(12345).randint(40, 256, size=(len(pal) - n, 3))
    return pal


def colorize(label: np.ndarray, num_classes: int) -> np.ndarray:
    """``uint8 [H, W, 3]`` colour image of a label map (ignored pixels white)."""
    pal = _palette(num_classes)
    out = np.full(label.shape + (3,), 255, dtype=np.uint8)
    m = (label >= 0) & (label < num_classes)
    out[m] = pal[label[m]]
    return out


def save_examples(images01: Tensor, labels: Tensor, preds: Tensor, num_classes: int, out_dir: str,
                  start: int = 0, scale: int = 4) -> List[str]:
    """Write ``input | ground truth | prediction`` PNGs (one per image) to ``out_dir``; returns the paths."""
    from PIL import Image

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for i in range(images01.shape[0]):
        im = images01[i].float()
        if tuple(im.shape[-2:]) != tuple(labels[i].shape[-2:]):  # ADE20K: labels at the original size
            im = F.interpolate(im[None], size=tuple(labels[i].shape[-2:]), mode="bilinear", align_corners=False)[0]
        img = (im.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
        if img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        gt = colorize(labels[i].cpu().numpy(), num_classes)
        pr = colorize(preds[i].cpu().numpy(), num_classes)
        sep = np.full((img.shape[0], 2, 3), 255, dtype=np.uint8)
        row = np.concatenate([img, sep, gt, sep, pr], axis=1)
        pil = Image.fromarray(row)
        if scale > 1:
            pil = pil.resize((row.shape[1] * scale, row.shape[0] * scale), Image.NEAREST)
        path = os.path.join(out_dir, f"example_{start + i:04d}.png")
        atomic_write(path, lambda tmp, pil=pil: pil.save(tmp, format="PNG"))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------------- suites
def _num_classes(model: nn.Module, cfg: Mapping[str, Any]) -> int:
    n = (cfg.get("model") or {}).get("num_classes") or (cfg.get("data") or {}).get("num_classes") \
        or getattr(model, "num_classes", None)
    if not n:
        raise ValueError("cannot tell the number of classes (model.num_classes missing from the run config)")
    return int(n)


def _class_names(cfg: Mapping[str, Any], k: int) -> List[str]:
    from ..data.segmentation import dataset_info

    try:
        names = list(dataset_info((cfg.get("data") or {}).get("name", "")).get("classes") or [])
    except ValueError:
        names = []
    return names if len(names) == k else [str(i) for i in range(k)]


def _loader(ds, batch_size: int):
    from torch.utils.data import DataLoader

    from ..data.segmentation import seg_collate

    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=0, collate_fn=seg_collate)


def _norm(cfg: Mapping[str, Any], channels: int) -> Tuple[Tensor, Tensor]:
    from .inputs import norm_stats

    mean, std = norm_stats(cfg, channels)
    return mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)


def _check_data(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    if (cfg.get("task") or "") != "segmentation":
        raise ValueError(f"the seg suites need a segmentation run (task: segmentation), got task {cfg.get('task')!r}")
    from ..data.segmentation import build_eval_dataset

    if str(opts.get("split", "test")) not in ("train", "val", "test"):
        raise ValueError(f"seg split must be train, val or test, got {opts.get('split')!r}")
    build_eval_dataset(dict(cfg), split=str(opts.get("split", "test")), normalize=False)  # raises if missing


def _check_corruptions(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    _check_data(cfg, opts)
    for c in opts.get("corruptions") or []:
        if c not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {c!r}; choose from {', '.join(CORRUPTIONS)}")
    _severities(opts)


def _severities(opts: Mapping[str, Any]) -> List[int]:
    raw = opts.get("severities", "1,2,3,4,5")
    vals = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    try:
        sev = [int(float(v)) for v in vals if str(v).strip()]
    except ValueError:
        raise ValueError(f"severities must be integers 1..5, got {raw!r}") from None
    if not sev or any(s not in (1, 2, 3, 4, 5) for s in sev):
        raise ValueError(f"severities must be integers 1..5, got {raw!r}")
    return sev


def seg_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    """Clean segmentation metrics (pixel acc, mean acc, mIoU, per-class IoU); optional example PNGs."""
    from ..data.segmentation import build_eval_dataset

    device = torch.device(opts.get("device") or "cpu")
    split = str(opts.get("split", "test"))
    k = _num_classes(model, cfg)
    names = _class_names(cfg, k)
    ds = build_eval_dataset(dict(cfg), split=split, normalize=False)
    limit = opts.get("limit")
    n_total = len(ds) if limit is None else min(len(ds), int(limit))
    window = window_of(cfg)
    n_save = int(opts.get("save_examples") or 0)
    out_dir = os.path.join(str(run_dir) if run_dir else ".", "eval", "seg_examples")
    from .predict import progress

    ev = SegEvaluator(k)
    saved: List[str] = []
    seen = 0
    loader = _loader(ds, int(opts.get("batch_size") or 32))
    with torch.no_grad():
        for batch in progress(loader, desc="seg", total=len(loader)):
            for x01, y in _iter_pairs(batch):
                if seen >= n_total:
                    break
                x01, y = x01[: n_total - seen], y[: n_total - seen]
                mean, std = _norm(cfg, x01.shape[1])
                x = ((x01 - mean) / std).to(device)
                pred = ev.update(predict_logits(model, x, window, tuple(y.shape[-2:])), y.to(device))
                if len(saved) < n_save:
                    m = min(n_save - len(saved), x01.shape[0])
                    saved += save_examples(x01[:m], y[:m], pred[:m], k, out_dir, start=len(saved))
                seen += x01.shape[0]
            if seen >= n_total:
                break
    res = ev.result()
    metrics = {"pixel_acc": res["pixel_acc"], "mean_acc": res["mean_acc"], "miou": res["miou"], "loss": res["loss"]}
    rows = []
    for i, name in enumerate(names):
        metrics[f"iou/{name}"] = res["iou"][i]
        rows.append({"class": name, "iou": res["iou"][i], "acc": res["acc"][i]})
    bg = _all_background_miou(ev.cm)
    metrics["baseline_all_class0_miou"] = bg
    out = {
        "metrics": metrics, "rows": rows, "n_examples": res["n"],
        "data": {"name": (cfg.get("data") or {}).get("name"), "split": split, "n_examples": res["n"]},
        "protocol": ("confusion matrix over all pixels of the split (label 255 ignored); mIoU over classes "
                     "present in ground truth or prediction; percent" +
                     (f"; sliding window {window[0]} stride {window[1]}" if window else "; whole images")),
        "settings": {"window": list(window) if window else None},
    }
    if saved:
        out["settings"]["examples"] = saved
    out["per_example"] = score_record("miou", {"miou": ev.image_stats()}, classes=k)
    return out


def _all_background_miou(cm: Tensor) -> float:
    """mIoU of predicting class 0 everywhere on the same ground truth (the trivial baseline)."""
    gt = cm.sum(1)
    base = torch.zeros_like(cm)
    base[:, 0] = gt
    return metrics_from_confusion(base)["miou"]


def seg_corruptions_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    """Segmentation metrics on corrupted inputs, per corruption and severity (labels unchanged)."""
    from ..data.segmentation import build_eval_dataset
    from .corruptions import corrupt_images
    from .predict import progress

    device = torch.device(opts.get("device") or "cpu")
    split = str(opts.get("split", "test"))
    k = _num_classes(model, cfg)
    names = list(opts.get("corruptions") or CORRUPTIONS)
    sevs = _severities(opts)
    seed = int(opts.get("seed") or 0)
    ds = build_eval_dataset(dict(cfg), split=split, normalize=False)
    limit = opts.get("limit")
    window = window_of(cfg)
    bs = int(opts.get("batch_size") or 32)

    def run(transform) -> Dict[str, Any]:
        def tf(x01: Tensor, offset: int) -> Tensor:
            if transform is not None:
                x01 = transform(x01, offset)
            mean, std = _norm(cfg, x01.shape[1])
            return (x01 - mean) / std

        return evaluate_loader(model, _loader(ds, bs), k, window, device, limit, tf, per_image=True)

    clean = run(None)
    rows = [{"corruption": "clean", "severity": 0, "pixel_acc": clean["pixel_acc"], "mean_acc": clean["mean_acc"],
             "miou": clean["miou"]}]
    metrics: Dict[str, float] = {"clean_pixel_acc": clean["pixel_acc"], "clean_mean_acc": clean["mean_acc"],
                                 "clean_miou": clean["miou"]}
    every = []
    for name in progress(names, desc="seg-corruptions", unit="corruption"):
        per = [run(lambda x, off, n=name, s=s: corrupt_images(x, n, s, seed=seed, offset=off)) for s in sevs]
        rows += [{"corruption": name, "severity": s, "pixel_acc": r["pixel_acc"], "mean_acc": r["mean_acc"],
                  "miou": r["miou"]} for s, r in zip(sevs, per)]
        every += per
        metrics[f"miou/{name}"] = float(np.mean([r["miou"] for r in per]))
        metrics[f"mean_acc/{name}"] = float(np.mean([r["mean_acc"] for r in per]))
    for key in ("miou", "mean_acc", "pixel_acc"):
        metrics[f"corrupted_{key}"] = float(np.mean([r[key] for r in every]))
    stats = [r["image_stats"] for r in every]
    # per image: every setting's counts side by side; corrupted_miou is the mean of their mIoUs
    record = score_record("miou", {"clean_miou": clean["image_stats"], "corrupted_miou": np.concatenate(stats, axis=1)},
                          classes=k)
    return {
        "per_example": record,
        "metrics": metrics, "rows": rows, "n_examples": clean["n"],
        "data": {"name": (cfg.get("data") or {}).get("name"), "split": split, "n_examples": clean["n"]},
        "protocol": ("segmentation metrics on inputs corrupted with imagecorruptions (image i seeded by seed, "
                     "corruption, severity, i), labels unchanged; corrupted_* = mean over corruptions x "
                     "severities; percent"),
        "settings": {"corruptions": names, "severities": sevs,
                     "window": list(window) if window else None},
    }


@dataclass(frozen=True)
class SegOptions(CommonOptions):
    split: str = "test"
    save_examples: int = 0


@dataclass(frozen=True)
class SegCorruptionOptions(CommonOptions):
    split: str = "test"
    limit: Optional[int] = 100
    batch_size: int = 50
    corruptions: List[str] = list_option(CORRUPTIONS)
    severities: str = "1,2,3,4,5"

register_suite("seg", seg_suite, tasks=("segmentation",), options=SegOptions,
               description="segmentation: pixel accuracy, mean accuracy, mIoU and per-class IoU (percent)",
               check=_check_data, metrics=(PIXEL_ACC, MEAN_ACC, MIOU), cost=Cost(1, 0),
               columns=(Column("seg", PIXEL_ACC, "pixel acc (%)", position=10),
                        Column("seg", MEAN_ACC, "mean acc (%)", position=11),
                        Column("seg", MIOU, "mIoU (%)", paper="seg_miou", position=12)))
register_suite("seg-corruptions", seg_corruptions_suite, tasks=("segmentation",), options=SegCorruptionOptions,
               description="segmentation under the 15 ImageNet-C corruptions x 5 severities (labels unchanged)",
               check=_check_corruptions, cost=Cost(1, 0, corrupts=True),
               metrics=(CORRUPTED_MIOU, "corrupted_mean_acc", "corrupted_pixel_acc"),
               columns=(Column("seg", CORRUPTED_MIOU, "corrupted mIoU (%)", paper="seg_corrupt_miou", position=20),))
