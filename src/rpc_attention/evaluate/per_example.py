"""Per-example correctness records, so two models evaluated on the same examples can be compared
example by example (paired bootstrap intervals in the study report).

A classification suite adds ``"per_example"`` to its result (written into ``<suite>.json``)::

    {"indices": "0:300",                       # the split's example indices, "start:stop" or a list
     "correct": {"clean": "0110...", "1/255": "0100..."},   # one character per example, 1 = top-1 right
     "metrics": {"top1": {"settings": ["clean"]},           # metric = 100 x mean over examples of the
                 "mean_top1": {"settings": ["1/255", ...]}, #   mean over its settings of "correct"
                 "mean_corruption_error": {"settings": [...], "error": true},  # 100 - that, for errors
                 "mCE": {"settings": [...], "error": true, "weights": [...]}}}  # weighted sum, see below

The ``metrics`` map says which recorded metric is which average of the bits, so a reader turns a
metric into one score per example (:func:`example_scores`) whose mean reproduces the metric. A metric
with ``weights`` (one per setting) is ``100 x sum_s w_s bit_s`` per example (errors: ``1 - bit_s``)
instead of the plain mean: mCE = 100 x mean_c (mean_s E_{c,s}) / E^ref_c is the mean over examples of
``100 x sum_{c,s} err_{i,c,s} / (C S E^ref_c)``, so its weights are ``1 / (C S E^ref_c)``.

Three suites keep a per-example value that is not a bit (:func:`score_record`): OOD detection (each
example's score under each OOD score and whether it is OOD; a metric ``AUPR_<score>`` or
``AUROC_<score>`` is recomputed from that score on a resample of the examples),
perplexity (the summed NLL and token count of each block of consecutive tokens; the metric,
exp(sum NLL / sum tokens), is recomputed on a resample of the blocks) and segmentation (each image's
true-positive, ground-truth and predicted pixel counts per class; mIoU recomputed from their sums)::

    {"indices": "0:1500", "kind": "ood", "values": {"msp": [[score], ...], "energy": ...}, "strata": "0..01..1"}
    {"indices": "0:420", "kind": "ppl", "values": {"test_ppl_sliding": [[nll_sum, tokens], ...]}}

Metrics over different examples (the splits of a perplexity suite) keep one such record each:
``{"by_metric": {metric: record}}``.

:func:`example_data` turns any of these records into an :class:`ExampleData` (indices, values, the
statistic that recomputes the metric from values, strata) for the paired bootstrap.
"""

from __future__ import annotations

import fnmatch
import functools
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

__all__ = ["EXAMPLE_METRICS", "has_example_record", "encode_bits", "decode_bits", "encode_indices", "decode_indices", "PerExample", "example_scores",
           "ExampleData", "example_data", "score_record", "average_precision", "roc_area", "STATISTICS"]


_ATTACK = ("clean_top1", "top1", "top1@*", "mean_top1")
# The metrics each suite writes a per-example record for (fnmatch patterns), so that a claim on them gets
# an example interval in the report; tests/evaluate check the suites' records against this table.
EXAMPLE_METRICS: Dict[str, tuple] = {
    "clean": ("top1", "error"),
    **{name: _ATTACK for name in ("fgsm", "pgd", "spsa", "sld", "cw", "noise", "square", "autoattack")},
    "corruptions": ("clean_error", "mean_corruption_error", "mCE"),
    "sparse": ("top1_*", "mean_top1_input", "mean_top1_keys"),
    "patch": ("clean_top1", "top1@*patch", "top1@*patch_*"),
    "certify": ("clean_top1", "certified_top1_*", "defended_top1_*", "attacked_top1_*"),
    "ood": ("AUPR_*", "AUROC_*"),
    "imagenet-a": ("top1",), "imagenet-r": ("top1",),
    "ppl": ("*_ppl_*",), "wordswap": ("*_ppl_*",),
    "seg": ("miou",), "seg-corruptions": ("clean_miou", "corrupted_miou"),
}


