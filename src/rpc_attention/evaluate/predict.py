"""Running a model over evaluation examples: progress bars, batched logits, top-k correctness."""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = ["progress", "chunks", "predict_logits", "topk_correct", "top1_hits"]


def progress(iterable=None, total: Optional[int] = None, desc: str = "", unit: str = "batch"):
    """tqdm progress bar (with ETA) that is silent when stderr is not a TTY, when the package's log
    level was set above INFO (``rpc-attention -q``) or when ``RPC_ATTENTION_NO_PROGRESS=1`` (for
    terminals that should show no bars, e.g. the test suite and torchrun workers)."""
    from tqdm.auto import tqdm

    quiet = logging.getLogger("rpc_attention").level > logging.INFO  # explicitly set; NOTSET (0) keeps bars
    disable = (quiet or os.environ.get("RPC_ATTENTION_NO_PROGRESS", "") not in ("", "0")
               or not sys.stderr.isatty())
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=False, dynamic_ncols=True)


def chunks(n: int, batch_size: int, desc: str = "") -> Iterator[slice]:
    for i in progress(range(0, n, batch_size), total=(n + batch_size - 1) // batch_size, desc=desc):
        yield slice(i, min(i + batch_size, n))


@torch.no_grad()
def predict_logits(model: nn.Module, x: Tensor, batch_size: int = 256, device: str = "cpu", desc: str = "") -> Tensor:
    out = []
    for i in progress(range(0, len(x), batch_size), total=(len(x) + batch_size - 1) // batch_size, desc=desc):
        out.append(model(x[i:i + batch_size].to(device)).float().cpu())
    return torch.cat(out) if out else torch.empty(0)


def topk_correct(logits: Tensor, y: Tensor, ks: Sequence[int] = (1, 5)) -> dict:
    """Number of examples whose label is in the top-k predictions, for each k (k capped at #classes)."""
    res = {}
    maxk = min(max(ks), logits.shape[-1])
    top = logits.topk(maxk, dim=-1).indices
    hit = top == y.view(-1, 1)
    for k in ks:
        res[k] = int(hit[:, : min(k, maxk)].any(dim=1).sum())
    return res


def top1_hits(logits: Tensor, y: Tensor) -> Tensor:
    """Boolean ``[N]``: whether each example's top-1 prediction is its label (ties: the first maximum)."""
    return logits.argmax(dim=-1) == y.view(-1).to(logits.device)
