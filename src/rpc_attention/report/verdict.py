"""Verdict rule: turn a claim's baseline and RPC numbers (one per seed, and per-example records where
the suite keeps them) into "reproduced / contradicted / equivalent / smaller than the paper's effect /
inconclusive / unresolved (one seed)". The rule
is stated in :data:`RULES_TEXT`, printed verbatim in every report, and is the only source of verdict
text (nothing is hand-written). The same rule decides every claim; there is no second rule.

Definitions, for one claim and one metric:
- ``delta`` = mean over the seeds both models have of (RPC - baseline), sign-flipped when lower is
  better, so delta > 0 always means "RPC better" (the paper's direction);
- ``margin`` = the smallest effect the claim is about (metric units; e.g. 1 accuracy point); for
  relative margins (perplexity) it is a fraction of the baseline mean;
- the one interval over seeds and examples, the example bootstrap: :mod:`rpc_attention.report.intervals`;
  the tests against the margin, Holm within a family and the power: :mod:`rpc_attention.report.power`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ..markdown import NOT_MEASURED
from .intervals import ALPHA, RESAMPLES

__all__ = ["REPRODUCED", "CONTRADICTED", "EQUIVALENT", "SMALLER", "INCONCLUSIVE", "UNRESOLVED", "NOT_MEASURED", "VERDICTS",
           "Effect", "effect", "claim_verdict", "oriented", "RULES_TEXT", "FAMILIES", "Family"]

REPRODUCED = "reproduced"
CONTRADICTED = "contradicted"
EQUIVALENT = "equivalent"
SMALLER = "smaller than the paper's effect"
INCONCLUSIVE = "inconclusive"
UNRESOLVED = "unresolved (one seed)"
VERDICTS = (REPRODUCED, CONTRADICTED, EQUIVALENT, SMALLER, INCONCLUSIVE, UNRESOLVED, NOT_MEASURED)


@dataclass(frozen=True)
class Family:
    """A pre-registered family of claims: Holm's adjustment runs within it, never across families."""

    name: str
    title: str      # as the report heads its table
    rule: str       # the family's rule, stated under its table
    paper: bool     # the paper's claims (True) or the library's own (False)


# The families, in report order. Which claim is in which family is study data (ClaimSpec.family).
FAMILIES = {f.name: f for f in (
    Family("paper", "The paper's claims, confirmatory (the scorecard)",
           f"confirmatory: Holm over this family at {ALPHA:g}; every claim's target, margin, seeds and test examples "
           "fixed in a plan committed before the run, on seeds no pilot used (docs/reproduce.md#the-paper-scorecard)",
           True),
    Family("pilot", "Pilot (sizes a plan; decides nothing)",
           "a pilot: margin 0, no target; its figures size a plan (`rpc-attention plan`), its verdicts decide nothing",
           True),
    Family("primary", "Primary: the paper's headline vision claims this study is powered for",
           f"confirmatory; Holm over this family at {ALPHA:g}; the seeds come from a power calculation on a pilot "
           "(docs/reproduce.md#deciding-claims)", True),
    Family("secondary", "Secondary: the paper's other claims (exploratory)",
           f"exploratory: Holm within this family at {ALPHA:g}, separately from the primary family; the study is "
           "not powered for these, so an inconclusive verdict here is expected and says little", True),
    Family("own", "The library's own claims (not the paper's)",
           f"Holm within this family at {ALPHA:g}: claims this library adds (robust PAP; RPC under sparse "
           "input corruption, synthetic key corruption and adversarial patches), kept apart from the paper's", False),
    Family("lm", "Language model",
           f"Holm within this family at {ALPHA:g} (the paper's language-model claims)", True),
)}

