"""The one verdict rule (RULES_TEXT) on constructed cases, Holm's adjustment against a hand
computation, the paired t test and the smallest resolvable difference against scipy, and every claim
of every study decided by the interval rule."""

import math

import pytest
from scipy import stats

from rpc_attention.report.intervals import ALPHA, holm, margin_tests, min_detectable, paired_t, t_interval
from rpc_attention.report.verdict import (
    CONTRADICTED,
    EQUIVALENT,
    INCONCLUSIVE,
    NOT_MEASURED,
    REPRODUCED,
    RULES_TEXT,
    UNRESOLVED,
    claim_verdict,
    effect,
)


def test_effect_orientation_and_margin():
    e = effect([10.0, 12.0], [13.0, 15.0], higher_is_better=True, margin=1.0)
    assert e.delta == pytest.approx(3.0) and e.raw_diff == pytest.approx(3.0)
    assert e.rpc_std == pytest.approx(math.sqrt(2.0))    # sample std of (13, 15)
    e = effect([36.0], [35.0], higher_is_better=False, margin=0.02, relative_margin=True)
    assert e.delta == pytest.approx(1.0) and e.raw_diff == pytest.approx(-1.0) and e.margin == pytest.approx(0.72)


def test_holm_matches_a_hand_computation():
    # m = 4 p-values (None is not counted): sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03,
    # 0.06, 0.04 -> running maximum 0.02, 0.03, 0.06, 0.06
    adj = holm([0.01, 0.04, 0.03, None, 0.005])
    assert adj[3] is None
    assert adj[0] == pytest.approx(0.03, abs=1e-15) and adj[1] == pytest.approx(0.06, abs=1e-15)
    assert adj[2] == pytest.approx(0.06, abs=1e-15) and adj[4] == pytest.approx(0.02, abs=1e-15)
    assert holm([0.5, 0.6]) == [pytest.approx(1.0), pytest.approx(1.0)]     # capped at 1
    assert holm([0.051]) == [0.051] and holm([]) == [] and holm([None]) == [None]


def test_paired_t_and_interval_against_scipy():
    base = [70.1, 71.3, 69.8, 70.6]
    rpc = [71.0, 71.9, 71.1, 70.9]
    d = [r - b for r, b in zip(rpc, base)]
    ref = stats.ttest_rel(rpc, base)
    t = paired_t(d)
    assert t["t"] == pytest.approx(ref.statistic, rel=1e-12) and t["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert t["df"] == 3
    ci = t_interval(d)
    lo, hi = stats.t.interval(0.95, 3, loc=sum(d) / 4, scale=stats.sem(d))
    assert ci["lo"] == pytest.approx(lo, abs=1e-12) and ci["hi"] == pytest.approx(hi, abs=1e-12)
    assert paired_t([1.0]) is None
    # no spread, no noise figure: never p = 0
    assert paired_t([2.0, 2.0])["p"] is None and paired_t([0.0, 0.0])["p"] is None
    assert margin_tests([2.0, 2.0, 2.0], 0.5) == {"p": None, "p_equivalence": None, "no_spread": True}


def test_min_detectable_is_the_80_percent_power_effect_at_holms_strictest_step():
    d = [0.3, -0.2, 0.5]
    sd = stats.tstd(d)
    for family, margin in ((1, 0.0), (13, 0.0), (2, 0.25)):
        mdd = min_detectable(d, family, margin)
        crit = stats.t.ppf(1 - ALPHA / (2 * family), 2)
        # the noncentral t at the MDE puts 80 % of its mass past Holm's strictest critical value
        assert stats.nct.sf(crit, 2, (mdd - margin) * math.sqrt(3) / sd) == pytest.approx(0.8, abs=1e-8)
        # and the normal-shift approximation margin + (t_crit + t_0.8) sd / sqrt(n) is close (within 25 %)
        approx = margin + (crit + stats.t.ppf(0.8, 2)) * sd / math.sqrt(3)
        assert abs(mdd - approx) < 0.25 * approx
    assert min_detectable([1.0], 3) is None and min_detectable([1.0, 1.0], 3) is None


def test_margin_tests_against_one_sided_t_tests():
    d = [1.2, 0.9, 1.6, 1.1]
    margin = 0.5
    up = stats.ttest_1samp(d, margin, alternative="greater").pvalue
    down = stats.ttest_1samp(d, -margin, alternative="less").pvalue
    t = margin_tests(d, margin)
    assert t["p"] == pytest.approx(min(1.0, 2 * min(up, down)), rel=1e-10)
    tost = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
               stats.ttest_1samp(d, margin, alternative="less").pvalue)
    assert t["p_equivalence"] == pytest.approx(tost, rel=1e-10)
    # margin 0: the ordinary two-sided paired t test; lower-is-better flips the sign, not the p
    assert margin_tests(d, 0.0)["p"] == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-10)
    assert margin_tests([-x for x in d], margin, higher_is_better=False)["p"] == pytest.approx(t["p"], rel=1e-12)


