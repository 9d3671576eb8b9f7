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


# ---------------------------------------------------------------------------------------------------------------
# Both variance sources: 10,000+ simulated studies with the test-set noise every seed shares and skewed per-seed
# differences, simulated example by example. The example part's standard error is the analytic one of the pooled
# mean (sd over examples of the seed-averaged paired differences / sqrt(N)), which the percentile bootstrap
# estimates (checked against the bootstrap in tests/report/test_verdict.py).
BIG = 10_000
BIG_MC = 3.5 * math.sqrt(0.05 * 0.95 / BIG)   # 3.5 Monte-Carlo standard errors of a 5 % rate: 0.0076


def _studies(rng, studies, m, n, examples, seed_sd, shared_sd, own_sd, effect=0.0, skew=True):
    """Per-seed differences ``(studies, m, n)`` and example standard errors ``(studies, m)``: each claim's
    per-example paired difference is a shared part a_i (the test example's own effect, the same for every
    seed) plus each seed's own b_si, its per-seed difference their mean over the examples plus a seed effect
    u_s, centred exponential (skewness 2) or normal. The true effect is ``effect``."""
    d = np.empty((studies, m, n))
    se = np.empty((studies, m))
    for lo in range(0, studies, 500):
        k = min(500, studies - lo)
        a = rng.normal(0.0, shared_sd, size=(k, m, 1, examples))
        b = rng.normal(0.0, own_sd, size=(k, m, n, examples))
        e = a + b
        u = (rng.exponential(1.0, size=(k, m, n)) - 1.0) if skew else rng.normal(size=(k, m, n))
        d[lo:lo + k] = effect + seed_sd * u + e.mean(axis=-1)
        se[lo:lo + k] = e.mean(axis=2).std(axis=-1, ddof=1) / math.sqrt(examples)
    return d, se


@pytest.mark.parametrize("m,n,seed_sd,shared_sd", [(4, 3, 1.0, 5.0), (13, 5, 1.0, 10.0), (4, 10, 0.2, 10.0),
                                                    (2, 21, 1.0, 2.0)])
def test_familywise_error_with_shared_test_noise_and_skewed_seeds(m, n, seed_sd, shared_sd):
    rng = np.random.default_rng(1000 + 10 * m + n)
    d, se = _studies(rng, BIG, m, n, examples=200, seed_sd=seed_sd, shared_sd=shared_sd, own_sd=3.0)
    codes = family_decisions(d, np.zeros(m), se)
    fwer = float(np.mean(np.isin(codes, (REPRODUCE, CONTRADICT)).any(axis=-1)))
    assert fwer <= 0.05 + BIG_MC, fwer


def test_the_seed_test_alone_misses_the_shared_test_noise():
    # where the test set's sampling dominates, the seed-only test (no example part) calls far more than 5 %
    # of null families: the reason the rule adds the example part
    rng = np.random.default_rng(7)
    d, se = _studies(rng, BIG, 4, 10, examples=200, seed_sd=0.2, shared_sd=10.0, own_sd=3.0)
    seed_only = float(np.mean(np.isin(family_decisions(d, np.zeros(4)), (REPRODUCE, CONTRADICT)).any(axis=-1)))
    both = float(np.mean(np.isin(family_decisions(d, np.zeros(4), se), (REPRODUCE, CONTRADICT)).any(axis=-1)))
    assert seed_only > 0.3 and both <= 0.05 + BIG_MC, (seed_only, both)


def test_effects_at_the_margin_with_both_sources_are_not_called_reproduced():
    rng = np.random.default_rng(9)
    d, se = _studies(rng, BIG, 3, 5, examples=200, seed_sd=1.0, shared_sd=5.0, own_sd=3.0, effect=0.5)
    fwer = float(np.mean((family_decisions(d, np.full(3, 0.5), se) == REPRODUCE).any(axis=-1)))
    assert fwer <= 0.05 + BIG_MC, fwer


def test_the_claimed_power_with_an_example_part_is_a_lower_bound():
    # normal seeds and a known example part: the noncentral-t power on n - 1 df is a lower bound of the
    # simulated power (one claim at its MDE beside a null claim, family of 2), and not a loose one
    n, sd, se_ex, margin = 6, 1.0, 0.3, 0.25
    delta = mde(sd, n, margin, family=2, se_examples=se_ex)
    rng = np.random.default_rng(21)
    d = rng.normal(0.0, sd, size=(BIG, 2, n)) + rng.normal(0.0, se_ex, size=(BIG, 2, 1))
    d[:, 0] += delta
    got = float(np.mean(family_decisions(d, np.full(2, margin), np.full((BIG, 2), se_ex))[:, 0] == REPRODUCE))
    assert 0.8 - 3.5 * math.sqrt(0.16 / BIG) <= got <= 0.9, got


def test_holm_tost_and_t_quantiles_agree_with_statsmodels_and_scipy():
    from scipy import stats
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import DescrStatsW

    from rpc_attention.report.intervals import holm
    from rpc_attention.report.power import margin_pvalues

    rng = np.random.default_rng(4)
    for _ in range(20):
        p = rng.uniform(0, 0.2, size=7)
        want = multipletests(p, method="holm")[1]
        assert np.allclose(holm(list(p)), want, rtol=0, atol=1e-12)
        assert np.allclose(holm_adjust(p), want, rtol=0, atol=1e-12)
        # TOST of one sample of per-seed differences against +-margin (no example part: df = n - 1)
        d = rng.normal(0.3, 1.0, size=6)
        margin = 0.8
        se = d.std(ddof=1) / math.sqrt(len(d))
        _, p_tost = margin_pvalues(d.mean(), se, len(d) - 1, margin)
        assert float(p_tost) == pytest.approx(DescrStatsW(d).ttost_mean(-margin, margin)[0], rel=1e-10)
        # with margin 0, p_dir is the ordinary two-sided one-sample t test
        p_dir, _ = margin_pvalues(d.mean(), se, len(d) - 1, 0.0)
        assert float(p_dir) == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-10)
