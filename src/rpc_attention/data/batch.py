"""Moving a collated batch (tensors in nested tuples, lists and dicts) to a device."""

from __future__ import annotations

from typing import Any

import torch


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor in it moved to ``device``; containers keep their type, other values stay.

    ``non_blocking=True`` overlaps host-to-device copies from pinned memory with compute (the
    trainer's loaders pin memory on CUDA); leave it off when the copy goes to the host.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch
