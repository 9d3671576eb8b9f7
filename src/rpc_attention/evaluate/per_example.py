"""Per-example correctness records, so two models evaluated on the same examples can be compared
example by example (paired bootstrap intervals in the study report).

A classification suite adds ``"per_example"`` to its result (written into ``<suite>.json``)::

    {"indices": "0:300",                       # the split's example indices, "start:stop" or a list
     "correct": {"clean": "0110...", "1/255": "0100..."},   # one character per example, 1 = top-1 right
     "metrics": {"top1": {"settings": ["clean"]},           # metric = 100 x mean over examples of the
                 "mean_top1": {"settings": ["1/255", ...]}, #   mean over its settings of "correct"
                 "mean_corruption_error": {"settings": [...], "error": true}}}  # 100 - that, for errors

The ``metrics`` map says which recorded metric is which average of the bits, so a reader turns a
metric into one score per example (:func:`example_scores`) whose mean reproduces the metric.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

__all__ = ["encode_bits", "decode_bits", "encode_indices", "decode_indices", "PerExample", "example_scores"]


def encode_bits(hits: Union[Tensor, Sequence[bool]]) -> str:
    """``"0110..."``: one character per example."""
    flat = torch.as_tensor(hits).reshape(-1).bool().tolist()
    return "".join("1" if h else "0" for h in flat)


def decode_bits(bits: str) -> np.ndarray:
    """The boolean array of an :func:`encode_bits` string; raises ValueError on any other character."""
    if set(bits) - {"0", "1"}:
        raise ValueError("a per-example record holds only the characters 0 and 1")
    return np.frombuffer(bits.encode("ascii"), dtype=np.uint8) == ord("1")


def encode_indices(indices: Sequence[int]) -> Union[str, List[int]]:
    """``"start:stop"`` for a contiguous run of indices, else the list itself."""
    idx = [int(i) for i in indices]
    if idx and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"{idx[0]}:{idx[0] + len(idx)}"
    return idx


def decode_indices(record: Union[str, Sequence[int]]) -> np.ndarray:
    """The index array of an :func:`encode_indices` value."""
    if isinstance(record, str):
        start, stop = (int(p) for p in record.split(":"))
        return np.arange(start, stop, dtype=np.int64)
    return np.asarray([int(i) for i in record], dtype=np.int64)


class PerExample:
    """Collects, per setting, which examples the model classified correctly (top-1), batch by batch."""

    def __init__(self, indices: Sequence[int]) -> None:
        self.indices = list(indices)
        self._hits: Dict[str, List[Tensor]] = {}
        self._metrics: Dict[str, Dict[str, Any]] = {}

    def add(self, setting: str, hits: Tensor) -> None:
        """Append the correctness of the next batch of examples under ``setting``."""
        self._hits.setdefault(setting, []).append(torch.as_tensor(hits).reshape(-1).bool().cpu())

    def metric(self, name: str, settings: Sequence[str], error: bool = False) -> None:
        """Declare that metric ``name`` is 100 x the mean over examples and ``settings`` of the bits
        (``error``: 100 minus that)."""
        self._metrics[name] = {"settings": list(settings), **({"error": True} if error else {})}

    def as_dict(self) -> Dict[str, Any]:
        n = len(self.indices)
        correct = {}
        for setting, parts in self._hits.items():
            bits = torch.cat(parts)
            if len(bits) != n:
                raise RuntimeError(f"per-example record {setting!r}: {len(bits)} results for {n} examples")
            correct[setting] = encode_bits(bits)
        return {"indices": encode_indices(self.indices), "correct": correct, "metrics": dict(self._metrics)}


def example_scores(record: Optional[Mapping[str, Any]], metric: str) -> Optional[np.ndarray]:
    """One float64 score per example whose mean is ``metric`` (percent), or None when ``record`` does
    not describe that metric. Error metrics give the error (100 - mean correctness) per example."""
    if not record or metric not in (record.get("metrics") or {}):
        return None
    spec = record["metrics"][metric]
    bits = [decode_bits(record["correct"][s]) for s in spec["settings"]]
    if not bits:
        return None
    score = 100.0 * np.mean(np.stack(bits).astype(np.float64), axis=0)
    return 100.0 - score if spec.get("error") else score
