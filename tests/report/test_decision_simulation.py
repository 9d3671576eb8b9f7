"""The verdict rule's seed-level decision (report.power.family_decisions, the code the report uses for
each family) on 2,000 simulated studies: the family-wise rate of a false "reproduced / contradicted"
stays <= 5 % under no effect, and the power the design claims (power.power / power.mde at Holm's first
step) is what the simulation gives, within Monte-Carlo error. Normal per-seed differences, vectorised."""

import math

import numpy as np
import pytest

from rpc_attention.report.intervals import margin_tests
from rpc_attention.report.power import (
    CONTRADICT,
    EQUIVALENT_CODE,
    REPRODUCE,
    family_decisions,
    holm_adjust,
    mde,
    power,
    seeds_needed,
)
from rpc_attention.report.verdict import claim_verdict

STUDIES = 2000
# Monte-Carlo error of a rate near p over 2,000 studies: sqrt(p (1 - p) / 2000) <= 0.0112; 3.5 of those
MC = 3.5 * math.sqrt(0.25 / STUDIES)


@pytest.mark.parametrize("m,n,margin", [(4, 3, 0.0), (2, 6, 0.0), (12, 3, 0.0), (2, 10, 0.25)])
def test_familywise_false_positive_rate_under_no_effect(m, n, margin):
    rng = np.random.default_rng(100 + m * n)
    d = rng.normal(0.0, 1.0, size=(STUDIES, m, n))
    codes = family_decisions(d, np.full(m, margin))
    fwer = float(np.mean(np.isin(codes, (REPRODUCE, CONTRADICT)).any(axis=-1)))
    # Holm controls the family-wise rate at 5 %; with margin 0 it is close to 5 %, so allow MC error only
    assert fwer <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / STUDIES), fwer


def test_effects_at_the_margin_are_not_called_reproduced():
    # the worst case for "reproduced": every effect exactly at +margin (not beyond it)
    rng = np.random.default_rng(5)
    margin = np.full(3, 0.5)
    d = rng.normal(0.5, 1.0, size=(STUDIES, 3, 5))
    fwer = float(np.mean((family_decisions(d, margin) == REPRODUCE).any(axis=-1)))
    assert fwer <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / STUDIES), fwer


@pytest.mark.parametrize("n,sd,margin", [(3, 1.0, 0.0), (6, 2.7, 0.75), (12, 1.0, 0.25)])
def test_the_claimed_power_is_the_simulated_power(n, sd, margin):
    # one claim with the MDE as its effect, one null claim beside it (family of 2): the design claims 80 %
    # at Holm's first step (per-test 0.025); Holm's second step can only add, by at most the chance that
    # the null claim is rejected first (<= 2.5 %)
    delta = mde(sd, n, margin, family=2)
    assert power(delta, sd, n, margin, family=2) == pytest.approx(0.8, abs=1e-8)
    rng = np.random.default_rng(n)
    d = rng.normal(0.0, sd, size=(STUDIES, 2, n))
    d[:, 0] += delta
    got = float(np.mean(family_decisions(d, np.full(2, margin))[:, 0] == REPRODUCE))
    assert 0.8 - MC <= got <= 0.8 + 0.025 + MC, got


def test_equivalence_has_power_for_a_true_null_and_stays_below_5_percent_at_the_margin():
    rng = np.random.default_rng(11)
    margin = np.full(2, 1.0)
    null = rng.normal(0.0, 0.5, size=(STUDIES, 2, 20))
    assert float(np.mean((family_decisions(null, margin) == EQUIVALENT_CODE).all(axis=-1))) > 0.9
    edge = rng.normal(1.0, 0.5, size=(STUDIES, 2, 20))   # true effect at the margin: not equivalent
    fwer = float(np.mean((family_decisions(edge, margin) == EQUIVALENT_CODE).any(axis=-1)))
    assert fwer <= 0.05 + 3.5 * math.sqrt(0.05 * 0.95 / STUDIES), fwer


def test_seeds_needed_is_the_first_n_with_the_power():
    n = seeds_needed(1.0, 1.02, 0.25, family=2)
    assert power(1.0, 1.02, n, 0.25, family=2) >= 0.8 > power(1.0, 1.02, n - 1, 0.25, family=2)
    assert seeds_needed(0.2, 1.0, 0.25) is None and seeds_needed(1.0, 0.0) is None


def test_the_vectorised_rule_is_the_reports_rule():
    # family_decisions and the per-claim path of the report (margin_tests -> holm -> claim_verdict) agree
    from rpc_attention.report.intervals import holm

    rng = np.random.default_rng(3)
    for _ in range(40):
        d = rng.normal(rng.normal(0, 1.5, size=(3, 1)), rng.uniform(0.2, 2.0, size=(3, 1)), size=(3, 4))
        codes = family_decisions(d, np.full(3, 0.5))
        tests = [margin_tests(list(row), 0.5) for row in d]
        hp, hq = holm([t["p"] for t in tests]), holm([t["p_equivalence"] for t in tests])
        assert np.allclose(holm_adjust([t["p"] for t in tests]), hp, rtol=0, atol=1e-15)
        for row, code, p, q in zip(d, codes, hp, hq):
            cmp = {"per_seed_diff": dict(enumerate(row)), "seed_ci": None, "bootstrap": None}
            word = claim_verdict(cmp, True, 0.5, p, q)["verdict"]
            assert word == {REPRODUCE: "reproduced", CONTRADICT: "contradicted", EQUIVALENT_CODE: "equivalent",
                            0: "inconclusive"}[int(code)]
