"""The decision rule of a family of claims on arrays, and the power of a design.

One claim has the per-seed differences ``d`` (oriented: > 0 means RPC better; n seeds, sample sd) and,
where the suite keeps per-example records, the standard error ``se_ex`` of the paired example bootstrap
(the test-set sampling that every seed shares). Its one interval covers both variance sources by adding
them (a variance decomposition), on the seeds' degrees of freedom:

    se^2 = sd^2 / n + se_ex^2,   df = n - 1

Why n - 1 and not a Welch-Satterthwaite df (which would count the well-estimated example part as extra
degrees of freedom): that df is computed from the sample sd, so a seed sd that is small by chance makes
the interval narrow *and* its df large at once. Simulated, it called 13 % of null families of 4 claims
at 3 seeds (normal seeds) instead of 5 %. The statistic's null distribution lies between t_{n-1} (no
example part) and the normal (example part only), and t_{n-1} has the heavier tails, so df = n - 1 is
the choice that holds whatever the ratio of the two parts. Against the claim's margin, with ``T`` a t
variable of df degrees of freedom:

- ``p_dir`` = min(1, 2 min(p_up, p_down)), p_up = P(T > (delta - margin) / se), p_down = P(T < (delta +
  margin) / se): RPC better (or worse) by more than the margin (margin 0: the ordinary two-sided test);
- ``p_tost`` = max(P(T > (delta + margin) / se), P(T < (delta - margin) / se)): two one-sided tests
  (TOST) that the effect lies inside +-margin;

- ``p_smaller`` = P(T < (delta - target) / se): one-sided, that the effect in the paper's direction is
  below the claim's ``target`` (the paper's effect in our units), so that the paper's effect is excluded;

each Holm-adjusted within the family. ``p_dir`` (Holm) < alpha is the same as Holm's (1 - alpha_k)
interval lying past the margin, so a claim is called reproduced on the interval's bound, never on the
point estimate. No spread at all (sd 0 and no example part) is no evidence: both p's are 1.

The sum double-counts one small part (the example noise of each seed, inside both sd and se_ex), so the
interval errs wide; the simulation tests measure its family-wise error with shared test-set noise and
skewed per-seed differences (tests/report/test_decision_simulation.py).

Power of one claim at Holm's first (strictest) step, per-test alpha / m: the noncentral-t probability
``P(T'(n - 1, (delta - margin) / se) > t_{1 - alpha/(2m), n - 1})`` (exact without an example part, a
lower bound with one). The minimum detectable effect
(MDE) is the delta at which that reaches 1 - beta: about ``margin + (t_{1 - alpha/(2m)} + t_{1 - beta})
se``. Holm's later steps test at larger alphas, so this is a lower bound on a claim's power within its
family.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

ALPHA = 0.05
POWER = 0.80
REPRODUCE, CONTRADICT, EQUIVALENT_CODE, SMALLER_CODE, UNDECIDED = 1, -1, 2, 3, 0


def combined_se(sd, n, se_examples=0.0):
    """``(se, df)`` (arrays, broadcast) of the mean of n per-seed differences of sample sd plus a shared
    example part of standard error ``se_examples``: se^2 = sd^2/n + se_ex^2 on df = n - 1 (see the
    module's docstring for why not more)."""
    sd, n, ex = (np.asarray(x, dtype=np.float64) for x in (sd, n, se_examples))
    se = np.sqrt(sd ** 2 / n + ex ** 2)
    return se, np.broadcast_to(n - 1.0, se.shape).copy()


def margin_pvalues(mean, se, df, margin):
    """``(p_dir, p_tost)`` (arrays, broadcast over the inputs) of an oriented mean with standard error se
    on df degrees of freedom, against +-margin; 1 where se is 0 (no noise figure)."""
    from scipy import stats

    mean, se, df, margin = (np.asarray(x, dtype=np.float64) for x in (mean, se, df, margin))
    spread = se > 0
    safe = np.where(spread, se, 1.0)
    t_up, t_dn = (mean - margin) / safe, (mean + margin) / safe
    p_dir = np.minimum(1.0, 2.0 * np.minimum(stats.t.sf(t_up, df), stats.t.cdf(t_dn, df)))
    p_tost = np.maximum(stats.t.sf(t_dn, df), stats.t.cdf(t_up, df))
    return np.where(spread, p_dir, 1.0), np.where(spread, p_tost, 1.0)


def smaller_pvalue(mean, se, df, target):
    """``p_smaller`` (arrays, broadcast): the one-sided p of "the oriented effect is below ``target``",
    P(T < (mean - target) / se) on df degrees of freedom; 1 where se is 0 (no noise figure) and NaN where
    the target is NaN (a claim without one takes no part in this test)."""
    from scipy import stats

    mean, se, df, target = (np.asarray(x, dtype=np.float64) for x in (mean, se, df, target))
    spread = se > 0
    p = stats.t.cdf((mean - target) / np.where(spread, se, 1.0), df)
    return np.where(np.isnan(target), np.nan, np.where(spread, p, 1.0))


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


def family_decisions(diffs, margin, se_examples=None, alpha: float = ALPHA, target=None):
    """The decision of every claim of a family: ``diffs`` ``(..., m, n)`` oriented per-seed differences,
    ``margin`` ``(m,)``, ``se_examples`` ``(..., m)`` the example standard errors (None: 0), ``target``
    ``(m,)`` the paper's effect in our units (None, or NaN for a claim: no "smaller" test); returns
    ``(..., m)`` codes: REPRODUCE (1), CONTRADICT (-1), EQUIVALENT_CODE (2), SMALLER_CODE (3) or
    UNDECIDED (0), in the rule's precedence (a difference beyond the margin, then equivalence, then
    smaller than the target). Vectorised over leading axes (simulated studies)."""
    d = np.asarray(diffs, dtype=np.float64)
    n = d.shape[-1]
    mean, sd = d.mean(axis=-1), d.std(axis=-1, ddof=1)
    se, df = combined_se(sd, n, 0.0 if se_examples is None else se_examples)
    p_dir, p_tost = margin_pvalues(mean, se, df, margin)
    h_dir, h_tost = holm_adjust(p_dir), holm_adjust(p_tost)
    if target is None:
        h_small = np.full(mean.shape, np.nan)
    else:
        h_small = holm_adjust(smaller_pvalue(mean, se, df, np.broadcast_to(np.asarray(target, float), mean.shape)))
    small = np.where(np.isnan(h_small), False, h_small < alpha)
    return np.where(h_dir < alpha, np.sign(mean).astype(int),
                    np.where(h_tost < alpha, EQUIVALENT_CODE, np.where(small, SMALLER_CODE, UNDECIDED)))


def power(delta: float, sd: float, n: int, margin: float = 0.0, alpha: float = ALPHA, family: int = 1,
          se_examples: float = 0.0) -> float:
    """Probability that a claim with true oriented effect ``delta`` is called reproduced at Holm's first
    step (per-test alpha / family), n seeds of per-seed difference sd and an example part of standard
    error ``se_examples`` (noncentral t on n - 1 df: exact without an example part, a lower bound with one)."""
    from scipy import stats

    if n < 2 or sd < 0 or not math.isfinite(sd):
        return float("nan")
    se, df = (float(x) for x in combined_se(sd, n, se_examples))
    if se <= 0:
        return float("nan")
    crit = stats.t.ppf(1.0 - alpha / (2 * family), df)
    return float(stats.nct.sf(crit, df, (delta - margin) / se))


def mde(sd: float, n: int, margin: float = 0.0, alpha: float = ALPHA, family: int = 1,
        target_power: float = POWER, se_examples: float = 0.0) -> Optional[float]:
    """The smallest oriented effect called reproduced with probability ``target_power`` (at Holm's
    first step), or None without a noise figure (n < 2, or neither spread nor an example part)."""
    from scipy import optimize

    if n < 2 or sd is None or not math.isfinite(sd) or sd < 0:
        return None
    se = float(combined_se(sd, n, se_examples)[0])
    if se <= 0:
        return None
    hi = margin + se
    while power(hi, sd, n, margin, alpha, family, se_examples) < target_power:
        hi = margin + 2 * (hi - margin)
    return float(optimize.brentq(lambda x: power(x, sd, n, margin, alpha, family, se_examples) - target_power,
                                 margin, hi, xtol=1e-10 * max(1.0, se)))


def seeds_needed(target: float, sd: float, margin: float = 0.0, alpha: float = ALPHA, family: int = 1,
                 target_power: float = POWER, max_seeds: int = 1000, se_examples: float = 0.0) -> Optional[int]:
    """The fewest seeds (>= 2) at which an effect ``target`` is called reproduced with probability
    ``target_power``; None when the target is not past the margin, there is no noise figure, or it is
    beyond ``max_seeds`` (the example part alone may already forbid it)."""
    if target <= margin or sd is None or sd < 0 or (sd == 0 and not se_examples):
        return None
    if power(target, 0.0 if sd == 0 else sd, max_seeds, margin, alpha, family, se_examples) < target_power:
        return None
    lo, hi = 2, max_seeds   # power rises with n: bisect for the first n that reaches it
    while lo < hi:
        mid = (lo + hi) // 2
        if power(target, sd, mid, margin, alpha, family, se_examples) >= target_power:
            hi = mid
        else:
            lo = mid + 1
    return lo
