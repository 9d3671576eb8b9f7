"""What an evaluation reads: the data settings of a run, the split as tensors or batches, the
input normalisation (a model that takes pixels in [0, 1])."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn

from .predict import chunks, progress

__all__ = ["data_name", "num_classes_of", "cfg_value", "norm_stats", "Normalized", "dataset_to_tensors",
           "load_eval_data", "eval_batches", "eval_indices"]


def data_name(cfg: Mapping[str, Any]) -> str:
    data = cfg.get("data") or {}
    return str(data.get("name") or data.get("dataset") or "unknown")


def num_classes_of(model: nn.Module, cfg: Mapping[str, Any]) -> Optional[int]:
    v = cfg_value(cfg, "num_classes")
    if v:
        return int(v)
    n = getattr(model, "num_classes", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def cfg_value(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``key`` from ``cfg["data"]``, ``cfg["model"]["kwargs"]`` or ``cfg["model"]`` (first found)."""
    data = cfg.get("data") or {}
    model = cfg.get("model") or {}
    for src in (data, model.get("kwargs") or {}, model):
        if isinstance(src, Mapping) and src.get(key) is not None:
            return src[key]
    return default


def norm_stats(cfg: Mapping[str, Any], channels: int) -> Tuple[Tensor, Tensor]:
    """Per-channel ``(mean, std)`` from ``cfg["data"]`` (scalars or lists), shaped ``[C]``."""
    data = cfg.get("data") or {}
    mean, std = data.get("mean", 0.0), data.get("std", 1.0)

    def vec(v, name):
        t = torch.as_tensor(v, dtype=torch.float32).flatten()
        if t.numel() == 1:
            t = t.expand(channels).clone()
        if t.numel() != channels:
            raise ValueError(f"data.{name} has {t.numel()} values but the images have {channels} channels")
        return t

    mean_t, std_t = vec(mean, "mean"), vec(std, "std")
    if (std_t <= 0).any():
        raise ValueError(f"data.std must be positive, got {std_t.tolist()}")
    return mean_t, std_t


class Normalized(nn.Module):
    """``model((x - mean) / std, **kwargs)``: a classifier on ``[0, 1]`` pixels (pixel-space attacks);
    keyword arguments (a key mask) go to the model unchanged."""

    def __init__(self, model: nn.Module, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.reshape(1, -1, 1, 1).clone(), persistent=False)
        self.register_buffer("std", std.reshape(1, -1, 1, 1).clone(), persistent=False)

    def forward(self, x: Tensor, **kwargs: Any) -> Tensor:
        mean = self.mean.to(device=x.device, dtype=x.dtype)
        std = self.std.to(device=x.device, dtype=x.dtype)
        return self.model((x - mean) / std, **kwargs)


