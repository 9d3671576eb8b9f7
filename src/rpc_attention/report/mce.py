"""mCE per example with its reference recomputed on every bootstrap resample.

A model's mCE is ``100 x mean_c E_c / E^ref_c``, with ``E_c`` its error on corruption c (mean over
severities and examples) and ``E^ref_c`` the normalising model's (the baseline run of the same seed). A
bootstrap that keeps ``E^ref_c`` at its full-sample value leaves the baseline's own mCE off 100 in most
resamples; here both errors are taken on the resampled examples, so the baseline's mCE is exactly 100 in
each resample and the RPC model's is normalised by the baseline's errors on the same examples.

The values of one model are ``[own errors per setting | reference errors per setting]`` (``(n, 2K)``,
K = corruptions x severities); the statistic sums each half over the examples, groups the settings by
corruption and averages the ratios.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import numpy as np

from ..evaluate.per_example import ExampleData, decode_bits, decode_indices, of_column_sums


def mce_statistic(values: np.ndarray, strata: Optional[np.ndarray], groups: np.ndarray) -> np.ndarray:
    """``100 x mean_c (sum own errors of c) / (sum reference errors of c)`` of values ``(..., n, 2K)``;
    ``groups`` ``(K, C)`` one-hot: setting -> corruption."""
    k = groups.shape[0]
    own = values[..., :k].sum(axis=-2) @ groups
    ref = values[..., k:].sum(axis=-2) @ groups
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * (own / ref).mean(axis=-1)


def _errors(record: Mapping[str, Any], settings) -> Optional[np.ndarray]:
    correct = record.get("correct") or {}
    if any(s not in correct for s in settings):
        return None
    return 1.0 - np.stack([decode_bits(correct[s]) for s in settings], axis=1).astype(np.float64)


def mce_example_data(own: Optional[Mapping[str, Any]], reference: Optional[Mapping[str, Any]],
                     metric: str = "mCE") -> Optional[ExampleData]:
    """The :class:`ExampleData` of ``own``'s mCE with ``reference``'s errors recomputed per resample;
    None when either record lacks the metric's settings or the two hold different examples."""
    if not own or not reference or metric not in (own.get("metrics") or {}):
        return None
    settings = list(own["metrics"][metric]["settings"])
    own_idx, ref_idx = decode_indices(own["indices"]), decode_indices(reference["indices"])
    e_own, e_ref = _errors(own, settings), _errors(reference, settings)
    if e_own is None or e_ref is None or not np.array_equal(own_idx, ref_idx):
        return None
    names = list(dict.fromkeys(s.rsplit("@", 1)[0] for s in settings))
    groups = np.zeros((len(settings), len(names)))
    for i, s in enumerate(settings):
        groups[i, names.index(s.rsplit("@", 1)[0])] = 1.0
    stat = of_column_sums(functools.partial(mce_statistic, groups=groups))
    return ExampleData(own_idx, np.concatenate([e_own, e_ref], axis=1), stat)
