"""The fixed probe batch of a training config: the first examples of its held-out split.

:func:`first_eval_batch` is what the epoch-end measurements (the ``sparsity`` callback here, the ``jproj``
callback and ``analyze --run`` of :mod:`rpc_attention.kpca`) run a model on.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple

import torch

from .tasks import get_task


class EvalBatch(NamedTuple):
    task: Any
    batch: Any  # collated as the task collates, on the CPU
    split: str  # "val", or "test" when the task has no validation set
    examples: int


def first_eval_batch(cfg: Dict[str, Any], n: int) -> EvalBatch:
    """The first ``n`` examples of the task's validation set (its test set when there is none), for the
    probes of ``analyze`` and the ``jproj`` / ``sparsity`` callbacks; ValueError when it has neither.
    The loader has its own generator, so taking the batch leaves the training's random streams alone."""
    from torch.utils.data import DataLoader

    name = cfg.get("task", "classification")
    task = get_task(name)
    datasets = task.build_datasets(cfg)
    split = "val" if datasets.get("val") else "test"  # an empty validation set counts as none
    dataset = datasets.get(split)
    if not dataset:
        raise ValueError(f"task {name!r} built no 'val' or 'test' data set to take a probe batch from")
    collate = task.collate_fn(cfg) if callable(getattr(task, "collate_fn", None)) else None
    loader = DataLoader(dataset, batch_size=n, shuffle=False, collate_fn=collate,
                        generator=torch.Generator().manual_seed(0))
    return EvalBatch(task, next(iter(loader)), split, min(n, len(dataset)))
