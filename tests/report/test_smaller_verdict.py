"""The fifth verdict, "smaller than the paper's effect": the one-sided test that the effect is below the claim's
target, Holm-adjusted within the family, in the rule's precedence (a difference beyond the margin, then
equivalence, then smaller), and only where a plan registered it."""

import math

import numpy as np
import pytest
from scipy import stats

from rpc_attention.report.intervals import holm, margin_tests
from rpc_attention.report.power import (
    CONTRADICT,
    EQUIVALENT_CODE,
    REPRODUCE,
    SMALLER_CODE,
    UNDECIDED,
    family_decisions,
    smaller_pvalue,
)
from rpc_attention.report.verdict import (
    CONTRADICTED,
    EQUIVALENT,
    INCONCLUSIVE,
    REPRODUCED,
    RULES_TEXT,
    SMALLER,
    claim_verdict,
)

WORDS = {REPRODUCE: REPRODUCED, CONTRADICT: CONTRADICTED, EQUIVALENT_CODE: EQUIVALENT, SMALLER_CODE: SMALLER,
         UNDECIDED: INCONCLUSIVE}


def test_smaller_pvalue_is_the_one_sided_t_test_against_the_target():
    rng = np.random.default_rng(0)
    for _ in range(10):
        d = rng.normal(0.5, 1.0, size=8)
        target = 2.0
        se = d.std(ddof=1) / math.sqrt(len(d))
        want = stats.ttest_1samp(d, target, alternative="less").pvalue
        assert float(smaller_pvalue(d.mean(), se, len(d) - 1, target)) == pytest.approx(want, rel=1e-12)
        t = margin_tests(list(d), 0.5, target=target)
        assert t["p_smaller"] == pytest.approx(want, rel=1e-12)
    # lower is better: oriented, so a rise of the metric counts as an effect against the paper
    up = [1.0, 1.2, 0.9, 1.1]
    assert margin_tests(up, 0.1, higher_is_better=False, target=0.5)["p_smaller"] < 0.01


def _cmp(diffs):
    return {"per_seed_diff": dict(enumerate(diffs)), "bootstrap": None,
            "tests": margin_tests(list(diffs), 0.25, target=1.0)}


def test_precedence_of_the_five_verdicts():
    # one claim in a family of one: the adjusted p's are the raw ones
    def verdict(diffs):
        c = _cmp(diffs)
        t = c["tests"]
        return claim_verdict(c, True, 0.25, t["p"], t["p_equivalence"], t["p_smaller"], 1.0)

    assert verdict([2.0, 2.1, 1.9, 2.05])["verdict"] == REPRODUCED
    mid = verdict([0.6, 0.62, 0.58, 0.61, 0.59])   # beyond the margin, below the target: reproduced, and says so
    assert mid["verdict"] == REPRODUCED and "smaller than the paper's effect too" in mid["reason"]
    assert verdict([-2.0, -2.1, -1.9, -2.05])["verdict"] == CONTRADICTED
    assert verdict([0.01, -0.01, 0.02, 0.0, -0.02])["verdict"] == EQUIVALENT
    small = verdict([0.4, 0.1, 0.7, 0.3, 0.5, 0.2, 0.6, 0.4])   # excludes 1.0, neither within nor past 0.25
    assert small["verdict"] == SMALLER and "target 1" in small["reason"]
    assert verdict([0.9, -0.5, 1.6, 0.1])["verdict"] == INCONCLUSIVE


def test_without_a_registered_target_the_verdict_is_the_four_verdict_rule():
    c = _cmp([0.4, 0.1, 0.7, 0.3, 0.5, 0.2, 0.6, 0.4])
    t = c["tests"]
    assert claim_verdict(c, True, 0.25, t["p"], t["p_equivalence"])["verdict"] == INCONCLUSIVE
    assert "smaller than the paper's effect" in RULES_TEXT and "precedence" in RULES_TEXT


def test_the_vectorised_rule_with_targets_is_the_reports_rule():
    rng = np.random.default_rng(3)
    target = np.array([1.0, 2.0, 0.8])
    for _ in range(60):
        d = rng.normal(rng.normal(0.5, 1.0, size=(3, 1)), rng.uniform(0.1, 1.5, size=(3, 1)), size=(3, 5))
        codes = family_decisions(d, np.full(3, 0.2), target=target)
        tests = [margin_tests(list(row), 0.2, target=float(t)) for row, t in zip(d, target)]
        hp, hq, hs = (holm([t[k] for t in tests]) for k in ("p", "p_equivalence", "p_smaller"))
        for row, code, p, q, s, t in zip(d, codes, hp, hq, hs, target):
            cmp = {"per_seed_diff": dict(enumerate(row)), "bootstrap": None}
            assert claim_verdict(cmp, True, 0.2, p, q, s, float(t))["verdict"] == WORDS[int(code)]


STUDIES = 2000


@pytest.mark.parametrize("where", ["target", "margin", "zero"])
def test_familywise_error_of_the_full_rule_stays_at_5_percent(where):
    # m claims, every true effect at one point; a false verdict: reproduced when delta <= margin, contradicted
    # when delta >= -margin, equivalent when |delta| >= margin, smaller when delta >= target
    m, n, margin, target = 6, 6, 0.5, 2.0
    effect = {"target": target, "margin": margin, "zero": 0.0}[where]
    rng = np.random.default_rng({"target": 1, "margin": 2, "zero": 3}[where])
    d = rng.normal(effect, 1.0, size=(STUDIES, m, n))
    codes = family_decisions(d, np.full(m, margin), target=np.full(m, target))
    false = np.zeros(codes.shape, dtype=bool)
    false |= (codes == REPRODUCE) & (effect <= margin)
    false |= (codes == CONTRADICT) & (effect >= -margin)
    false |= (codes == EQUIVALENT_CODE) & (abs(effect) >= margin)
    false |= (codes == SMALLER_CODE) & (effect >= target)
    fwer = float(false.any(axis=-1).mean())
    assert fwer <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / STUDIES), fwer
