"""Interval code against float64 references, the interval verdict rules and the lead paragraph's rules."""

import math

import numpy as np
import pytest
from scipy import stats

from rpc_attention.report.intervals import paired_bootstrap, paired_comparison, t_interval
from rpc_attention.report.lead import direction, lead_paragraph
from rpc_attention.report.verdict import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, interval_verdict


def test_t_interval_matches_the_textbook_formula():
    diffs = [1.5, -0.25, 2.0, 0.75]
    m = sum(diffs) / 4
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / 3)
    half = stats.t.ppf(0.975, 3) * sd / math.sqrt(4)
    ci = t_interval(diffs)
    # the same float64 operations in another order: a few ulps of the magnitudes involved (~3)
    assert ci["lo"] == pytest.approx(m - half, abs=1e-12) and ci["hi"] == pytest.approx(m + half, abs=1e-12)
    assert ci["diff"] == pytest.approx(m, abs=1e-12) and ci["n"] == 4
    assert t_interval([1.0]) is None and t_interval([]) is None


def test_bootstrap_of_identical_models_is_zero_and_of_a_dominating_model_is_exact():
    rng = np.random.default_rng(1)
    a = 100.0 * (rng.random(300) < 0.7)
    same = paired_bootstrap([a], [a.copy()])
    assert same["diff"] == same["lo"] == same["hi"] == 0.0
    # RPC right on every example the baseline gets wrong (and on its right ones too): the difference is
    # the baseline's error exactly, and the interval holds it
    right_too = paired_bootstrap([a], [np.full(300, 100.0)])
    assert right_too["diff"] == pytest.approx(100.0 - a.mean(), abs=1e-12)
    assert right_too["lo"] < right_too["diff"] < right_too["hi"]
    # the baseline wrong everywhere, RPC right everywhere: every resample gives +100, so does the interval
    never, always = np.zeros(300), np.full(300, 100.0)
    exact = paired_bootstrap([never, never], [always, always])
    assert exact["diff"] == exact["lo"] == exact["hi"] == 100.0 and exact["n_seeds"] == 2


def test_bootstrap_width_matches_the_normal_approximation():
    rng = np.random.default_rng(2)
    n = 2000
    base = 100.0 * (rng.random(n) < 0.6)
    rpc = np.where(rng.random(n) < 0.1, 100.0 - base, base)  # flips 10 % of the answers
    d = rpc - base
    half = 1.96 * d.std(ddof=1) / math.sqrt(n)
    ci = paired_bootstrap([base], [rpc], resamples=2000, seed=0)
    assert ci["diff"] == pytest.approx(d.mean(), abs=1e-12)
    # 2000 resamples: the percentile ends scatter by a few % of the half width around the normal ones
    assert ci["lo"] == pytest.approx(d.mean() - half, abs=0.1 * half)
    assert ci["hi"] == pytest.approx(d.mean() + half, abs=0.1 * half)
    assert paired_bootstrap([base], [rpc], seed=0) == ci  # seeded


def test_bootstrap_pairs_examples_not_positions_and_rejects_mismatches():
    idx = np.arange(10)
    b = (idx, np.array([100.0] * 5 + [0.0] * 5))
    # the RPC model's record lists the same examples in reverse order: paired by index they agree
    r = (idx[::-1].copy(), b[1][::-1].copy())
    cmp = paired_comparison({"0": 50.0}, {"0": 50.0}, {"0": b}, {"0": r})
    assert cmp["bootstrap"]["per_seed"]["0"]["hi"] == 0.0 and cmp["seed_ci"] is None
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap([np.zeros(3), np.zeros(4)], [np.zeros(3), np.zeros(4)])
    # without per-example data for every paired seed there is no bootstrap
    assert paired_comparison({"0": 1.0, "1": 2.0}, {"0": 1.5, "1": 2.5}, {"0": b}, {"0": b})["bootstrap"] is None


def _ci(lo, hi):
    return {"lo": lo, "hi": hi, "diff": (lo + hi) / 2}


@pytest.mark.parametrize("seed,example,higher,expected", [
    (_ci(0.5, 2.0), _ci(0.1, 1.0), True, REPRODUCED),
    (_ci(-2.0, -0.5), _ci(-1.0, -0.1), False, REPRODUCED),       # lower is better: negative = RPC better
    (_ci(-2.0, -0.5), _ci(-1.0, -0.1), True, NOT_REPRODUCED),
    (_ci(-0.3, 0.4), _ci(-0.2, 0.2), True, NOT_REPRODUCED),      # inside +-margin (1): no effect of that size
    (_ci(-3.0, 4.0), _ci(0.2, 0.9), True, INCONCLUSIVE),         # seeds disagree
    (None, _ci(0.5, 2.0), True, INCONCLUSIVE),                    # one seed never says reproduced
    (None, _ci(-3.0, -1.5), True, NOT_REPRODUCED),                # one seed, worse beyond the margin
    (None, _ci(-0.9, -0.1), True, INCONCLUSIVE),
])
def test_interval_verdict_rules(seed, example, higher, expected):
    assert interval_verdict(seed, example, higher, margin=1.0)["verdict"] == expected


def test_lead_paragraph_follows_its_rules():
    comparisons = [
        {"rpc": "r", "baseline": "b", "suite": "clean", "metric": "top1", "what": "clean accuracy", "higher": True,
         "seeds": ["0", "1", "2"], "per_seed_diff": {"0": 1.0, "1": 2.0, "2": 3.0},
         "seed_ci": _ci(0.5, 3.5), "bootstrap": {"pooled": _ci(1.0, 3.0)}},
        {"rpc": "r", "baseline": "b", "suite": "pgd", "metric": "mean_top1", "what": "PGD accuracy", "higher": True,
         "seeds": ["0"], "per_seed_diff": {"0": -0.5}, "seed_ci": None, "bootstrap": {"pooled": _ci(-1.5, 0.5)}},
    ]
    assert direction(comparisons[0], True) == "better" and direction(comparisons[0], False) == "worse"
    assert direction(comparisons[1], True) == "no clear difference"
    assert direction({"seed_ci": None, "bootstrap": None}, True) == "no interval"
    res = {"models": {"r": {"label": "RPC"}, "b": {"label": "Base"}}, "comparisons": comparisons,
           "sparsity": {"models": {"r": {"label": "RPC", "verdict": "fired", "runs": {
               "r-s0": {"blocks": [{"frac_nonzero": 0.05}, {"frac_nonzero": 0.2}]}}}}},
           "claims": [{"title": "claim A", "verdict": REPRODUCED}, {"title": "claim B", "verdict": INCONCLUSIVE}]}
    text = lead_paragraph(res)
    assert "PAP's sparse step: RPC: fired (up to 20 % of S entries non-zero)." in text
    assert "clean accuracy +2.00 points (better; seed interval [+0.50, +3.50], example interval [+1.00, +3.00])" in text
    assert "PGD accuracy -0.50 points (no clear difference; seed interval n/a, one seed" in text
    assert "supported at this scale: claim A; inconclusive: claim B." in text
