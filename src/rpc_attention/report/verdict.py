"""Verdict rules: turn baseline and RPC numbers (one per seed) into "reproduced / not reproduced /
inconclusive at this scale". The rules are stated in :data:`RULES_TEXT`, printed verbatim in every
report, and are the only source of verdict text (nothing is hand-written).

Definitions, for one claim and one metric:
- ``delta`` = mean(RPC) - mean(baseline), sign-flipped when lower is better, so delta > 0 always means
  "RPC better" (the paper's direction);
- ``sigma`` = the larger of the two models' across-seed standard deviations (sample std, ddof=1);
- ``margin`` = the smallest effect the claim is about (metric units; e.g. 1 accuracy point); for
  relative margins (perplexity) it is a fraction of the baseline mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from ..markdown import NOT_MEASURED
from .intervals import RESAMPLES

__all__ = ["REPRODUCED", "NOT_REPRODUCED", "INCONCLUSIVE", "NOT_MEASURED", "Effect", "effect", "verdict",
           "interval_verdict", "oriented", "RULES_TEXT", "SINGLE_SEED_FACTOR"]

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive at this scale"

# With one seed there is no noise estimate: RPC counts as clearly worse only if it trails by more than
# SINGLE_SEED_FACTOR x margin.
SINGLE_SEED_FACTOR = 2.0

RULES_TEXT = f"""\
Verdicts are computed from the numbers by fixed rules (never edited by hand). For each claim,
delta = mean(RPC) - mean(baseline), with the sign flipped where lower is better (delta > 0 means RPC is
better, the paper's direction); sigma = the larger of the two models' standard deviations across seeds;
margin = the smallest effect that matters for that metric (shown in each table).
- Several seeds per model: **reproduced** if delta > 2 sigma; **not reproduced** if delta < -2 sigma
  (RPC worse beyond seed noise), or if |delta| <= 2 sigma while 2 sigma < margin (the seeds are precise
  enough to see an effect of the margin's size, and none is there); otherwise **inconclusive at this scale**.
- One seed: **not reproduced** if RPC is worse by more than {SINGLE_SEED_FACTOR:g} x margin; otherwise
  **inconclusive at this scale** (a single run cannot separate an effect from seed noise; the direction is
  still reported).
- A number that was not measured (stage skipped or failed) gives **not measured**.
Where both models recorded which test examples they got right (the classification suites do), the
rules above are replaced by 95 % intervals for the difference RPC - baseline, oriented as delta: the
seed interval (a t interval over the per-seed differences, seeds paired; needs >= 2 seeds) and the
example interval (a paired bootstrap over test examples, {RESAMPLES} resamples of example indices, the same
resample for both models and every seed, seeds pooled).
- Several seeds: **reproduced** if both intervals lie above 0 (RPC better); **not reproduced** if both
  lie below 0 (RPC worse), or if both lie inside (-margin, +margin) (precise enough to see an effect of
  the margin's size, and none is there); otherwise **inconclusive at this scale**.
- One seed (no seed interval): **not reproduced** if the example interval lies below -margin (RPC worse
  by more than the margin even at the interval's edge); otherwise **inconclusive at this scale** (the
  example interval says nothing about seed noise).
The paper's numbers are at ImageNet, WikiText-103 and ADE20K scale (docs/method.md#published-numbers): they give the expected direction, never a target value."""


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
    sigma: Optional[float]        # max across-seed std, None with a single seed
    margin: Optional[float]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _mean_std(xs: Sequence[float]):
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
    nb, mb, sb = _mean_std(baseline or [])
    nr, mr, sr = _mean_std(rpc or [])
    if nb == 0 or nr == 0:
        return Effect(nb, nr, mb, mr, sb, sr, None, None, None, None)
    raw = mr - mb
    delta = raw if higher_is_better else -raw
    m = abs(mb) * margin if relative_margin else margin
    sigma = max(sb, sr) if (sb is not None and sr is not None) else None
    return Effect(nb, nr, mb, mr, sb, sr, delta, raw, sigma, m)


def verdict(baseline: Sequence[float], rpc: Sequence[float], higher_is_better: bool = True,
            margin: float = 1.0, relative_margin: bool = False) -> dict:
    """``{"verdict": ..., "reason": one sentence, "effect": Effect.as_dict()}`` following RULES_TEXT."""
    e = effect(baseline, rpc, higher_is_better, margin, relative_margin)
    if e.delta is None:
        return {"verdict": NOT_MEASURED, "reason": "no numbers for the baseline and/or the RPC model",
                "effect": e.as_dict()}
    d, m = e.delta, e.margin
    direction = "better" if d > 0 else ("worse" if d < 0 else "equal")
    if e.sigma is not None:
        two = 2 * e.sigma
        if d > two:
            v, why = REPRODUCED, f"RPC is better by {d:.3g}, more than 2 sigma = {two:.3g} across seeds"
        elif d < -two:
            v, why = NOT_REPRODUCED, f"RPC is worse by {-d:.3g}, more than 2 sigma = {two:.3g} across seeds"
        elif two < m:
            v, why = NOT_REPRODUCED, (f"difference {d:+.3g} is within 2 sigma = {two:.3g}, which is below the "
                                      f"margin {m:.3g}: no effect of the claimed size")
        else:
            v, why = INCONCLUSIVE, (f"difference {d:+.3g} (RPC {direction}) is within 2 sigma = {two:.3g}; "
                                    f"seed noise is too large to resolve an effect of {m:.3g}")
    else:
        lim = SINGLE_SEED_FACTOR * m
        if d < -lim:
            v, why = NOT_REPRODUCED, f"single seed: RPC is worse by {-d:.3g}, more than {SINGLE_SEED_FACTOR:g} x margin = {lim:.3g}"
        else:
            v, why = INCONCLUSIVE, f"single seed: RPC is {direction} by {abs(d):.3g}; no noise estimate"
    return {"verdict": v, "reason": why, "effect": e.as_dict()}


def oriented(ci: Optional[Dict[str, Any]], higher_is_better: bool) -> Optional[tuple]:
    """``(lo, hi)`` of an RPC - baseline interval with the sign flipped where lower is better, so
    values > 0 mean "RPC better"; None for no interval."""
    if not ci or ci.get("lo") is None or ci.get("hi") is None:
        return None
    return (ci["lo"], ci["hi"]) if higher_is_better else (-ci["hi"], -ci["lo"])


def interval_verdict(seed_ci: Optional[Dict[str, Any]], example_ci: Dict[str, Any], higher_is_better: bool,
                     margin: float) -> Dict[str, str]:
    """``{"verdict", "reason"}`` from the seed and example intervals of RPC - baseline (RULES_TEXT)."""
    ex = oriented(example_ci, higher_is_better)
    seed = oriented(seed_ci, higher_is_better)
    text = lambda iv: f"[{iv[0]:+.3g}, {iv[1]:+.3g}]"  # noqa: E731
    if seed is None:
        if ex[1] < -margin:
            return {"verdict": NOT_REPRODUCED, "reason": f"single seed: RPC is worse, example interval {text(ex)} "
                                                         f"lies below -margin = {-margin:.3g}"}
        return {"verdict": INCONCLUSIVE, "reason": f"single seed: example interval {text(ex)}; no seed interval"}
    both = f"seed interval {text(seed)}, example interval {text(ex)}"
    if seed[0] > 0 and ex[0] > 0:
        return {"verdict": REPRODUCED, "reason": f"RPC is better: {both} both above 0"}
    if seed[1] < 0 and ex[1] < 0:
        return {"verdict": NOT_REPRODUCED, "reason": f"RPC is worse: {both} both below 0"}
    if all(-margin < x < margin for x in seed + ex):
        return {"verdict": NOT_REPRODUCED, "reason": f"no effect of the claimed size: {both} both inside "
                                                     f"+-margin = {margin:.3g}"}
    return {"verdict": INCONCLUSIVE, "reason": f"{both}: not both on one side of 0"}