def _cmp(diffs, example=None):
    seeds = [str(i) for i in range(len(diffs))]
    return {"seeds": seeds, "per_seed_diff": dict(zip(seeds, diffs)), "seed_ci": t_interval(diffs),
            "bootstrap": {"pooled": {"lo": example[0], "hi": example[1], "diff": sum(example) / 2}} if example else None}


@pytest.mark.parametrize("diffs,example,higher,p_holm,p_tost,expected", [
    ([2.0, 2.2, 1.9], (1.5, 3.0), True, 0.01, None, REPRODUCED),
    ([-2.0, -2.2, -1.9], (-3.0, -1.5), False, 0.01, None, REPRODUCED),    # lower is better: negative = RPC better
    ([-2.0, -2.2, -1.9], (-3.0, -1.5), True, 0.01, None, CONTRADICTED),
    ([2.0, 2.2, 1.9], None, True, 0.01, None, REPRODUCED),                # no per-example record: the seed test
    ([2.0, 2.2, 1.9], (1.5, 3.0), True, 0.051, None, INCONCLUSIVE),       # Holm-adjusted p not below 0.05
    ([2.0, 2.2, 1.9], (-0.1, 3.0), True, 0.01, None, INCONCLUSIVE),       # the example interval reaches 0
    ([2.0, 2.2, 1.9], (0.5, 3.0), True, 0.01, None, INCONCLUSIVE),        # ... or only the margin (1): its bound decides
    ([3.0, -1.0, 2.0], (0.5, 2.0), True, 0.4, 0.6, INCONCLUSIVE),         # the seeds disagree
    ([0.1, -0.1, 0.05], (-0.4, 0.5), True, 1.0, 0.01, EQUIVALENT),        # a measured null inside +-margin
    ([0.1, -0.1, 0.05], (-1.4, 0.5), True, 1.0, 0.01, INCONCLUSIVE),      # ... but the example interval reaches -margin
    ([0.1, -0.1, 0.05], (-0.4, 0.5), True, 1.0, 0.2, INCONCLUSIVE),       # ... or TOST not significant
    ([5.0], (4.0, 6.0), True, None, None, UNRESOLVED),                    # one seed, however large
    ([-5.0], (-6.0, -4.0), True, None, None, UNRESOLVED),
    ([2.0, 2.0, 2.0], (1.5, 3.0), True, None, None, INCONCLUSIVE),        # no spread: no p, no verdict
    ([], None, True, None, None, NOT_MEASURED),
])
def test_the_rule_on_constructed_cases(diffs, example, higher, p_holm, p_tost, expected):
    v = claim_verdict(_cmp(diffs, example), higher, 1.0, p_holm, p_tost)
    assert v["verdict"] == expected, v["reason"]


