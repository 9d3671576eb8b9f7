"""95 % intervals for the difference RPC - baseline of one metric: paired by seed (a t interval over
the per-seed differences) and paired over test examples (a bootstrap that resamples example indices,
the same resample for both models).

The bootstrap works on per-example scores (``evaluate.per_example``): for accuracy, 100 x the share
of a metric's settings at which the example was classified correctly, so the mean over examples is
the metric itself. With several seeds it is pooled: each resample draws one set of example positions,
applies it to every seed, and averages the per-seed differences (examples are the random unit, seeds
are fixed), which is the mean over seeds of the per-seed bootstrap statistic.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["LEVEL", "RESAMPLES", "t_interval", "paired_bootstrap", "paired_comparison"]

LEVEL = 0.95
RESAMPLES = 2000
_CHUNK = 100  # resamples drawn at once (memory: _CHUNK x examples indices)


def t_interval(diffs: Sequence[float], level: float = LEVEL) -> Optional[Dict[str, Any]]:
    """``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)`` of paired differences (sample sd, ddof=1);
    None with fewer than 2 differences."""
    from scipy import stats

    d = np.asarray([float(x) for x in diffs], dtype=np.float64)
    if len(d) < 2:
        return None
    mean = float(d.mean())
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1)) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return {"diff": mean, "lo": mean - half, "hi": mean + half, "n": int(len(d)), "level": level}


def paired_bootstrap(baseline: Sequence[np.ndarray], rpc: Sequence[np.ndarray], resamples: int = RESAMPLES,
                     seed: int = 0, level: float = LEVEL) -> Dict[str, Any]:
    """Percentile interval of mean(rpc - baseline) over examples (averaged over seeds when several
    pairs are given). ``baseline[s]`` and ``rpc[s]`` hold the per-example scores of seed ``s`` on the
    same examples in the same order; every seed must have the same number of examples."""
    if not baseline or len(baseline) != len(rpc):
        raise ValueError("paired_bootstrap needs one baseline and one RPC score array per seed")
    diffs = [np.asarray(r, dtype=np.float64) - np.asarray(b, dtype=np.float64) for b, r in zip(baseline, rpc)]
    sizes = {len(d) for d in diffs} | {len(b) for b in baseline}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"paired_bootstrap: every seed and model needs the same examples, got sizes {sorted(sizes)}")
    per_example = np.mean(np.stack(diffs), axis=0)  # the same draw for every seed: average seeds first
    n = len(per_example)
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, int(resamples), _CHUNK):
        idx = rng.integers(0, n, size=(min(_CHUNK, int(resamples) - start), n))
        stats.append(per_example[idx].mean(axis=1))
    boot = np.concatenate(stats)
    lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
    return {"diff": float(per_example.mean()), "lo": float(lo), "hi": float(hi), "n_examples": int(n),
            "n_seeds": len(diffs), "resamples": int(resamples), "seed": int(seed), "level": level}


def _aligned(b: Tuple[np.ndarray, np.ndarray], r: Tuple[np.ndarray, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """The two models' scores on the examples both were evaluated on, in index order."""
    (bi, bs), (ri, rs) = b, r
    common, b_at, r_at = np.intersect1d(bi, ri, assume_unique=True, return_indices=True)
    if len(common) == 0:
        raise ValueError("the two models were evaluated on disjoint examples")
    return bs[b_at], rs[r_at]


def paired_comparison(base_values: Mapping[str, float], rpc_values: Mapping[str, float],
                      base_scores: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                      rpc_scores: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                      resamples: int = RESAMPLES, seed: int = 0) -> Dict[str, Any]:
    """RPC - baseline for one metric: the seeds both models have, the t interval over their
    per-seed metric differences (``seed_ci``, None with one seed) and, where both models have
    per-example scores ``{seed: (indices, scores)}`` for those seeds, the paired bootstrap per seed and
    pooled (``bootstrap``, None without per-example data)."""
    seeds = [s for s in base_values if s in rpc_values]
    out: Dict[str, Any] = {"seeds": seeds, "per_seed_diff": {s: rpc_values[s] - base_values[s] for s in seeds},
                           "seed_ci": t_interval([rpc_values[s] - base_values[s] for s in seeds]),
                           "bootstrap": None}
    scored = [s for s in seeds if s in base_scores and s in rpc_scores]
    if not scored or len(scored) != len(seeds):
        return out
    pairs = {s: _aligned(base_scores[s], rpc_scores[s]) for s in scored}
    per_seed = {s: paired_bootstrap([b], [r], resamples, seed) for s, (b, r) in pairs.items()}
    if len({len(b) for b, _ in pairs.values()}) == 1:
        pooled = paired_bootstrap([b for b, _ in pairs.values()], [r for _, r in pairs.values()], resamples, seed)
    else:
        pooled = None
    out["bootstrap"] = {"per_seed": per_seed, "pooled": pooled}
    return out