RULES_TEXT = f"""\
Verdicts are computed from the numbers by one fixed rule (never edited by hand), the same for every claim.
For each claim, RPC - baseline is taken per seed (the seeds both models have, paired), with the sign
flipped where lower is better, so that delta > 0 means RPC is better (the paper's direction); delta is the
mean of those per-seed differences; margin = the smallest effect the claim is about (shown in each table).
- Families: every claim belongs to one pre-registered family (each family's table states its rule); the
  p-values below are Holm-adjusted within the claim's family only.
- One interval for both variance sources: the training seeds, and the test examples every seed shares.
  se^2 = sd^2 / n + se_ex^2, with sd the sample sd of the n per-seed differences and se_ex the standard
  error of the paired example bootstrap (where both models recorded per-example results: {RESAMPLES}
  resamples of example indices, the same resample for both models and every seed, seeds pooled; OOD
  resamples in-distribution and OOD examples separately, perplexity resamples blocks of tokens, mCE
  recomputes the baseline's reference errors on each resample), read from the width of its 95 % percentile
  interval as (hi - lo) / (2 x 1.96); 0 where there are no per-example records. The interval is delta +-
  t_0.975,n-1 x se: on the seeds' n - 1 degrees of freedom, which holds whatever the ratio of the two parts
  (a Welch-Satterthwaite df, computed from the sample sd, makes a small-by-chance sd narrow the interval
  and raise its df at once: in simulation it called 13 % of null families instead of 5 %).
- p: the test of delta against the margin on that se and df, two-sided: twice the smaller of the
  one-sided p's of "delta > +margin" and "delta < -margin" (with margin 0 the ordinary two-sided test).
  p (Holm) adjusts it over the claims of the family (Holm's step-down method: the k-th smallest of m
  p-values is multiplied by m - k + 1, then made non-decreasing, capped at 1). p (Holm) < {ALPHA:g} is the
  same as Holm's adjusted interval lying past the margin: the interval's bound, not delta, decides.
- p (equivalence): two one-sided tests (TOST) that delta > -margin and delta < +margin (the larger of
  the two p's), Holm-adjusted within the family in the same way.
- p (smaller): where a plan gives the claim a target (the paper's effect in our units), the one-sided test
  that delta < target on the same se and df, Holm-adjusted over the family's claims that have a target.
- **reproduced**: p (Holm) < {ALPHA:g} with delta > 0; **contradicted**: p (Holm) < {ALPHA:g} with delta < 0;
  **equivalent** (a measured null: no effect beyond the margin either way): p (equivalence, Holm) <
  {ALPHA:g}; **smaller than the paper's effect** (the paper's effect excluded, no difference beyond the
  margin shown): p (smaller, Holm) < {ALPHA:g}; otherwise **inconclusive**. The precedence is that order:
  a difference beyond the margin first, then equivalence, then smaller (a contradicted or equivalent claim
  is smaller than the target too, and says more); a reproduced claim whose effect is also below the
  target says so in its reason.
- No noise figure at all (per-seed differences all equal and no example part) gives both p's = 1
  (inconclusive), never p = 0.
- One seed: **unresolved (one seed)** (a single run cannot separate an effect from run-to-run noise; the
  difference and its example interval are still reported). A number that was not measured (stage skipped
  or failed) gives **not measured**.
- Smallest resolvable difference (MDE): the effect that would be called reproduced with 80 % power at
  Holm's strictest per-test level {ALPHA:g}/m (m = claims of the family with a p), on this se and n - 1 df:
  margin + about (t_{{1 - {ALPHA:g}/(2m)}} + t_0.8) x se (solved exactly with the noncentral t
  distribution), so an inconclusive verdict says how large an effect the design could have resolved.
Why one interval that adds the two variances, and not a two-level bootstrap (seeds, then examples): with 3
seeds a seed bootstrap has 10 distinct resamples and its percentile interval is far too narrow, while the
t part is exact for normal per-seed differences at any n. The sum counts the examples' noise within each
seed twice (once in sd, once in se_ex), so it errs wide; a simulation of 10,000 or more studies with shared
test-set noise and skewed per-seed differences measures its family-wise error (docs/reproduce.md).
The paper's numbers are at ImageNet, WikiText-103 and ADE20K scale (docs/method.md#published-numbers): they
give the expected direction; a plan turns them into targets in our units by one stated rule."""


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


def _facts(delta: float, iv, ex_text: str, p_dir, p_tost, margin: float) -> str:
    p = "none (no noise figure)" if p_dir is None else f"{p_dir:.3g}"
    q = "" if p_tost is None else f", p (equivalence, Holm) {p_tost:.3g}"
    return (f"delta {delta:+.3g}, 95 % interval (seeds and examples) {_text(iv)}{ex_text}, p (Holm) {p}{q}, "
            f"margin {margin:.3g}")


def claim_verdict(cmp: Dict[str, Any], higher_is_better: bool, margin: Optional[float],
                  p_holm: Optional[float], p_tost_holm: Optional[float] = None,
                  p_smaller_holm: Optional[float] = None, target: Optional[float] = None) -> Dict[str, str]:
    """``{"verdict", "reason"}`` of one claim by :data:`RULES_TEXT`. ``cmp`` is
    :func:`~rpc_attention.report.intervals.paired_comparison`'s result (seeds, per-seed differences,
    ``bootstrap``) with the margin tests on the one interval (``tests``); ``p_holm`` the family's
    Holm-adjusted p of the test against the margin, ``p_tost_holm`` that of the equivalence test and
    ``p_smaller_holm`` that of the test against the claim's ``target`` (None with fewer than 2 seeds,
    without a noise figure, or, for the last, without a target)."""
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
    iv = oriented((cmp.get("tests") or {}).get("interval"), higher_is_better)
    facts = _facts(delta, iv, ex_text, p_holm, p_tost_holm, margin)
    smaller = p_smaller_holm is not None and p_smaller_holm < ALPHA
    if target is not None and p_smaller_holm is not None:
        facts += f", target {target:.3g}, p (smaller, Holm) {p_smaller_holm:.3g}"
    significant = p_holm is not None and p_holm < ALPHA
    if significant and delta > 0:
        also = "; smaller than the paper's effect too (its target excluded)" if smaller else ""
        return {"verdict": REPRODUCED, "reason": f"RPC better by more than the margin: {facts}{also}"}
    if significant and delta < 0:
        return {"verdict": CONTRADICTED, "reason": f"RPC worse by more than the margin: {facts}"}
    if p_tost_holm is not None and p_tost_holm < ALPHA:
        return {"verdict": EQUIVALENT, "reason": f"no effect beyond +-margin: {facts}"}
    if smaller:
        return {"verdict": SMALLER, "reason": f"the paper's effect (the target) is excluded, no difference beyond "
                                              f"the margin shown: {facts}"}
    if p_holm is None:
        return {"verdict": INCONCLUSIVE, "reason": f"{facts}; lacks a noise figure (no spread, no example part)"}
    return {"verdict": INCONCLUSIVE, "reason": f"{facts}; lacks p (Holm) < {ALPHA:g} for a difference, for "
                                               f"equivalence or for an effect below the target"}
