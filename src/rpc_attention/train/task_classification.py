"""Built-in task ``classification``: timm image classifiers on Fashion-MNIST, MNIST-5k or ImageFolder.

Config keys it reads: ``model.name`` (any timm model, e.g. ``rpc_symvit_tiny_patch16_224``),
``model.kwargs`` (passed to ``timm.create_model``; ``num_classes``/``in_chans``/``img_size`` default
to the data set's), ``data.*`` (see :mod:`rpc_attention.data.images`), ``train.mixup`` (timm Mixup /
CutMix / label smoothing), ``train.token_drop`` (masking-aware training: each training image drops up to
that fraction of its patch tokens through the attention key mask, :func:`token_drop_mask`; 0 = off).
Metrics: ``loss``, ``acc1``, ``acc5`` (percent; only with more than five classes). An ImageFolder's
class count, image size and normalisation are read from its training images
(:func:`rpc_attention.data.images.inspect_imagefolder`) unless set; the model's ``num_classes`` /
``in_chans`` / ``img_size`` follow the data's.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn.functional as F

from ..data.images import DATA_SET_KEYS, ImageData
from ..overrides import unknown_key

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixupConfig:
    """``train.mixup``: timm Mixup / CutMix alphas (both 0: off), the probability of mixing a batch and
    of CutMix over Mixup, and label smoothing (applied with or without mixing)."""

    mixup: float = 0.0
    cutmix: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0

    @classmethod
    def from_config(cls, section: Optional[Mapping[str, Any]]) -> MixupConfig:
        section = dict(section or {})
        unknown = sorted(set(section) - {f.name for f in fields(cls)})
        if unknown:
            raise unknown_key(f"train.mixup.{unknown[0]}", [f"train.mixup.{f.name}" for f in fields(cls)],
                              "mixup setting")
        return cls(**{k: float(v) for k, v in section.items() if v is not None})


def _check_data_set_keys(data: Dict[str, Any]) -> None:
    """ValueError naming a ``data`` key the chosen data set does not read, set away from its default."""
    name = str(data["name"]).lower()
    defaults = ImageData()
    for key, (label, names) in DATA_SET_KEYS.items():
        value = data.get(key)
        if value is not None and name not in names and value != getattr(defaults, key):
            raise ValueError(f"data.{key}={value!r} has no effect on data.name={data['name']!r} (only {label} "
                             f"reads it): leave it unset")


def _data_facts(data: Dict[str, Any], info: Dict[str, Any]) -> Dict[str, Any]:
    """``info`` (the named data set's facts) with what an ImageFolder tree says about itself: its class
    count, and for ``imagefolder`` (not ``imagenet``, whose statistics are ImageNet's) the mean / std and
    image size of its training images where the config leaves them unset. ValueError (one line) when
    the images vary in size and ``data.img_size`` is unset."""
    from ..data.images import ImageData, inspect_imagefolder, is_folder_data

    if not is_folder_data(data["name"]) or not data.get("root"):
        return info
    own = str(data["name"]).lower() == "imagefolder"
    need = own and any(data.get(k) is None for k in ("mean", "std", "img_size"))
    folder = inspect_imagefolder(ImageData.from_config(data), stats=need)
    out = dict(info, num_classes=len(folder.classes), in_chans=3)
    if need:
        out.update(mean=list(folder.mean), std=list(folder.std))
        if data.get("img_size") is None and folder.img_size is None:
            sizes = ", ".join(f"{w}x{h}" for w, h in folder.sizes[:3])
            raise ValueError(f"the training images under {data['root']} vary in size ({sizes}, ...): "
                             f"set data.img_size=N (the side the model sees)")
        out["img_size"] = folder.img_size
        _log.info("data: %d classes (%s), %s px, mean %s std %s from %d training images (set data.img_size, "
                  "data.mean, data.std to choose)", len(folder.classes), ", ".join(folder.classes[:5]),
                  data.get("img_size") or folder.img_size, list(folder.mean), list(folder.std), folder.n_sampled)
    return out


def token_drop_mask(model: torch.nn.Module, x: torch.Tensor, fraction: float) -> torch.Tensor:
    """The key mask of masking-aware training for the batch ``x``: each image drops a random number of its
    patch tokens, up to ``fraction`` of them (:func:`rpc_attention.evaluate.masking.random_token_drop`, drawn
    from torch's global generator, which the trainer seeds and checkpoints); the class token stays."""
    from ..evaluate.masking import drop_tokens_mask, random_token_drop

    vit = getattr(model, "module", model)  # under DistributedDataParallel
    rows, cols = vit.patch_embed.grid_size
    dropped = random_token_drop(x.shape[0], int(rows) * int(cols), fraction, device=x.device)
    return drop_tokens_mask(dropped, int(vit.num_prefix_tokens))


def _token_drop(cfg: Dict[str, Any]) -> float:
    """``train.token_drop`` of ``cfg`` (0: off)."""
    return (cfg.get("train") or {}).get("token_drop", 0.0)


class ClassificationTask:
    throughput_unit = "images"
    primary_metric = "acc1"
    # model keywords derived from data keys: an override of the data key (on a resume too) makes the
    # model's follow (rpc_attention.train.config.resolve_typed_config drops the saved derived value)
    derived_keys = {"data.num_classes": "model.kwargs.num_classes", "data.in_chans": "model.kwargs.in_chans",
                    "data.img_size": "model.kwargs.img_size"}
    # data keys only some data sets read -> (their names, the default): a preset's value goes back to the
    # default when --set data.name picks a data set that does not read it
    data_set_keys = {f"data.{key}": (names, getattr(ImageData(), key))
                     for key, (_, names) in DATA_SET_KEYS.items()}
    # read by rpc_attention.data.images with a per-data-set default (mnist5k, imagefolder)
    optional_keys = ("data.test_size", "data.train_dir", "data.val_dir", "data.test_dir", "data.eval_interpolation") + tuple(
        f"data.augment.{k}" for k in ("enabled", "padding", "flip",  # small images: crop and flip
                                      "auto_augment", "interpolation", "reprob", "remode", "recount", "color_jitter"))

    def __init__(self) -> None:
        self._mixup = None
        self._mixup_key = None

    # ------------------------------------------------------------------ config
    def default_config(self) -> Dict[str, Any]:
        from ..data.images import ImageData

        data = ImageData()
        return {
            "data": {k: getattr(data, k) for k in ("name", "val_size", "train_subset", "test_subset", "test_offset",
                                                   "subset_seed", "crop_pct")},
            "train": {"mixup": asdict(MixupConfig()), "token_drop": 0.0},
        }

    def finalize_config(self, cfg: Dict[str, Any]) -> Dict[str, Any]:
        from ..data.images import dataset_info, is_folder_data

        if not cfg["model"].get("name"):
            raise ValueError("model.name is not set (a timm model name such as symvit_tiny_patch16_224)")
        if not cfg["data"].get("name"):
            raise ValueError("data.name is not set (fashion_mnist, mnist5k or imagefolder)")
        data = cfg["data"]
        _check_data_set_keys(data)
        info = _data_facts(data, dataset_info(data["name"]))
        known = not is_folder_data(data["name"]) or bool(data.get("root"))  # else the config gives the count
        if known and data.get("num_classes") is not None and int(data["num_classes"]) != int(info["num_classes"]):
            raise ValueError(f"data.num_classes={data['num_classes']} but {data['name']} has {info['num_classes']} "
                             f"classes: leave data.num_classes unset (it is read from the data)")
        for key in ("mean", "std", "num_classes", "in_chans", "img_size"):
            if data.get(key) is None:
                data[key] = info[key]
        kw = cfg["model"].setdefault("kwargs", {}) or {}
        cfg["model"]["kwargs"] = kw
        for key in ("num_classes", "in_chans", "img_size"):
            kw.setdefault(key, int(data[key]))
        drop = _token_drop(cfg)
        if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0.0 <= float(drop) < 1.0:
            raise ValueError(f"train.token_drop is the largest fraction of patch tokens a training image drops, "
                             f"in [0, 1) (0: off), got {drop!r}")
        if int(kw["num_classes"]) != int(data["num_classes"]):
            raise ValueError(f"model.kwargs.num_classes={kw['num_classes']} but the data has {data['num_classes']} "
                             f"classes (data.num_classes): leave model.kwargs.num_classes unset, it follows the data")
        return cfg

    # ------------------------------------------------------------------ build
    def build_model(self, cfg: Dict[str, Any]) -> torch.nn.Module:
        from ..models.factory import create_model

        name = cfg["model"]["name"]
        try:
            model = create_model(name, **(cfg["model"].get("kwargs") or {}))
        except RuntimeError as exc:
            if "Unknown model" in str(exc):
                raise ValueError(f"unknown model {name!r} (not in timm's registry)") from None
            raise
        if float(_token_drop(cfg)):
            from ..evaluate.masking import check_token_dropping

            try:
                check_token_dropping(model)
            except ValueError as exc:
                raise ValueError(f"train.token_drop={cfg['train']['token_drop']}: {exc}") from None
        return model

    def build_datasets(self, cfg: Dict[str, Any]):
        from ..data.images import build_datasets

        return build_datasets(cfg)

    def collate_fn(self, cfg: Dict[str, Any]):
        return None

    def setup(self, cfg: Dict[str, Any], device) -> None:
        m = MixupConfig.from_config(cfg["train"].get("mixup"))
        self._mixup = None
        if m.mixup > 0 or m.cutmix > 0:
            from timm.data import Mixup

            self._mixup = Mixup(
                mixup_alpha=m.mixup, cutmix_alpha=m.cutmix, prob=m.prob, switch_prob=m.switch_prob,
                label_smoothing=m.label_smoothing, num_classes=int(cfg["model"]["kwargs"]["num_classes"]))

    def count(self, batch) -> int:
        return int(batch[0].shape[0])

    # ------------------------------------------------------------------ train / eval
    def loss(self, model, batch, cfg: Dict[str, Any]):
        x, y = batch
        smoothing = MixupConfig.from_config(cfg["train"].get("mixup")).label_smoothing
        drop = float(_token_drop(cfg)) if model.training else 0.0
        kw = {"attn_mask": token_drop_mask(model, x, drop)} if drop else {}
        if self._mixup is not None and model.training:
            x, soft = self._mixup(x, y)
            logits = model(x, **kw)
            loss = torch.sum(-soft * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
        else:
            logits = model(x, **kw)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=smoothing)
        acc = (logits.detach().argmax(-1) == y).float().mean() * 100.0
        return loss, {"acc": acc}

    @torch.no_grad()
    def evaluate(self, model, loader, cfg: Dict[str, Any]) -> Dict[str, float]:
        device = next(model.parameters()).device
        n = 0
        loss_sum = 0.0
        c1 = 0
        c5 = 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x).float()
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            k = min(5, logits.shape[-1])
            top = logits.topk(k, dim=-1).indices
            c1 += int((top[:, 0] == y).sum())
            c5 += int((top == y[:, None]).any(-1).sum())
            n += y.shape[0]
        if n == 0:
            raise ValueError("evaluation data set is empty")
        out = {"loss": loss_sum / n, "acc1": 100.0 * c1 / n, "acc5": 100.0 * c5 / n, "n": n}
        if logits.shape[-1] <= 5:  # top-5 of five classes or fewer is 100 % by construction: not reported
            del out["acc5"]
        return out


TASK = ClassificationTask()  # registered as "classification" by rpc_attention.train.tasks
