"""Common-corruption robustness: 15 ImageNet-C corruptions x 5 severities, and mCE (docs/method.md#common-corruptions-and-mce).

Images are corrupted on the fly with ``imagecorruptions`` (through
:mod:`rpc_attention.evaluate._imagecorruptions_compat`), or read from an ImageNet-C directory tree
``ROOT/<corruption>/<severity>/<wnid>/*.JPEG`` with ``--set corruptions.root=ROOT``.

Small and grayscale images: the library needs ``H, W >= 32`` and 3 channels.  A grayscale image is
repeated to 3 channels, corrupted and turned back into one channel with the ITU-R 601 luma weights
(0.299, 0.587, 0.114); an image smaller than 32 pixels (Fashion-MNIST: 28 x 28) is padded to 32 by
edge replication, corrupted, and the original window is cropped back out.  The corruption of each
image is seeded by ``(seed, corruption, severity, index)``, so results do not depend on batching.

Metrics: per-corruption error (%) at each severity and its mean; the unnormalised mean corruption
error (mean over all 75 settings) always; ImageNet (``data.name`` starting with ``imagenet``): CE
normalised by AlexNet's errors and mCE = 100 x mean CE; other data sets: with
``--set corruptions.baseline=RUN`` (a run already evaluated with this suite), CE normalised by that
baseline (``mCE``) and the relative mCE ``(E_c - E_clean) / (E_c^base - E_clean^base)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from ._imagecorruptions_compat import CORRUPTIONS
from ._imagecorruptions_compat import available as imagecorruptions_available
from .inputs import Normalized, cfg_value, data_name, eval_indices, load_eval_data, norm_stats
from .per_example import PerExample
from .predict import chunks, progress, top1_hits
from .suites import Column, CommonOptions, Cost, StudyUse, list_option, register_suite

# The summary metrics (percent): mean error over corruptions x severities, its mCE (normalised by a
# baseline run or AlexNet) and the clean error of the same examples.
MEAN_CORRUPTION_ERROR, MCE, CLEAN_ERROR, RELATIVE_MCE = "mean_corruption_error", "mCE", "clean_error", "relative_mCE"

__all__ = ["CORRUPTIONS", "ALEXNET_ERRORS", "corrupt_images", "mce", "declare_mce", "MIN_SIZE"]

ALEXNET_ERRORS = {
    "gaussian_noise": 0.886428, "shot_noise": 0.894468, "impulse_noise": 0.922640,
    "defocus_blur": 0.819880, "glass_blur": 0.826268, "motion_blur": 0.785948, "zoom_blur": 0.798360,
    "snow": 0.866816, "frost": 0.826572, "fog": 0.819324, "brightness": 0.564592, "contrast": 0.853204,
    "elastic_transform": 0.646056, "pixelate": 0.717840, "jpeg_compression": 0.606500,
}
MIN_SIZE = 32
SEVERITIES = (1, 2, 3, 4, 5)
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)


def _seed_for(seed: int, name: str, severity: int, index: int) -> int:
    return (int(seed) * 1_000_003 + CORRUPTIONS.index(name) * 10_007 + severity * 101 + int(index) * 7919) % (2 ** 32)


def corrupt_images(x: Tensor, name: str, severity: int, seed: int = 0, offset: int = 0) -> Tensor:
    """Corrupt ``[N, C, H, W]`` images in ``[0, 1]`` (C = 1 or 3, any size); returns the same shape
    and dtype.  Image ``i`` is seeded with ``(seed, name, severity, offset + i)``."""
    from . import _imagecorruptions_compat as compat

    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images [N, 1 or 3, H, W], got {tuple(x.shape)}")
    n, c, h, w = x.shape
    ph, pw = max(0, MIN_SIZE - h), max(0, MIN_SIZE - w)
    top, left = ph // 2, pw // 2
    arr = (x.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    out = np.empty((n, h, w, c), dtype=np.float32)
    for i in range(n):
        img = arr[i]
        if c == 1:
            img = np.repeat(img, 3, axis=2)
        if ph or pw:
            img = np.pad(img, ((top, ph - top), (left, pw - left), (0, 0)), mode="edge")
        res = compat.corrupt(np.ascontiguousarray(img), name, severity, seed=_seed_for(seed, name, severity, offset + i))
        res = np.asarray(res, dtype=np.float32)[top:top + h, left:left + w]
        if c == 1:
            res = (res.astype(np.float64) @ _LUMA)[..., None].astype(np.float32)
        out[i] = res
    return torch.from_numpy(out / 255.0).permute(0, 3, 1, 2).contiguous().to(x.dtype)


def mce(errors: Mapping[str, float], reference: Mapping[str, float]) -> Tuple[Dict[str, float], float]:
    """``CE_c = errors[c] / reference[c]`` and ``mCE = 100 x mean_c CE_c`` over the corruptions in ``errors``."""
    ce = {}
    for c, e in errors.items():
        if c not in reference:
            raise ValueError(f"no reference error for corruption {c!r}")
        if reference[c] <= 0:
            raise ValueError(f"reference error for {c!r} is {reference[c]}; cannot normalise")
        ce[c] = e / reference[c]
    return ce, 100.0 * float(np.mean(list(ce.values())))


# ---------------------------------------------------------------------------------------------
# ImageNet-C directory tree


def _check_tree(root: str, names: Sequence[str]) -> None:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ImageNet-C directory {root!r} does not exist")
    missing = [f"{c}/{s}" for c in names for s in SEVERITIES if not os.path.isdir(os.path.join(root, c, str(s)))]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise FileNotFoundError(f"ImageNet-C directory {root!r} lacks {', '.join(missing[:5])}{more}")


def _tree_images(root: str, name: str, severity: int, limit: Optional[int], size: int, channels: int):
    from torchvision import datasets, transforms

    tf = [transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC), transforms.CenterCrop(size),
          transforms.ToTensor()]
    if channels == 1:
        tf.insert(0, transforms.Grayscale(1))
    ds = datasets.ImageFolder(os.path.join(root, name, str(severity)), transform=transforms.Compose(tf))
    idx = list(range(len(ds)))
    if limit is not None:
        # a deterministic spread over the classes rather than the first classes only
        step = max(1, len(ds) // int(limit))
        idx = idx[::step][: int(limit)]
    return ds, idx


# ---------------------------------------------------------------------------------------------
# suite


def _names(opts: Mapping[str, Any]) -> List[str]:
    names = list(opts.get("names") or CORRUPTIONS)
    bad = [c for c in names if c not in CORRUPTIONS]
    if bad:
        raise ValueError(f"unknown corruption(s) {', '.join(bad)}; choose from {', '.join(CORRUPTIONS)}")
    return names


def _baseline(path: str, names: Sequence[str], n: int, seed: Any) -> Dict[str, Any]:
    f = os.path.join(path, "eval", "corruptions.json") if os.path.isdir(path) else path
    if not os.path.isfile(f):
        raise FileNotFoundError(f"baseline {path!r} has no eval/corruptions.json; run "
                                f"`rpc-attention eval --run {path} --suite corruptions` first")
    with open(f, encoding="utf-8") as fh:
        rec = json.load(fh)
    errs = rec.get("errors") or {}
    missing = [c for c in names if c not in errs]
    if missing:
        raise ValueError(f"baseline {f} lacks corruption(s) {', '.join(missing)}")
    if rec.get("n_examples") != n or rec.get("seed") != seed:
        raise ValueError(f"baseline {f} was evaluated on {rec.get('n_examples')} examples with seed "
                         f"{rec.get('seed')}, this run on {n} with seed {seed}; use the same --limit and seed")
    return rec


def _check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    names = _names(opts)
    if opts.get("root"):
        _check_tree(str(opts["root"]), names)
    elif not imagecorruptions_available():
        raise FileNotFoundError("imagecorruptions is not installed and no corruptions.root was given")
    if opts.get("baseline"):
        b = str(opts["baseline"])
        f = os.path.join(b, "eval", "corruptions.json") if os.path.isdir(b) else b
        if not os.path.isfile(f):
            raise FileNotFoundError(f"baseline {b!r} has no eval/corruptions.json; run "
                                    f"`rpc-attention eval --run {b} --suite corruptions` first")


def _tree_error(hits_of: Callable[[Tensor, Tensor], Tensor], root: str, corruption: str, severity: int,
                limit: Optional[int], size: int, channels: int, bs: int, record: PerExample) -> Tuple[float, int]:
    """Top-1 error on the ImageNet-C tree's images of one corruption and severity, and their count;
    each image's correctness goes into ``record`` (every setting's folder holds the same images, listed
    in the same order, so positions pair them)."""
    ds, idx = _tree_images(root, corruption, severity, limit, size, channels)
    wrong = cnt = 0
    for start in range(0, len(idx), bs):
        items = [ds[i] for i in idx[start:start + bs]]
        xb = torch.stack([a for a, _ in items])
        yb = torch.tensor([b for _, b in items])
        right = hits_of(xb, yb)
        record.add(f"{corruption}@{severity}", right)
        wrong += len(right) - int(right.sum())
        cnt += len(yb)
    return wrong / max(cnt, 1), cnt


def _corrupted_error(hits_of: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor, corruption: str,
                     severity: int, seed: int, bs: int, record: PerExample) -> float:
    """Top-1 error on ``x`` corrupted on the fly (seeded per example position); each example's
    correctness goes into ``record`` under ``"<corruption>@<severity>"``."""
    wrong = 0
    for start in range(0, len(y), bs):
        xb = corrupt_images(x[start:start + bs], corruption, severity, seed=seed, offset=start)
        right = hits_of(xb, y[start:start + bs])
        record.add(f"{corruption}@{severity}", right)
        wrong += len(right) - int(right.sum())
    return wrong / len(y)


def _normalised(mean_err: Dict[str, float], clean_err: Optional[float], names: List[str], n: int,
                dname: str, opts: Dict[str, Any], metrics: Dict[str, float]):
    """Corruption errors normalised by AlexNet's (ImageNet) or a baseline run's: ``(CE, relative CE,
    what they are normalised by, the reference error of each corruption)``; adds ``mCE`` /
    ``relative_mCE`` to ``metrics``."""
    ce: Dict[str, float] = {}
    rel: Dict[str, float] = {}
    norm_by, ref = None, None
    if dname.lower().startswith("imagenet") and not opts.get("baseline"):
        ce, metrics[MCE] = mce(mean_err, ALEXNET_ERRORS)
        norm_by, ref = "AlexNet (Hendrycks & Dietterich 2019)", ALEXNET_ERRORS
    elif opts.get("baseline"):
        base = _baseline(str(opts["baseline"]), names, n, opts.get("seed"))
        base_err = {c: float(np.mean(base["errors"][c])) for c in names}
        ce, metrics[MCE] = mce(mean_err, base_err)
        norm_by, ref = f"baseline run {opts['baseline']}", base_err
        base_clean = base.get("metrics", {}).get(CLEAN_ERROR)
        if clean_err is not None and base_clean is not None:
            bc = base_clean / 100.0
            for c in names:
                denom = base_err[c] - bc
                rel[c] = (mean_err[c] - clean_err) / denom if abs(denom) > 1e-12 else float("nan")
            metrics[RELATIVE_MCE] = 100.0 * float(np.nanmean(list(rel.values())))
    return ce, rel, norm_by, ref


def declare_mce(record: PerExample, names: Sequence[str], reference: Mapping[str, float]) -> None:
    """Declare ``mCE`` in a per-example record: example i's score is ``100 x sum_{c,s} err_{i,c,s} /
    (C S reference_c)``, whose mean over examples is ``100 x mean_c (mean_s E_{c,s}) / reference_c``."""
    settings = [f"{c}@{s}" for c in names for s in SEVERITIES]
    weights = [1.0 / (len(names) * len(SEVERITIES) * float(reference[c])) for c in names for _ in SEVERITIES]
    record.metric(MCE, settings, error=True, weights=weights)


def _corruption_rows(names: List[str], errors: Dict[str, List[float]], mean_err: Dict[str, float],
                     ce: Dict[str, float], rel: Dict[str, float]) -> List[Dict[str, Any]]:
    rows = []
    for c in names:
        row: Dict[str, Any] = {"corruption": c}
        for s, e in zip(SEVERITIES, errors[c]):
            row[f"s{s}"] = 100.0 * e
        row["mean_error"] = 100.0 * mean_err[c]
        if ce:
            row["CE"] = 100.0 * ce[c]
        if rel:
            row["relative_CE"] = 100.0 * rel[c]
        rows.append(row)
    return rows


def corruptions_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device = opts["device"]
    model.to(device).eval()
    names = _names(opts)
    seed = int(opts.get("seed") or 0)
    bs = int(opts["batch_size"])
    limit = opts.get("limit")
    dname = data_name(cfg)
    root = opts.get("root")
    if root:
        _check_tree(str(root), names)
        size = int(cfg_value(cfg, "img_size", 224))
        channels = int(cfg_value(cfg, "in_chans", 3))
        mean, std = norm_stats(cfg, channels)
    else:
        x, y = load_eval_data(cfg, "test", limit)
        mean, std = norm_stats(cfg, x.shape[1])
    scorer = Normalized(model, mean, std).to(device)

    @torch.no_grad()
    def hits_of(xb: Tensor, yb: Tensor) -> Tensor:
        return top1_hits(scorer(xb.to(device)).float().cpu(), yb)

    n, clean_err = 0, None
    if root:  # the tree's image positions (the same in every corruption folder)
        record = PerExample(_tree_images(str(root), names[0], SEVERITIES[0], limit, size, channels)[1])
    else:  # clean error on the same examples, and every example's correctness
        n = len(y)
        record = PerExample(eval_indices(cfg, "test", limit))
        wrong = 0
        for sl in chunks(n, bs, desc="clean"):
            right = hits_of(x[sl], y[sl])
            record.add("clean", right)
            wrong += len(right) - int(right.sum())
        clean_err = wrong / n
    errors: Dict[str, List[float]] = {}
    bar = progress(total=len(names) * len(SEVERITIES), desc="corruptions", unit="setting")
    for c in names:
        errors[c] = []
        for s in SEVERITIES:
            if root:
                err, n = _tree_error(hits_of, str(root), c, s, limit, size, channels, bs, record)
            else:
                err = _corrupted_error(hits_of, x, y, c, s, seed, bs, record)
            errors[c].append(err)
            bar.update(1)
    bar.close()

    result = _suite_result(errors, clean_err, record, names, n, dname, root, opts)
    if not root:  # an ImageFolder tree without a test folder is evaluated on its val folder, and says so
        from ..data.images import eval_split_name

        result["data"]["split"] = eval_split_name(dict(cfg), "test")
    return result


def _suite_result(errors: Dict[str, List[float]], clean_err: Optional[float], record: PerExample,
                  names: Sequence[str], n: int, dname: str, root: Optional[str], opts: Dict[str, Any]) -> Dict[str, Any]:
    """The suite's metrics, rows, protocol and per-example record from the measured error rates."""
    mean_err = {c: float(np.mean(v)) for c, v in errors.items()}
    metrics: Dict[str, float] = {MEAN_CORRUPTION_ERROR: 100.0 * float(np.mean(list(mean_err.values())))}
    if clean_err is not None:
        metrics[CLEAN_ERROR] = 100.0 * clean_err
    ce, rel, norm_by, ref = _normalised(mean_err, clean_err, names, n, dname, opts, metrics)
    if not root:
        record.metric(CLEAN_ERROR, ["clean"], error=True)
    record.metric(MEAN_CORRUPTION_ERROR, [f"{c}@{s}" for c in names for s in SEVERITIES], error=True)
    if ref is not None:
        declare_mce(record, names, ref)
    data = {"dataset": dname, "split": "test", "n_examples": n,
            "source": f"ImageNet-C tree {root}" if root else "imagecorruptions on the fly"}
    protocol = (f"top-1 error (%) under {len(names)} corruptions x {len(SEVERITIES)} severities"
                + (f"; CE normalised by {norm_by}" if norm_by else "; no normalisation (set corruptions.baseline=RUN)"))
    if not root:
        protocol += f"; images < {MIN_SIZE}px edge-padded to {MIN_SIZE} and cropped back, grayscale via 3-channel + luma"
    return {"metrics": metrics, "rows": _corruption_rows(names, errors, mean_err, ce, rel), "data": data,
            "n_examples": n, "protocol": protocol,
            "settings": {"normalised_by": norm_by, "severities": list(SEVERITIES)},
            "errors": errors, "per_example": record.as_dict()}


