"""The one verdict rule (RULES_TEXT) on constructed cases, Holm's adjustment against a hand
computation, the paired t test, the one interval over seeds and examples and the smallest resolvable
difference against scipy, and every claim of every study decided by the interval rule."""

import math

import pytest
from scipy import stats

from rpc_attention.report.intervals import (
    ALPHA,
    example_se,
    holm,
    margin_tests,
    min_detectable,
    paired_t,
    t_interval,
)
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
    flat = margin_tests([2.0, 2.0, 2.0], 0.5)
    assert flat["p"] is None and flat["p_equivalence"] is None and flat["no_spread"] is True
    # an example part is a noise figure of its own: the same differences then have p's
    assert margin_tests([2.0, 2.0, 2.0], 0.5, se_examples=0.3)["p"] is not None


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
    ([3.0, -1.0, 2.0], (0.5, 2.0), True, 0.4, 0.6, INCONCLUSIVE),         # the seeds disagree
    ([0.1, -0.1, 0.05], (-0.4, 0.5), True, 1.0, 0.01, EQUIVALENT),        # a measured null inside +-margin
    ([0.1, -0.1, 0.05], (-0.4, 0.5), True, 1.0, 0.2, INCONCLUSIVE),       # ... but TOST not significant
    ([5.0], (4.0, 6.0), True, None, None, UNRESOLVED),                    # one seed, however large
    ([-5.0], (-6.0, -4.0), True, None, None, UNRESOLVED),
    ([2.0, 2.0, 2.0], (1.5, 3.0), True, None, None, INCONCLUSIVE),        # no spread: no p, no verdict
    ([], None, True, None, None, NOT_MEASURED),
])
def test_the_rule_on_constructed_cases(diffs, example, higher, p_holm, p_tost, expected):
    v = claim_verdict(_cmp(diffs, example), higher, 1.0, p_holm, p_tost)
    assert v["verdict"] == expected, v["reason"]


def test_the_example_part_widens_the_one_interval():
    # the same per-seed differences, with an example interval that reaches 0: the one interval over seeds
    # and examples is wider, its p larger, and a claim the seeds alone would call reproduced is not
    d = [2.0, 2.2, 1.9]
    seeds_only = margin_tests(d, 1.0)
    se_ex = example_se({"lo": -0.1, "hi": 3.0})
    assert se_ex == pytest.approx(3.1 / (2 * stats.norm.ppf(0.975)), rel=1e-12)
    both = margin_tests(d, 1.0, se_examples=se_ex)
    assert both["se"] == pytest.approx(math.sqrt(stats.tstd(d) ** 2 / 3 + se_ex ** 2), rel=1e-12)
    half = stats.t.ppf(0.975, 2) * both["se"]
    assert both["interval"]["lo"] == pytest.approx(sum(d) / 3 - half, rel=1e-12)
    assert both["p"] > seeds_only["p"] and seeds_only["p"] < 0.05 <= both["p"]
    v = claim_verdict({**_cmp(d, (-0.1, 3.0)), "tests": both}, True, 1.0, both["p"], both["p_equivalence"])
    assert v["verdict"] == INCONCLUSIVE


def test_inconclusive_says_what_is_missing():
    v = claim_verdict(_cmp([2.0, 2.2, 1.9], (1.5, 3.0)), True, 1.0, 0.2)
    assert "lacks p (Holm) < 0.05" in v["reason"]
    v = claim_verdict(_cmp([2.0, 2.0, 2.0], (1.5, 3.0)), True, 1.0, None)
    assert "no noise figure" in v["reason"]


def test_rules_text_states_the_one_rule():
    for word in ("reproduced", "contradicted", "equivalent", "inconclusive", "unresolved (one seed)", "not measured",
                 "Holm", "margin", "Smallest resolvable", "One interval for both variance sources", "TOST",
                 "Families", "all equal", "two-level bootstrap", "on each resample", "n - 1"):
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
    # a claim within one model (its baseline is the same model's own metric, as the kernel-PCA claims'
    # trained-against-initial J_proj) has no second model to pair examples with: the seed interval decides it
    missing = [(s.name, c.id, c.suite, c.metric) for s in studies for c in s.claims
               if c.baseline_metric is None and not has_example_record(c.suite, c.metric)]
    within = [c for s in studies for c in s.claims if c.baseline_metric is not None]
    assert {c.suite for c in within} <= {"kpca"}, within
    assert not missing, f"claims without a per-example record (no example interval): {missing}"
    for s in studies:  # and the rule decides each of them from a three-seed comparison
        for c in s.claims:
            v = claim_verdict(_cmp([2.0, 2.1, 1.9], (1.9, 3.0)), c.higher, c.margin, 0.01)
            assert v["verdict"] == (REPRODUCED if c.higher else CONTRADICTED), (s.name, c.id)


def test_no_verdict_contradicts_its_own_interval():
    # random three-seed comparisons with an example part, one claim per family: a claim is reproduced
    # (contradicted) exactly when its one 95 % interval lies past +margin (-margin), and equivalent only with
    # the TOST p < 0.05 (its 90 % interval inside +-margin)
    import numpy as np

    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(2000):
        diffs = list(rng.normal(rng.normal(0, 2), rng.uniform(0.05, 3), size=3))
        ex = tuple(sorted(rng.normal(np.mean(diffs), 1.5, size=2)))
        higher = bool(rng.integers(2))
        tests = margin_tests(diffs, 1.0, higher, example_se({"lo": ex[0], "hi": ex[1]}))
        v = claim_verdict({**_cmp(diffs, ex), "tests": tests}, higher, 1.0, tests["p"], tests["p_equivalence"])
        seen.add(v["verdict"])
        sign = 1.0 if higher else -1.0
        lo, hi = sorted((sign * tests["interval"]["lo"], sign * tests["interval"]["hi"]))
        assert (v["verdict"] == REPRODUCED) == (lo > 1.0), (lo, hi, v)
        assert (v["verdict"] == CONTRADICTED) == (hi < -1.0), (lo, hi, v)
        if v["verdict"] == EQUIVALENT:
            half = stats.t.ppf(0.95, 2) * tests["se"]
            mean = sign * sum(diffs) / 3
            assert -1.0 < mean - half and mean + half < 1.0
    assert seen == {REPRODUCED, CONTRADICTED, EQUIVALENT, INCONCLUSIVE}
