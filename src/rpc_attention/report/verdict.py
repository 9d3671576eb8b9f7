"""Verdict rule: turn a claim's baseline and RPC numbers (one per seed, and per-example records where
the suite keeps them) into "reproduced / contradicted / inconclusive / unresolved (one seed)". The rule
is stated in :data:`RULES_TEXT`, printed verbatim in every report, and is the only source of verdict
text (nothing is hand-written). The same rule decides every claim; there is no second rule.

Definitions, for one claim and one metric:
- ``delta`` = mean over the seeds both models have of (RPC - baseline), sign-flipped when lower is
  better, so delta > 0 always means "RPC better" (the paper's direction);
- ``margin`` = the smallest effect the claim is about (metric units; e.g. 1 accuracy point); for
  relative margins (perplexity) it is a fraction of the baseline mean;
- the seed interval, the paired t test and the Holm adjustment: :mod:`rpc_attention.report.intervals`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ..markdown import NOT_MEASURED
from .intervals import ALPHA, RESAMPLES

__all__ = ["REPRODUCED", "CONTRADICTED", "INCONCLUSIVE", "UNRESOLVED", "NOT_MEASURED", "VERDICTS", "Effect",
           "effect", "claim_verdict", "oriented", "RULES_TEXT"]

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive"
UNRESOLVED = "unresolved (one seed)"
VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNRESOLVED, NOT_MEASURED)

RULES_TEXT = f"""\
Verdicts are computed from the numbers by one fixed rule (never edited by hand), the same for every claim.
For each claim, RPC - baseline is taken per seed (the seeds both models have, paired), with the sign
flipped where lower is better, so that delta > 0 means RPC is better (the paper's direction); delta is the
mean of those per-seed differences; margin = the smallest effect the claim is about (shown in each table).
- Seed interval: the 95 % t interval of the per-seed differences (mean +- t_0.975,n-1 x sd / sqrt(n)).
- Example interval, where both models recorded per-example results (classification accuracy, corruption
  error and mCE, OOD AUPR, language-model perplexity): a paired bootstrap over test examples ({RESAMPLES}
  resamples of example indices, the same resample for both models and every seed, seeds pooled; OOD
  resamples in-distribution and OOD examples separately, perplexity resamples blocks of tokens) of the
  metric recomputed on the resample.
- p: the two-sided paired t test of the per-seed differences; p (Holm) adjusts it for the number of claims
  in this study (Holm's step-down method: the k-th smallest of m p-values is multiplied by m - k + 1, then
  made non-decreasing, capped at 1), so that the chance of calling any claim of the study reproduced or
  contradicted when none has an effect stays below {ALPHA:g}.
- **reproduced**: the seed interval and the example interval (where there is one) both lie above 0, delta
  is at least the margin, and p (Holm) < {ALPHA:g}; **contradicted**: the mirror (both intervals below 0,
  delta at most -margin, p (Holm) < {ALPHA:g}); otherwise **inconclusive**.
- One seed: **unresolved (one seed)** (a single run cannot separate an effect from run-to-run noise; the
  difference and its example interval are still reported). A number that was not measured (stage skipped
  or failed) gives **not measured**.
- Smallest resolvable difference: t_{{1 - {ALPHA:g}/(2m)}},n-1 x sd / sqrt(n), with m the number of claims in
  the study that have a p-value and sd the standard deviation of the per-seed differences: the smallest
  |delta| whose p stays below Holm's strictest threshold {ALPHA:g}/m, so an inconclusive verdict says how large
  an effect these seeds could have resolved (the rule also needs |delta| >= margin).
The paper's numbers are at ImageNet, WikiText-103 and ADE20K scale (docs/method.md#published-numbers): they
give the expected direction, never a target value."""


@dataclass
class Effect:
    n_baseline: int
    n_rpc: int
    baseline_mean: Optional[float]
    rpc_mean: Optional[float]
    baseline_std: Optional[float]
    rpc_std: Optional[float]
    delta: Optional[float]        # oriented: > 0 means RPC better
    raw_diff: Optional[float]     # mean(RPC) - mean(baseline), not oriented
    margin: Optional[float]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def mean_std(xs: Sequence[Optional[float]]) -> Tuple[int, Optional[float], Optional[float]]:
    """``(n, mean, sample std)`` of the finite values; std is None below two values, mean too at none."""
    xs = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return 0, None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return len(xs), m, None
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return len(xs), m, math.sqrt(var)


def effect(baseline: Sequence[float], rpc: Sequence[float], higher_is_better: bool = True,
           margin: float = 1.0, relative_margin: bool = False) -> Effect:
    """Each model's mean and std over its seeds, the oriented difference of the means and the margin in
    metric units (the table's description of the numbers; the verdict uses the paired differences)."""
    nb, mb, sb = mean_std(baseline or [])
    nr, mr, sr = mean_std(rpc or [])
    if nb == 0 or nr == 0:
        return Effect(nb, nr, mb, mr, sb, sr, None, None, None)
    raw = mr - mb
    m = abs(mb) * margin if relative_margin else margin
    return Effect(nb, nr, mb, mr, sb, sr, raw if higher_is_better else -raw, raw, m)


def oriented(ci: Optional[Dict[str, Any]], higher_is_better: bool) -> Optional[tuple]:
    """``(lo, hi)`` of an RPC - baseline interval with the sign flipped where lower is better, so
    values > 0 mean "RPC better"; None for no interval."""
    if not ci or ci.get("lo") is None or ci.get("hi") is None:
        return None
    return (ci["lo"], ci["hi"]) if higher_is_better else (-ci["hi"], -ci["lo"])


def _text(iv: Optional[tuple]) -> str:
    return "none" if iv is None else f"[{iv[0]:+.3g}, {iv[1]:+.3g}]"


def claim_verdict(cmp: Dict[str, Any], higher_is_better: bool, margin: Optional[float],
                  p_holm: Optional[float]) -> Dict[str, str]:
    """``{"verdict", "reason"}`` of one claim by :data:`RULES_TEXT`. ``cmp`` is
    :func:`~rpc_attention.report.intervals.paired_comparison`'s result (seeds, per-seed differences,
    ``seed_ci``, ``bootstrap``); ``p_holm`` the claim's Holm-adjusted p (None with fewer than 2 seeds)."""
    diffs = list((cmp.get("per_seed_diff") or {}).values())
    if not diffs or margin is None:
        return {"verdict": NOT_MEASURED, "reason": "no numbers for the baseline and/or the RPC model"}
    sign = 1.0 if higher_is_better else -1.0
    delta = sign * sum(diffs) / len(diffs)
    ex = oriented((cmp.get("bootstrap") or {}).get("pooled"), higher_is_better)
    ex_text = f", example interval {_text(ex)}" if ex else ""
    if len(diffs) < 2:
        return {"verdict": UNRESOLVED, "reason": f"one seed: delta {delta:+.3g}{ex_text}; no run-to-run noise "
                                                  f"figure, so no verdict"}
    seed = oriented(cmp.get("seed_ci"), higher_is_better)
    ivs = [iv for iv in (seed, ex) if iv is not None]
    facts = f"delta {delta:+.3g}, seed interval {_text(seed)}{ex_text}, p (Holm) {p_holm:.3g}, margin {margin:.3g}"
    significant = p_holm is not None and p_holm < ALPHA
    if all(lo > 0 for lo, _ in ivs) and delta >= margin and significant:
        return {"verdict": REPRODUCED, "reason": f"RPC better: {facts}"}
    if all(hi < 0 for _, hi in ivs) and delta <= -margin and significant:
        return {"verdict": CONTRADICTED, "reason": f"RPC worse: {facts}"}
    missing = [what for what, ok in (
        ("the intervals on one side of 0", all(lo > 0 for lo, _ in ivs) or all(hi < 0 for _, hi in ivs)),
        ("|delta| >= margin", abs(delta) >= margin), (f"p (Holm) < {ALPHA:g}", significant)) if not ok]
    return {"verdict": INCONCLUSIVE, "reason": f"{facts}; lacks {', '.join(missing)}"}