@dataclass(frozen=True)
class CorruptionOptions(CommonOptions):
    """``names``: the corruptions; ``root``: an ImageNet-C tree instead of corrupting on the fly;
    ``baseline``: a run whose errors normalise the mCE."""

    names: List[str] = list_option(CORRUPTIONS)
    root: Optional[str] = None
    baseline: Optional[str] = None
    limit: Optional[int] = 1000


register_suite(
    "corruptions", corruptions_suite, options=CorruptionOptions,
    description="ImageNet-C style corruptions (15 x 5) and mCE", check=_check,
    metrics=(MEAN_CORRUPTION_ERROR, MCE, CLEAN_ERROR, RELATIVE_MCE), cost=Cost(1, 0, corrupts=True),
    columns=(Column("vision", MCE, "mCE, SymViT = 100 (lower better)", higher=False, paper="mce", position=70),
             Column("vision", MEAN_CORRUPTION_ERROR, "corruption error (%, lower better)", higher=False, position=71),
             Column("fan", MCE, "mCE, SymFAN = 100 (lower better)", higher=False, paper="fan_mce", position=70),
             Column("fan", MEAN_CORRUPTION_ERROR, "corruption error (%, lower better)", higher=False, position=71)),
    study=StudyUse(limit="corruption_limit", names="corruptions", all_names=len(CORRUPTIONS), copies=len(SEVERITIES),
                   baseline=MCE))