def dataset_to_tensors(ds: Any, limit: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """``(x, y)`` tensors from a tuple of tensors, a TensorDataset or any map-style dataset of pairs."""
    if isinstance(ds, (tuple, list)) and len(ds) == 2 and all(isinstance(t, Tensor) for t in ds):
        x, y = ds
    elif hasattr(ds, "tensors") and len(ds.tensors) >= 2:
        x, y = ds.tensors[0], ds.tensors[1]
    elif (isinstance(getattr(ds, "images", None), Tensor) and ds.images.dtype == torch.uint8
          and getattr(ds, "transform", 1) is None and getattr(ds, "mean", 1) is None):
        # rpc_attention.data.images.TensorImageDataset without transform/normalisation: no per-item loop
        n = len(ds) if limit is None else min(len(ds), int(limit))
        x, y = ds.images[:n].float() / 255.0, torch.as_tensor(ds.labels[:n])
    else:
        n = len(ds) if limit is None else min(len(ds), int(limit))
        # an evenly spread subset (folder data sets are sorted by class)
        idx = range(len(ds)) if n == len(ds) else [int(k * len(ds) / n) for k in range(n)]
        xs, ys = [], []
        for i in idx:
            xi, yi = ds[i]
            xs.append(torch.as_tensor(xi))
            ys.append(torch.as_tensor(yi))
        x, y = torch.stack(xs), torch.stack(ys)
    if limit is not None:
        x, y = x[: int(limit)], y[: int(limit)]
    return x, torch.as_tensor(y).long()


def load_eval_data(cfg: Mapping[str, Any], split: str = "test", limit: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """Un-normalised ``[0, 1]`` evaluation images ``[N, C, H, W]`` and labels of the run's data set
    (the first ``limit`` examples, in data-set order)."""
    ds = _eval_dataset(cfg, split)
    x, y = dataset_to_tensors(ds, limit)
    x = x.float()
    if x.ndim == 3:
        x = x.unsqueeze(1)
    return x, y


def _is_in_memory(ds: Any) -> bool:
    return ((isinstance(ds, (tuple, list)) and len(ds) == 2) or hasattr(ds, "tensors")
            or (isinstance(getattr(ds, "images", None), Tensor) and getattr(ds, "transform", 1) is None
                and getattr(ds, "mean", 1) is None))


_DS_CACHE: dict = {}


def _eval_dataset(cfg: Mapping[str, Any], split: str):
    """``build_eval_dataset(cfg, split, normalize=False)``, remembered for the last two configs (the
    attack suites read the split once per eps)."""
    import json

    from ..data import images as _images

    try:
        key = (json.dumps(cfg.get("data"), sort_keys=True, default=str), split)
    except TypeError:
        key = None
    if key is not None and key in _DS_CACHE:
        return _DS_CACHE[key]
    ds = _images.build_eval_dataset(cfg, split=split, normalize=False)
    if key is not None:
        while len(_DS_CACHE) >= 2:
            _DS_CACHE.pop(next(iter(_DS_CACHE)))
        _DS_CACHE[key] = ds
    return ds


def eval_batches(cfg: Mapping[str, Any], split: str, limit: Optional[int], batch_size: int,
                 desc: str = "") -> Tuple[int, Callable[[], Iterator[Tuple[Tensor, Tensor]]]]:
    """``(n, make_iter)``: ``make_iter()`` yields ``(x [B,C,H,W] in [0,1], y)`` batches of the first ``limit``
    examples (an even spread for folder data sets), streamed from disk for data sets that are not in
    memory (ImageNet), so a full validation set never has to fit in RAM."""
    ds = _eval_dataset(cfg, split)
    if _is_in_memory(ds):
        x, y = dataset_to_tensors(ds, limit)
        x = x.float()
        if x.ndim == 3:
            x = x.unsqueeze(1)

        def it():
            for sl in chunks(len(y), batch_size, desc=desc):
                yield x[sl], y[sl]

        return len(y), it
    from torch.utils.data import DataLoader, Subset

    n = len(ds) if limit is None else min(len(ds), int(limit))
    idx = list(range(len(ds))) if n == len(ds) else [int(k * len(ds) / n) for k in range(n)]
    workers = int((cfg.get("data") or {}).get("num_workers") or 0)

    def it():
        loader = DataLoader(Subset(ds, idx), batch_size=batch_size, shuffle=False, num_workers=workers)
        for xb, yb in progress(loader, total=len(loader), desc=desc):
            yield xb.float(), torch.as_tensor(yb).long()

    return n, it


def eval_indices(cfg: Mapping[str, Any], split: str, limit: Optional[int]) -> list:
    """The split's indices of the examples :func:`eval_batches` and :func:`load_eval_data` yield, in
    their order: the first ``limit`` of an in-memory data set, an even spread of a folder data set."""
    ds = _eval_dataset(cfg, split)
    total = len(ds[1]) if isinstance(ds, (tuple, list)) else (len(ds.tensors[0]) if hasattr(ds, "tensors") else len(ds))
    n = total if limit is None else min(total, int(limit))
    if _is_in_memory(ds) or n == total:
        return list(range(n))
    return [int(k * total / n) for k in range(n)]
