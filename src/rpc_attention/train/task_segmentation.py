"""Task ``segmentation``: Segmenter (SymViT / RPC-SymViT encoder + linear or mask-transformer decoder).

Config keys it reads:

- ``model.name``: the encoder's timm name (``symvit_tiny_patch16_224``, ``rpc_symvit_tiny_patch16_224``, ...);
  ``model.kwargs``: encoder keywords (``img_size, patch_size, embed_dim, depth, num_heads,
  drop_path_rate, rpc_layers, n_iter, lambd, ...``; ``in_chans``/``img_size`` default to the data's);
  ``model.decoder`` (``mask_transformer`` | ``linear``), ``model.decoder_layers``, ``decoder_dim``,
  ``decoder_heads``, ``decoder_drop``, ``decoder_drop_path``, ``decoder_rpc`` (false | true = block 0 |
  list | all), ``decoder_n_iter``, ``decoder_lambd``; ``model.encoder_init``: a classification run
  directory (its ``model.safetensors`` initialises the encoder; position embeddings are resampled).
- ``data.name``: ``fmnist_seg`` (composed Fashion-MNIST, embedded) or ``ade20k`` (``data.root`` =
  an ``ADEChallengeData2016`` folder); see :mod:`rpc_attention.data.segmentation`.
- ``eval.sliding_window`` (default: on for ADE20K), ``eval.window_size`` (default ``data.crop_size``),
  ``eval.window_stride``.

Loss: pixel-wise cross-entropy, label 255 ignored. Metrics: ``loss``, ``pixel_acc``, ``mean_acc``,
``miou`` (percent; primary metric ``miou``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

IGNORE_INDEX = 255


class SegmentationTask:
    throughput_unit = "images"
    primary_metric = "miou"
    # read by rpc_attention.data.segmentation with its defaults (the synthetic data set's rendering)
    optional_keys = ("data.threshold", "data.background_max", "data.noise_std")

    # ------------------------------------------------------------------ config
    def default_config(self) -> Dict[str, Any]:
        return {
            "model": {"name": "symvit_tiny_patch16_224", "num_classes": None, "decoder": "mask_transformer",
                      "decoder_layers": 2, "decoder_dim": None, "decoder_heads": None, "decoder_mlp_ratio": 4.0,
                      "decoder_drop": 0.1, "decoder_drop_path": 0.0, "decoder_rpc": False,
                      "decoder_n_iter": None, "decoder_lambd": None, "encoder_init": None},
            "data": {"name": "fmnist_seg", "img_size": None, "crop_size": None, "train_images": 2000,
                     "val_images": 200, "test_images": 500, "n_items": [2, 4], "item_scale": [0.8, 1.5],
                     "val_items": 10000, "seed": 0, "flip": True, "ratio_range": [0.5, 2.0],
                     "scale": [2048, 512], "classes": None, "train_limit": None, "val_limit": None},
            "eval": {"sliding_window": None, "window_size": None, "window_stride": None},
        }

    def finalize_config(self, cfg: Dict[str, Any]) -> Dict[str, Any]:
        from ..data.segmentation import dataset_info

        d, m = cfg["data"], cfg["model"]
        if not d.get("name"):
            raise ValueError("data.name is not set (fmnist_seg or ade20k)")
        info = dataset_info(d["name"])
        for key in ("mean", "std", "num_classes", "in_chans", "classes"):
            if d.get(key) is None:
                d[key] = info[key]
        is_ade = str(d["name"]).lower() in ("ade20k", "ade")
        if is_ade:
            if d.get("crop_size") is None:
                d["crop_size"] = 512
            if d.get("img_size") is None:
                d["img_size"] = d["crop_size"]
            if not d.get("root"):
                raise ValueError("data.root is not set: give the ADEChallengeData2016 directory, "
                                 "e.g. --set data.root=/data/ADEChallengeData2016")
            root = Path(str(d["root"])).expanduser()
            if not (root / "images").is_dir() or not (root / "annotations").is_dir():
                raise FileNotFoundError(f"data.root={root} is not an ADEChallengeData2016 directory "
                                        f"(expected images/ and annotations/ with training/ and validation/)")
        elif d.get("img_size") is None:
            d["img_size"] = 64
        if m.get("num_classes") is None:
            m["num_classes"] = int(d["num_classes"])
        if int(m["num_classes"]) != int(d["num_classes"]):
            raise ValueError(f"model.num_classes={m['num_classes']} but data {d['name']} has {d['num_classes']} classes")
        kw = m.setdefault("kwargs", {}) or {}
        m["kwargs"] = kw
        kw.setdefault("in_chans", int(d["in_chans"]))
        kw.setdefault("img_size", int(d.get("crop_size") or d["img_size"]))
        init = m.get("encoder_init")
        if init:
            p = Path(str(init)).expanduser()
            if not (p.is_file() or (p / "model.safetensors").is_file()):
                raise FileNotFoundError(f"model.encoder_init={init}: expected a finished classification run "
                                        f"directory with model.safetensors (or a .safetensors file)")
        return cfg

    # ------------------------------------------------------------------ build
    def build_model(self, cfg: Dict[str, Any]) -> torch.nn.Module:
        from ..models.segmentation import build_segmenter

        mcfg = dict(cfg["model"])
        init = mcfg.get("encoder_init")
        if init:
            p = Path(str(init)).expanduser()
            if not (p.is_file() or (p / "model.safetensors").is_file()):
                # Only reached when rebuilding a finished run (load_run / resume): its own weights
                # replace the encoder init anyway (finalize_config rejects a missing path at train time).
                logger.warning("encoder_init %s is gone; building the encoder without it", init)
                mcfg["encoder_init"] = None
        return build_segmenter(mcfg)

    def build_datasets(self, cfg: Dict[str, Any]):
        from ..data.segmentation import build_datasets

        return build_datasets(cfg)

    def collate_fn(self, cfg: Dict[str, Any]):
        from ..data.segmentation import seg_collate

        return seg_collate

    def count(self, batch) -> int:
        return len(batch[0])

    # ------------------------------------------------------------------ train / eval
    def loss(self, model, batch, cfg: Dict[str, Any]):
        x, y = batch
        if isinstance(x, (list, tuple)):
            raise ValueError("segmentation training batches must have one image size (use random crops)")
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y, ignore_index=IGNORE_INDEX)
        with torch.no_grad():
            valid = y != IGNORE_INDEX
            acc = ((logits.argmax(1) == y) & valid).sum().float() / valid.sum().clamp(min=1) * 100.0
        return loss, {"pixel_acc": acc}

    @torch.no_grad()
    def evaluate(self, model, loader, cfg: Dict[str, Any]) -> Dict[str, float]:
        from ..evaluate.segmentation import evaluate_loader, window_of

        res = evaluate_loader(model, loader, int(cfg["model"]["num_classes"]), window_of(cfg))
        return {"loss": res["loss"], "pixel_acc": res["pixel_acc"], "mean_acc": res["mean_acc"],
                "miou": res["miou"], "n": res["n"]}


TASK = SegmentationTask()  # registered as "segmentation" by rpc_attention.train.tasks
