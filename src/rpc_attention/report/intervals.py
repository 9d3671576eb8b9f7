"""95 % intervals and tests for the difference RPC - baseline of one metric: paired by seed (the per-seed
differences, their t interval and paired t test), paired over test examples (a bootstrap that resamples
example indices, the same resample for both models, and recomputes the metric), and the rule's one
interval over both variance sources (:func:`margin_tests`: the seed variance over n plus the example
bootstrap's variance, the tests against the margin, Holm's adjustment across a family and the smallest
difference the design could resolve).

The bootstrap works on per-example records (``evaluate.per_example``): each model and seed gives an
:class:`~rpc_attention.evaluate.per_example.ExampleData` (example indices, one row of values per
example, the statistic that turns rows into the metric, optional strata). For accuracy the statistic
is the mean of 100 x correctness; for AUPR it is the average precision of the resampled scores (in-
distribution and OOD examples resampled separately); for perplexity exp(sum NLL / sum tokens) over
resampled blocks of tokens. With several seeds the bootstrap is pooled: each resample draws one set of
example positions, applies it to every seed, and averages the per-seed differences (examples are the
random unit, seeds are fixed).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .power import ALPHA, combined_se, holm_adjust, margin_pvalues, mde, smaller_pvalue

__all__ = ["LEVEL", "ALPHA", "RESAMPLES", "t_interval", "paired_t", "margin_tests", "holm", "min_detectable", "example_se",
           "paired_bootstrap", "paired_comparison"]

LEVEL = 0.95
RESAMPLES = 2000
_CHUNK = 100  # resamples drawn at once (memory: _CHUNK x examples indices)


def _diffs(diffs: Sequence[float]) -> np.ndarray:
    return np.asarray([float(x) for x in diffs], dtype=np.float64)


def t_interval(diffs: Sequence[float], level: float = LEVEL) -> Optional[Dict[str, Any]]:
    """``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)`` of paired differences (sample sd, ddof=1);
    None with fewer than 2 differences."""
    from scipy import stats

    d = _diffs(diffs)
    if len(d) < 2:
        return None
    mean = float(d.mean())
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1)) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return {"diff": mean, "lo": mean - half, "hi": mean + half, "n": int(len(d)), "level": level}


def paired_t(diffs: Sequence[float]) -> Optional[Dict[str, Any]]:
    """Two-sided paired t test of mean(diffs) = 0: ``{"t", "df", "p"}``; None with fewer than 2
    differences. Differences without spread have no noise figure: t and p are None (never p = 0)."""
    from scipy import stats

    d = _diffs(diffs)
    if len(d) < 2:
        return None
    mean, sd, df = float(d.mean()), float(d.std(ddof=1)), len(d) - 1
    if sd == 0.0:
        return {"t": None, "df": df, "p": None, "no_spread": True}
    t = mean / (sd / math.sqrt(len(d)))
    return {"t": t, "df": df, "p": float(2.0 * stats.t.sf(abs(t), df))}


def holm(pvalues: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Holm's step-down adjusted p-values (:func:`~rpc_attention.report.power.holm_adjust`), in the order
    given; None stays None and is not counted."""
    p = np.array([np.nan if v is None else float(v) for v in pvalues], dtype=np.float64)
    return [None if v is None else float(a) for v, a in zip(pvalues, holm_adjust(p))]


def example_se(pooled: Optional[Dict[str, Any]], level: float = LEVEL) -> float:
    """The standard error of the example part: the width of the pooled paired bootstrap's percentile interval
    read as normal, (hi - lo) / (2 z_{(1+level)/2}); 0 without one. Computed from the stored interval, so
    a published study's verdicts recompute from its results alone."""
    from scipy import stats

    if not pooled or pooled.get("lo") is None or pooled.get("hi") is None:
        return 0.0
    return (float(pooled["hi"]) - float(pooled["lo"])) / (2.0 * float(stats.norm.ppf(0.5 + level / 2)))


