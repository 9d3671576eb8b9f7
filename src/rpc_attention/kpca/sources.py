"""Models and probe batches for the analysis: a training run, a timm model, a Hugging Face model.

A :class:`Probe` bundles a model with one fixed batch and knows how to run it (``forward()``) and,
for image classifiers, how to perturb it in pixel space (``x01`` in [0, 1], ``forward_x`` and
``loss_x``) so the PAP sparse part can be compared clean / FGSM / noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor, nn

from ..data.batch import to_device
from ..train.probe import first_eval_batch

__all__ = ["Probe", "image_probe", "probe_from_run", "probe_from_timm", "HF_BUILTIN_CONFIGS", "probe_from_hf"]


@dataclass
class Probe:
    model: nn.Module
    forward: Callable[[], Any]
    description: Dict[str, Any] = field(default_factory=dict)
    x01: Optional[Tensor] = None  # pixel-space images in [0, 1] (image classifiers only)
    labels: Optional[Tensor] = None
    forward_x: Optional[Callable[[Tensor], Tensor]] = None  # x01 -> logits
    run_dir: Optional[Path] = None
    cfg: Optional[dict] = None


def image_probe(model: nn.Module, x01: Tensor, mean, std, labels: Optional[Tensor] = None,
                description: Optional[dict] = None) -> Probe:
    """Probe of an image classifier whose inputs are normalised ``(x01 - mean) / std``."""
    c = x01.shape[1]
    m = torch.as_tensor(mean, dtype=x01.dtype).reshape(-1, 1, 1).expand(c, 1, 1)
    s = torch.as_tensor(std, dtype=x01.dtype).reshape(-1, 1, 1).expand(c, 1, 1)

    def forward_x(x: Tensor) -> Tensor:
        out = model((x - m.to(x.device)) / s.to(x.device))
        return out[0] if isinstance(out, (tuple, list)) else out

    return Probe(model=model, forward=lambda: forward_x(x01), description=description or {}, x01=x01,
                 labels=labels, forward_x=forward_x)


def _first_items(ds, limit: int):
    xs, ys = [], []
    for i in range(min(limit, len(ds))):
        item = ds[i]
        xs.append(torch.as_tensor(item[0]))
        ys.append(int(item[1]))
    return torch.stack(xs), torch.tensor(ys, dtype=torch.long)


def probe_from_run(run_dir, limit: int = 8, device: str = "cpu", ema: bool = False, split: str = "test") -> Probe:
    """Load a trainer run (``load_run``) and take the first ``limit`` examples of its eval split.

    Classification runs give pixel-space probes (perturbable); other tasks run the task's own
    ``loss`` on the first batch of its validation set (hooks see the same forward).
    """
    from ..train import load_run

    run_dir = Path(run_dir)
    model, cfg = load_run(run_dir, device=device, ema=ema)
    model.eval()
    task = cfg.get("task", "classification")
    desc = {"source": "run", "run": str(run_dir), "task": task, "model": cfg.get("model", {}).get("name"),
            "split": split, "examples": limit, "ema": ema}
    if task == "classification":
        from ..data.images import build_eval_dataset

        try:
            ds = build_eval_dataset(cfg, split=split, normalize=False)
        except ValueError:
            ds = build_eval_dataset(cfg, split="val", normalize=False)
            desc["split"] = "val"
        x01, y = _first_items(ds, limit)
        data = cfg.get("data", {})
        p = image_probe(model, x01.to(device), data.get("mean", [0.0]), data.get("std", [1.0]), y.to(device), desc)
        p.run_dir, p.cfg = run_dir, cfg
        return p
    t, batch, desc["split"], _ = first_eval_batch(cfg, limit)
    batch = to_device(batch, device)
    return Probe(model=model, forward=lambda: t.loss(model, batch, cfg), description=desc, run_dir=run_dir, cfg=cfg)


def _load_state(path: Path) -> Dict[str, Tensor]:
    """The model weights of a ``.safetensors`` / torch checkpoint (the library's one reader: one-line
    errors naming the file)."""
    from ..models.vision import read_checkpoint

    return read_checkpoint(str(path))


def probe_from_timm(name: str, checkpoint: Optional[str] = None, limit: int = 8, seed: int = 0,
                    device: str = "cpu", **kwargs) -> Probe:
    """A timm model (``pretrained=False``, optionally a local checkpoint) on seeded random images
    (uniform [0, 1], normalised with the model's own mean/std). The random initialisation is seeded by
    ``seed`` too (the global RNG is left as it was), so an analysis of a random-init model repeats exactly."""
    from ..models.factory import create_model  # (importing models registers the SymViT family in timm)

    try:
        model = _seeded(lambda: create_model(name, pretrained=False, **kwargs), seed)
    except RuntimeError as exc:
        raise ValueError(f"unknown timm model {name!r}: {exc}") from None
    desc = {"source": "timm", "model": name, "checkpoint": checkpoint, "weights": f"random init (seed {seed})",
            "examples": limit,
            "inputs": f"uniform random images (seed {seed})", "kwargs": kwargs}
    if checkpoint:
        missing, unexpected = model.load_state_dict(_load_state(Path(checkpoint)), strict=False)
        desc["weights"] = checkpoint
        desc["missing_keys"], desc["unexpected_keys"] = len(missing), len(unexpected)
    model.eval().to(device)
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", {}) or {}
    c, h, w = cfg.get("input_size", (3, 224, 224))
    if "img_size" in kwargs:
        h = w = int(kwargs["img_size"])
    if "in_chans" in kwargs:
        c = int(kwargs["in_chans"])
    gen = torch.Generator().manual_seed(seed)
    x01 = torch.rand(limit, c, h, w, generator=gen).to(device)
    mean = cfg.get("mean", (0.5,) * c)[:c] if len(cfg.get("mean", ())) >= c else (0.5,) * c
    std = cfg.get("std", (0.5,) * c)[:c] if len(cfg.get("std", ())) >= c else (0.5,) * c
    return image_probe(model, x01, mean, std, None, desc)


# Built-in small configurations (no download): real architectures, random weights.
HF_BUILTIN_CONFIGS = {
    "bert-tiny-config": ("bert", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=512, vocab_size=30522, max_position_embeddings=512)),
    "bert-mini-config": ("bert", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                      intermediate_size=1024, vocab_size=30522, max_position_embeddings=512)),
    "vit-tiny-config": ("vit", dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                                    intermediate_size=768, image_size=224, patch_size=16)),
}


def _seeded(build, seed: int):
    """``build()`` with torch's global RNG seeded by ``seed``, the caller's RNG state restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def probe_from_hf(name_or_path: str, limit: int = 8, seed: int = 0, seq_len: int = 128, device: str = "cpu") -> Probe:
    """A Hugging Face model from a local directory (config.json, weights if present) or a built-in
    config name (:data:`HF_BUILTIN_CONFIGS`), offline. Text models get seeded random token ids
    (full attention mask), vision models seeded random images."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers import AutoConfig, AutoModel

    desc: Dict[str, Any] = {"source": "hf", "model": name_or_path, "examples": limit}
    if name_or_path in HF_BUILTIN_CONFIGS:
        mtype, kw = HF_BUILTIN_CONFIGS[name_or_path]
        config = transformers.AutoConfig.for_model(mtype, **kw)
        model = _seeded(lambda: AutoModel.from_config(config), seed)
        desc["weights"] = f"random init (built-in config, seed {seed})"
    else:
        path = Path(name_or_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{name_or_path!r} is neither a built-in config ({', '.join(HF_BUILTIN_CONFIGS)}) nor a directory "
                "with config.json")
        config = AutoConfig.from_pretrained(str(path))
        has_weights = any((path / f).is_file() for f in ("model.safetensors", "pytorch_model.bin"))
        model = AutoModel.from_pretrained(str(path)) if has_weights else _seeded(lambda: AutoModel.from_config(config), seed)
        desc["weights"] = str(path) if has_weights else f"random init (config only, seed {seed})"
    model.eval().to(device)
    gen = torch.Generator().manual_seed(seed)
    if hasattr(config, "image_size") and not hasattr(config, "vocab_size"):
        c = getattr(config, "num_channels", 3)
        x01 = torch.rand(limit, c, config.image_size, config.image_size, generator=gen).to(device)

        def fwd_x(x: Tensor) -> Tensor:
            return model(pixel_values=(x - 0.5) / 0.5).last_hidden_state

        desc["inputs"] = f"uniform random images (seed {seed})"
        return Probe(model=model, forward=lambda: fwd_x(x01), description=desc)
    n = min(seq_len, getattr(config, "max_position_embeddings", seq_len))
    ids = torch.randint(0, config.vocab_size, (limit, n), generator=gen).to(device)
    mask = torch.ones_like(ids)
    desc["inputs"] = f"random token ids, length {n} (seed {seed})"
    return Probe(model=model, forward=lambda: model(input_ids=ids, attention_mask=mask), description=desc)
