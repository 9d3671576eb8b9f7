"""The decision rule of a family of claims on arrays, and the power of a design.

One family of m claims, each with the per-seed differences ``d`` (oriented: > 0 means RPC better) and a
margin: two one-sided tests of the mean of ``d`` against the margin,

- ``p_dir`` = min(1, 2 min(p_up, p_down)), with p_up the one-sided p of "delta > +margin" and p_down that
  of "delta < -margin" (with margin 0 this is the ordinary two-sided paired t test);
- ``p_tost`` = max of the one-sided p's of "delta > -margin" and "delta < +margin" (two one-sided tests,
  TOST: the effect lies inside +-margin);

both Holm-adjusted within the family. ``p_dir`` (Holm) < alpha is the same as "Holm's (1 - alpha_k)
t interval lies past the margin", so a claim is called reproduced on the interval's bound, never on the
point estimate. Zero spread of the per-seed differences is no evidence: both p's are 1 there (a t test
needs a noise figure; n equal differences are not an infinitely precise one).

Power of one claim at Holm's first (strictest) step, per-test alpha / m: with n seeds and sd of the
per-seed differences, the probability that ``p_dir`` falls below alpha / m at a true effect delta is the
exact noncentral-t probability ``P(T'(n - 1, (delta - margin) sqrt(n) / sd) > t_{1 - alpha/(2m), n-1})``.
The minimum detectable effect (MDE) is the delta at which that reaches 1 - beta: about
``margin + (t_{1 - alpha/(2m), n-1} + t_{1 - beta, n-1}) sd / sqrt(n)`` (the normal-shift approximation; we
solve the noncentral-t equation exactly). Holm's later steps test at larger alphas, so this is a lower
bound on a claim's power within its family.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

ALPHA = 0.05
POWER = 0.80
REPRODUCE, CONTRADICT, EQUIVALENT_CODE, UNDECIDED = 1, -1, 2, 0


def margin_pvalues(mean, sd, n, margin):
    """``(p_dir, p_tost)`` (arrays, broadcast over the inputs) of the mean of n oriented per-seed
    differences with sample sd, against +-margin; 1 where sd is 0 (no noise figure). n >= 2."""
    from scipy import stats

    mean, sd, n, margin = (np.asarray(x, dtype=np.float64) for x in (mean, sd, n, margin))
    df = n - 1.0
    se = sd / np.sqrt(n)
    spread = se > 0
    safe = np.where(spread, se, 1.0)
    t_up, t_dn = (mean - margin) / safe, (mean + margin) / safe
    p_dir = np.minimum(1.0, 2.0 * np.minimum(stats.t.sf(t_up, df), stats.t.cdf(t_dn, df)))
    p_tost = np.maximum(stats.t.sf(t_dn, df), stats.t.cdf(t_up, df))
    return np.where(spread, p_dir, 1.0), np.where(spread, p_tost, 1.0)


def holm_adjust(p):
    """Holm's step-down adjusted p-values along the last axis (NaN = no p, not counted): the k-th
    smallest of m p-values becomes max over j <= k of min(1, (m - j + 1) p_(j))."""
    p = np.asarray(p, dtype=np.float64)
    present = ~np.isnan(p)
    m = present.sum(axis=-1, keepdims=True)
    order = np.argsort(np.where(present, p, np.inf), axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1)
    scaled = np.minimum(1.0, (m - np.arange(p.shape[-1])) * ranked)
    adjusted = np.maximum.accumulate(np.where(np.isnan(scaled), -np.inf, scaled), axis=-1)
    out = np.empty_like(p)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return np.where(present, out, np.nan)


def family_decisions(diffs, margin, alpha: float = ALPHA):
    """The seed-level decision of every claim of a family: ``diffs`` ``(..., m, n)`` oriented per-seed
    differences, ``margin`` ``(m,)``; returns ``(...,m)`` codes: REPRODUCE (1), CONTRADICT (-1),
    EQUIVALENT_CODE (2) or UNDECIDED (0). Vectorised over leading axes (simulated studies)."""
    d = np.asarray(diffs, dtype=np.float64)
    n = d.shape[-1]
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    p_dir, p_tost = margin_pvalues(mean, sd, n, margin)
    h_dir, h_tost = holm_adjust(p_dir), holm_adjust(p_tost)
    return np.where(h_dir < alpha, np.sign(mean).astype(int),
                    np.where(h_tost < alpha, EQUIVALENT_CODE, UNDECIDED))


def power(delta: float, sd: float, n: int, margin: float = 0.0, alpha: float = ALPHA, family: int = 1) -> float:
    """Probability that a claim with true oriented effect ``delta`` is called reproduced at Holm's first
    step (per-test alpha / family), n seeds, per-seed difference sd (exact noncentral t)."""
    from scipy import stats

    if n < 2 or sd <= 0:
        return float("nan")
    df = n - 1
    crit = stats.t.ppf(1.0 - alpha / (2 * family), df)
    return float(stats.nct.sf(crit, df, (delta - margin) * math.sqrt(n) / sd))


def mde(sd: float, n: int, margin: float = 0.0, alpha: float = ALPHA, family: int = 1,
        target_power: float = POWER) -> Optional[float]:
    """The smallest oriented effect called reproduced with probability ``target_power`` (at Holm's
    first step), or None without a noise figure (n < 2 or sd 0)."""
    from scipy import optimize

    if n < 2 or not sd or sd <= 0 or not math.isfinite(sd):
        return None
    hi = margin + sd
    while power(hi, sd, n, margin, alpha, family) < target_power:
        hi = margin + 2 * (hi - margin)
    return float(optimize.brentq(lambda x: power(x, sd, n, margin, alpha, family) - target_power, margin, hi,
                                 xtol=1e-10 * max(1.0, sd)))


def seeds_needed(target: float, sd: float, margin: float = 0.0, alpha: float = ALPHA, family: int = 1,
                 target_power: float = POWER, max_seeds: int = 1000) -> Optional[int]:
    """The fewest seeds (>= 2) at which an effect ``target`` is called reproduced with probability
    ``target_power``; None when the target is not past the margin, sd unknown, or beyond ``max_seeds``."""
    if target <= margin or not sd or sd <= 0:
        return None
    for n in range(2, max_seeds + 1):
        if power(target, sd, n, margin, alpha, family) >= target_power:
            return n
    return None


def _z(p: float) -> float:
    from scipy import stats

    return float(stats.norm.ppf(p))


def example_mde(lo: float, hi: float, margin: float = 0.0, level: float = 0.95,
                target_power: float = POWER) -> float:
    """The smallest effect whose example interval (a ``level`` bootstrap interval of width ``hi - lo``,
    read as normal) lies past the margin with probability ``target_power``."""
    se = (hi - lo) / (2.0 * _z(0.5 + level / 2))
    return margin + (_z(0.5 + level / 2) + _z(target_power)) * se


def examples_needed(lo: float, hi: float, n_examples: int, target: float, margin: float = 0.0,
                    level: float = 0.95, target_power: float = POWER) -> Optional[int]:
    """Test examples the example interval needs for ``target`` at ``target_power`` (the interval's
    width scales as 1 / sqrt(examples)); None when the target is not past the margin."""
    if target <= margin:
        return None
    se = (hi - lo) / (2.0 * _z(0.5 + level / 2))
    need = n_examples * ((_z(0.5 + level / 2) + _z(target_power)) * se / (target - margin)) ** 2
    return max(1, int(math.ceil(need)))