def margin_tests(diffs: Sequence[float], margin: float, higher_is_better: bool = True,
                 se_examples: float = 0.0, level: float = LEVEL,
                 target: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """The rule's two tests of RPC - baseline per-seed differences against +-margin on the one interval over
    seeds and examples (:func:`~rpc_attention.report.power.combined_se`,
    :func:`~rpc_attention.report.power.margin_pvalues`, oriented so that > 0 means RPC better):
    ``{"p", "p_equivalence", "p_smaller", "no_spread", "se", "df", "interval"}`` (``interval``: the
    ``level`` interval of the mean difference, not oriented; ``p_smaller``: the one-sided test that the
    oriented effect is below ``target``, :func:`~rpc_attention.report.power.smaller_pvalue`, None without a
    target); p's None without any noise figure; None with fewer than 2 differences."""
    from scipy import stats

    d = _diffs(diffs) * (1.0 if higher_is_better else -1.0)
    if len(d) < 2:
        return None
    sd = float(d.std(ddof=1))
    se, df = (float(x) for x in combined_se(sd, len(d), se_examples))
    if se == 0.0:
        return {"p": None, "p_equivalence": None, "p_smaller": None, "no_spread": True, "se": 0.0, "df": None,
                "interval": None}
    p_dir, p_tost = margin_pvalues(float(d.mean()), se, df, margin)
    p_small = None if target is None else float(smaller_pvalue(float(d.mean()), se, df, float(target)))
    raw = float(d.mean()) * (1.0 if higher_is_better else -1.0)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"p": float(p_dir), "p_equivalence": float(p_tost), "p_smaller": p_small, "no_spread": False, "se": se,
            "df": df, "se_seeds": sd / math.sqrt(len(d)), "se_examples": float(se_examples),
            "interval": {"diff": raw, "lo": raw - half, "hi": raw + half, "level": level}}


def min_detectable(diffs: Sequence[float], family: int, margin: float = 0.0, alpha: float = ALPHA,
                   se_examples: float = 0.0) -> Optional[float]:
    """The effect these per-seed differences' spread and the example part would call reproduced with 80 %
    power at Holm's strictest threshold alpha / family (:func:`~rpc_attention.report.power.mde`); None
    with fewer than 2 differences, no noise figure or an empty family."""
    d = _diffs(diffs)
    if len(d) < 2 or family < 1:
        return None
    return mde(float(d.std(ddof=1)), len(d), margin, alpha, family, se_examples=se_examples)


def _mean_statistic(values: np.ndarray, strata: Optional[np.ndarray]) -> np.ndarray:
    return values[..., 0].mean(axis=-1)


def _draw(rng: np.random.Generator, count: int, n: int, strata: Optional[np.ndarray]) -> np.ndarray:
    """``count`` rows of ``n`` example positions drawn with replacement (within each stratum)."""
    if strata is None:
        return rng.integers(0, n, size=(count, n))
    parts = []
    for g in np.unique(strata):
        pos = np.flatnonzero(strata == g)
        parts.append(pos[rng.integers(0, len(pos), size=(count, len(pos)))])
    return np.concatenate(parts, axis=1)


def _draw_counts(idx: np.ndarray, n: int) -> np.ndarray:
    """How often each of the ``n`` examples was drawn in each row of ``idx`` ``(count, n)``: ``(count, n)``.
    ``counts @ values`` is the column sums of ``values[idx]``, without the ``(count, n, k)`` gather (the
    same sums exactly for the integer counts the statistics of column sums read)."""
    count = idx.shape[0]
    flat = (np.arange(count)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=count * n).reshape(count, n).astype(np.float64)