def has_example_record(suite: str, metric: str) -> bool:
    """Whether ``suite`` writes a per-example record of ``metric`` (:data:`EXAMPLE_METRICS`)."""
    return any(fnmatch.fnmatchcase(metric, p) for p in EXAMPLE_METRICS.get(suite, ()))


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

    def metric(self, name: str, settings: Sequence[str], error: bool = False,
               weights: Optional[Sequence[float]] = None) -> None:
        """Declare that metric ``name`` is 100 x the mean over examples and ``settings`` of the bits
        (``error``: 100 minus that); with ``weights`` (one per setting) the weighted sum instead."""
        spec: Dict[str, Any] = {"settings": list(settings), **({"error": True} if error else {})}
        if weights is not None:
            if len(weights) != len(settings):
                raise ValueError(f"metric {name!r}: {len(weights)} weights for {len(settings)} settings")
            spec["weights"] = [float(w) for w in weights]
        self._metrics[name] = spec

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
    hits = np.stack(bits).astype(np.float64)
    if spec.get("error"):
        hits = 1.0 - hits
    if "weights" in spec:
        return 100.0 * (np.asarray(spec["weights"], dtype=np.float64) @ hits)
    return 100.0 * np.mean(hits, axis=0)


def average_precision(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Average precision ``sum_k (R_k - R_{k-1}) P_k`` over the distinct thresholds (ties form one
    threshold), positives = ``positive != 0``; both ``(..., n)``, returns ``(...)``. The same value as
    scikit-learn's ``average_precision_score``, looped over the leading axes (float64)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive) != 0
    flat_s, flat_y = s.reshape(-1, s.shape[-1]), np.broadcast_to(y, s.shape).reshape(-1, s.shape[-1])
    out = np.empty(len(flat_s))
    for i, (si, yi) in enumerate(zip(flat_s, flat_y)):
        order = np.argsort(-si, kind="mergesort")
        si, yi = si[order], yi[order]
        last = np.r_[np.flatnonzero(np.diff(si)), len(si) - 1]  # the last position of each threshold
        tp = np.cumsum(yi)[last].astype(np.float64)
        recall = tp / tp[-1]
        out[i] = float(np.sum(np.diff(np.r_[0.0, recall]) * tp / (last + 1)))
    return out.reshape(s.shape[:-1])


def roc_area(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """The area under the ROC curve, P(score_pos > score_neg) + P(equal) / 2, from the ranks of the scores
    (the Mann-Whitney statistic, ties at their mean rank), positives = ``positive != 0``; both
    ``(..., n)``, returns ``(...)`` (float64). The same value as scikit-learn's ``roc_auc_score``."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64)
    y = np.broadcast_to(np.asarray(positive) != 0, s.shape)
    ranks = rankdata(s, axis=-1)
    n_pos = y.sum(axis=-1).astype(np.float64)
    n_neg = s.shape[-1] - n_pos
    return ((ranks * y).sum(axis=-1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def of_column_sums(statistic):
    """Mark ``statistic`` as reading only the column sums of its values: ``statistic(v, strata)`` equals
    ``statistic(v.sum(axis=-2, keepdims=True), None)``. The bootstrap then sums each resample through its
    draw counts instead of gathering ``(resamples, n, k)`` values. Returns ``statistic``."""
    statistic.column_sums = True
    return statistic


def _mean(values: np.ndarray, strata: Optional[np.ndarray]) -> np.ndarray:
    return values[..., 0].mean(axis=-1)


def _aupr(values: np.ndarray, strata: Optional[np.ndarray]) -> np.ndarray:
    return 100.0 * average_precision(values[..., 0], strata)


def _auroc(values: np.ndarray, strata: Optional[np.ndarray]) -> np.ndarray:
    return 100.0 * roc_area(values[..., 0], strata)


def _ppl(values: np.ndarray, strata: Optional[np.ndarray]) -> np.ndarray:
    return np.exp(values[..., 0].sum(axis=-1) / values[..., 1].sum(axis=-1))


def _miou(values: np.ndarray, strata: Optional[np.ndarray], classes: int) -> np.ndarray:
    from .segmentation import miou_of_stats

    return miou_of_stats(values, classes)


# statistic of each record kind: values (..., n, k) and strata (..., n) -> the metric (...)
STATISTICS: Dict[str, Callable[..., np.ndarray]] = {"mean": _mean, "aupr": _aupr, "auroc": _auroc, "ppl": _ppl,
                                                     "miou": _miou}
# an "ood" record's metrics: <statistic>_<score>, the statistic computed from that score's values
_OOD_STATISTICS = {"AUPR": _aupr, "AUROC": _auroc}


class ExampleData(NamedTuple):
    """One model's per-example values of one metric: ``statistic(values, strata)`` is the metric."""
    indices: np.ndarray
    values: np.ndarray                      # (n, k) float64
    statistic: Callable[[np.ndarray, Optional[np.ndarray]], np.ndarray]
    strata: Optional[np.ndarray] = None     # (n,) resampled separately, or None


def score_record(kind: str, values: Mapping[str, Any], strata: Optional[Sequence[bool]] = None,
                 classes: Optional[int] = None) -> Dict[str, Any]:
    """A per-example record of non-bit values: ``kind`` "ood" (values ``{score name: per-example score}``,
    ``strata`` = is OOD; metric ``AUPR_<score>`` / ``AUROC_<score>``), "aupr" (values ``{metric:
    per-example score}``, ``strata`` = is OOD), "ppl" (values ``{metric: [[nll_sum, tokens], ...]}`` per
    block) or "miou" (values ``{metric: per-image counts}``, see ``segmentation.miou_of_stats``; needs
    ``classes``)."""
    if kind not in ("ood", "aupr", "ppl", "miou"):
        raise ValueError(f"score record kind must be ood, aupr, ppl or miou, got {kind!r}")
    if (kind == "miou") != (classes is not None):
        raise ValueError("a miou record needs the number of classes, and only a miou record takes it")
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(len(v), -1) for k, v in values.items()}
    n = {len(a) for a in arrays.values()} | ({len(strata)} if strata is not None else set())
    if len(n) != 1:
        raise ValueError(f"score record: values and strata of different lengths {sorted(n)}")
    rec: Dict[str, Any] = {"indices": encode_indices(range(n.pop())), "kind": kind,
                           "values": {k: a.tolist() for k, a in arrays.items()}}
    if strata is not None:
        rec["strata"] = encode_bits(torch.as_tensor(np.asarray(strata, dtype=bool)))
    if classes is not None:
        rec["classes"] = int(classes)
    return rec


def example_data(record: Optional[Mapping[str, Any]], metric: str) -> Optional[ExampleData]:
    """The :class:`ExampleData` of ``metric`` in a per-example record (bits or scores), or None when
    the record does not describe that metric."""
    if not record:
        return None
    if "by_metric" in record:  # one record per metric (metrics over different examples, e.g. splits)
        return example_data(record["by_metric"].get(metric), metric)
    indices = decode_indices(record["indices"]) if "indices" in record else None
    kind = record.get("kind", "mean")
    if kind == "mean":
        scores = example_scores(record, metric)
        return None if scores is None else ExampleData(indices, scores[:, None], STATISTICS["mean"])
    stat_name, _, score = metric.partition("_")
    if kind == "ood" and stat_name in _OOD_STATISTICS:
        vals, stat = (record.get("values") or {}).get(score), _OOD_STATISTICS[stat_name]
    else:
        vals, stat = (record.get("values") or {}).get(metric), STATISTICS.get(kind)
    if vals is None or stat is None:
        return None
    strata = decode_bits(record["strata"]).astype(np.int64) if record.get("strata") else None
    if kind == "miou":
        stat = of_column_sums(functools.partial(stat, classes=int(record["classes"])))
    return ExampleData(indices, np.asarray(vals, dtype=np.float64).reshape(len(vals), -1), stat, strata)