def test_inconclusive_says_what_is_missing():
    v = claim_verdict(_cmp([2.0, 2.2, 1.9], (0.5, 3.0)), True, 1.0, 0.001)
    assert "lacks the example interval past the margin" in v["reason"]
    v = claim_verdict(_cmp([2.0, 2.2, 1.9], (1.5, 3.0)), True, 1.0, 0.2)
    assert "lacks p (Holm) < 0.05" in v["reason"]
    v = claim_verdict(_cmp([2.0, 2.0, 2.0], (1.5, 3.0)), True, 1.0, None)
    assert "no spread" in v["reason"]


def test_rules_text_states_the_one_rule():
    for word in ("reproduced", "contradicted", "equivalent", "inconclusive", "unresolved (one seed)", "not measured",
                 "Holm", "margin", "Smallest resolvable", "Example interval", "TOST", "Families", "no spread",
                 "two-level bootstrap", "recomputed on the same"):
        assert word in RULES_TEXT
    assert "2 sigma" not in RULES_TEXT and "margin rule" not in RULES_TEXT


def _every_study(tmp_path):
    """Every study of reproduce.studies, the ones that need data paths given existing placeholders."""
    from rpc_attention.reproduce import studies as S

    (tmp_path / "classes.txt").write_text("0\n")
    out = []
    for name, _description, defaults in S.list_studies():
        sets = [f"{k}={tmp_path / 'classes.txt' if k.endswith('_classes') else tmp_path}"
                for k, v in defaults.items() if k.startswith("data.") and v is None]
        out.append(S.get_study(name, sets))
    return out


def test_every_claim_of_every_study_gets_the_interval_rule(tmp_path):
    # the seed interval and the paired t test apply to any metric with >= 2 seeds; the example interval
    # needs the suite to record the claim's metric per example: a claim on a metric without one fails here
    from rpc_attention.evaluate.per_example import has_example_record

    studies = _every_study(tmp_path)
    assert {s.name for s in studies} >= {"smoke", "quick", "fmnist-full", "imagenet", "wikitext103"}
    missing = [(s.name, c.id, c.suite, c.metric) for s in studies for c in s.claims
               if not has_example_record(c.suite, c.metric)]
    assert not missing, f"claims without a per-example record (no example interval): {missing}"
    for s in studies:  # and the rule decides each of them from a three-seed comparison
        for c in s.claims:
            v = claim_verdict(_cmp([2.0, 2.1, 1.9], (1.9, 3.0)), c.higher, c.margin, 0.01)
            assert v["verdict"] == (REPRODUCED if c.higher else CONTRADICTED), (s.name, c.id)


def test_no_verdict_contradicts_its_own_intervals():
    # random three-seed comparisons: a claim is never reproduced (contradicted) unless p (Holm) < 0.05 and
    # every example interval it shows lies past +margin (-margin); never equivalent unless the example
    # interval lies inside +-margin and the equivalence test's p (Holm) < 0.05
    import numpy as np

    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(2000):
        diffs = list(rng.normal(rng.normal(0, 2), rng.uniform(0.05, 3), size=3))
        ex = tuple(sorted(rng.normal(np.mean(diffs), 1.5, size=2)))
        p_holm, p_tost = (float(x) for x in rng.uniform(0, 0.2, size=2))
        higher = bool(rng.integers(2))
        v = claim_verdict(_cmp(diffs, ex), higher, 1.0, p_holm, p_tost)["verdict"]
        seen.add(v)
        sign = 1.0 if higher else -1.0
        lo, hi = sorted((sign * ex[0], sign * ex[1]))
        delta = sign * sum(diffs) / 3
        if v == REPRODUCED:
            assert lo > 1.0 and delta > 0 and p_holm < 0.05
        if v == CONTRADICTED:
            assert hi < -1.0 and delta < 0 and p_holm < 0.05
        if v == EQUIVALENT:
            assert -1.0 < lo and hi < 1.0 and p_tost < 0.05
    assert seen == {REPRODUCED, CONTRADICTED, EQUIVALENT, INCONCLUSIVE}