def _as_rows(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return a[:, None] if a.ndim == 1 else a


def paired_bootstrap(baseline: Sequence[np.ndarray], rpc: Sequence[np.ndarray], resamples: int = RESAMPLES,
                     seed: int = 0, level: float = LEVEL, statistic=None,
                     strata: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """Percentile interval of statistic(rpc) - statistic(baseline) over resampled examples (averaged
    over seeds when several pairs are given). ``baseline[s]`` and ``rpc[s]`` hold the per-example values
    (``(n,)`` or ``(n, k)``) of seed ``s`` on the same examples in the same order; ``statistic`` maps
    values ``(..., n, k)`` and strata ``(..., n)`` to the metric ``(...)`` (default: the mean of column 0);
    ``strata`` (``(n,)``) makes each resample keep every stratum's size."""
    if not baseline or len(baseline) != len(rpc):
        raise ValueError("paired_bootstrap needs one baseline and one RPC value array per seed")
    base = [_as_rows(b) for b in baseline]
    rp = [_as_rows(r) for r in rpc]
    sizes = {len(a) for a in base + rp} | ({len(strata)} if strata is not None else set())
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"paired_bootstrap: every seed and model needs the same examples, got sizes {sorted(sizes)}")
    stat = statistic or _mean_statistic
    strata = None if strata is None else np.asarray(strata)
    n = sizes.pop()
    diff = float(np.mean([stat(r, strata) - stat(b, strata) for b, r in zip(base, rp)]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = float(np.mean([stat(r, strata) / stat(b, strata) for b, r in zip(base, rp)]))
    rng = np.random.default_rng(seed)
    column_sums = getattr(stat, "column_sums", False)
    boot, boot_ratio = [], []
    for start in range(0, int(resamples), _CHUNK):
        idx = _draw(rng, min(_CHUNK, int(resamples) - start), n, strata)
        if column_sums:  # a statistic of the column sums (evaluate.per_example.of_column_sums)
            counts, st = _draw_counts(idx, n), None
            pairs = [(stat((counts @ b)[:, None, :], st), stat((counts @ r)[:, None, :], st)) for b, r in zip(base, rp)]
        else:
            st = None if strata is None else strata[idx]
            pairs = [(stat(b[idx], st), stat(r[idx], st)) for b, r in zip(base, rp)]
        boot.append(np.mean([sr - sb for sb, sr in pairs], axis=0))
        with np.errstate(divide="ignore", invalid="ignore"):
            boot_ratio.append(np.mean([sr / sb for sb, sr in pairs], axis=0))
    q = [0.5 - level / 2, 0.5 + level / 2]
    lo, hi = np.quantile(np.concatenate(boot), q)
    # the ratio RPC / baseline of the metric (the perplexity ratio for language models), the same resamples;
    # None where a resample's baseline metric is 0
    ratios = np.concatenate(boot_ratio)
    rlo, rhi = (float(x) for x in np.quantile(ratios, q)) if np.isfinite(ratios).all() else (None, None)
    return {"diff": diff, "lo": float(lo), "hi": float(hi), "ratio": ratio if math.isfinite(ratio) else None,
            "ratio_lo": rlo, "ratio_hi": rhi, "n_examples": int(n), "n_seeds": len(base),
            "resamples": int(resamples), "seed": int(seed), "level": level}


def _aligned(b, r):
    """The two models' values (and strata) on the examples both were evaluated on, in index order."""
    common, b_at, r_at = np.intersect1d(b.indices, r.indices, assume_unique=True, return_indices=True)
    if len(common) == 0:
        raise ValueError("the two models were evaluated on disjoint examples")
    strata = None if b.strata is None else np.asarray(b.strata)[b_at]
    return common, _as_rows(b.values)[b_at], _as_rows(r.values)[r_at], strata


def _bootstraps(base_scores: Mapping[str, Any], rpc_scores: Mapping[str, Any], seeds: List[str],
                resamples: int, seed: int) -> Dict[str, Any]:
    pairs = {s: _aligned(base_scores[s], rpc_scores[s]) for s in seeds}
    stat = base_scores[seeds[0]].statistic
    per_seed = {s: paired_bootstrap([b], [r], resamples, seed, statistic=stat, strata=st)
                for s, (_, b, r, st) in pairs.items()}
    same = len({tuple(ix) for ix, _, _, _ in pairs.values()}) == 1
    pooled = None
    if same:
        st = next(iter(pairs.values()))[3]
        pooled = paired_bootstrap([b for _, b, _, _ in pairs.values()], [r for _, _, r, _ in pairs.values()],
                                  resamples, seed, statistic=stat, strata=st)
    return {"per_seed": per_seed, "pooled": pooled}


def paired_comparison(base_values: Mapping[str, float], rpc_values: Mapping[str, float],
                      base_scores: Mapping[str, Any], rpc_scores: Mapping[str, Any],
                      resamples: int = RESAMPLES, seed: int = 0) -> Dict[str, Any]:
    """RPC - baseline for one metric: the seeds both models have, the per-seed differences, the t
    interval over them (``seed_ci``) and the paired t test (``t_test``), both None with one seed, and,
    where both models have per-example data (``{seed: ExampleData}``) for those seeds, the paired
    bootstrap per seed and pooled (``bootstrap``, None without per-example data)."""
    seeds = [s for s in base_values if s in rpc_values]
    diffs = [rpc_values[s] - base_values[s] for s in seeds]
    out: Dict[str, Any] = {"seeds": seeds, "per_seed_diff": dict(zip(seeds, diffs)), "seed_ci": t_interval(diffs),
                           "t_test": paired_t(diffs), "bootstrap": None}
    scored = [s for s in seeds if s in base_scores and s in rpc_scores]
    if scored and len(scored) == len(seeds):
        out["bootstrap"] = _bootstraps(base_scores, rpc_scores, scored, resamples, seed)
    return out
