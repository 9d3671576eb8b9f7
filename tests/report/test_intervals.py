"""Interval code against float64 references, the example statistics (mean, AUPR, perplexity) and the
lead paragraph (the verdict table's metric and word)."""

import math

import numpy as np
import pytest
from scipy import stats

from rpc_attention.evaluate.ood import aupr
from rpc_attention.evaluate.per_example import STATISTICS, ExampleData, average_precision, example_data, score_record
from rpc_attention.report.intervals import paired_bootstrap, paired_comparison, t_interval
from rpc_attention.report.lead import lead_paragraph
from rpc_attention.report.verdict import INCONCLUSIVE, REPRODUCED, UNRESOLVED


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
    b = ExampleData(idx, np.array([100.0] * 5 + [0.0] * 5)[:, None], STATISTICS["mean"])
    # the RPC model's record lists the same examples in reverse order: paired by index they agree
    r = ExampleData(idx[::-1].copy(), b.values[::-1].copy(), STATISTICS["mean"])
    cmp = paired_comparison({"0": 50.0}, {"0": 50.0}, {"0": b}, {"0": r})
    assert cmp["bootstrap"]["per_seed"]["0"]["hi"] == 0.0 and cmp["seed_ci"] is None
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap([np.zeros(3), np.zeros(4)], [np.zeros(3), np.zeros(4)])
    # without per-example data for every paired seed there is no bootstrap
    assert paired_comparison({"0": 1.0, "1": 2.0}, {"0": 1.5, "1": 2.5}, {"0": b}, {"0": b})["bootstrap"] is None


def _ci(lo, hi):
    return {"lo": lo, "hi": hi, "diff": (lo + hi) / 2}


def test_average_precision_equals_sklearn_with_ties():
    rng = np.random.default_rng(3)
    s_in = np.round(rng.normal(0.0, 1.0, 300), 1)     # rounded: many tied scores
    s_out = np.round(rng.normal(0.8, 1.0, 200), 1)
    scores = np.concatenate([s_in, s_out])
    labels = np.r_[np.zeros(300), np.ones(200)]
    assert average_precision(scores, labels) == pytest.approx(aupr(s_in, s_out), abs=1e-12)
    # batched over a leading axis: each row on its own
    batch = np.stack([scores, scores[::-1]])
    out = average_precision(batch, np.stack([labels, labels[::-1]]))
    assert out[0] == pytest.approx(out[1], abs=1e-12) == pytest.approx(aupr(s_in, s_out), abs=1e-12)


def test_score_records_recompute_the_metric_and_resample_within_strata():
    rng = np.random.default_rng(4)
    s_in, s_out = rng.normal(0, 1, 120), rng.normal(1, 1, 80)
    rec = score_record("aupr", {"AUPR": np.r_[s_in, s_out]}, strata=[False] * 120 + [True] * 80)
    data = example_data(rec, "AUPR")
    assert STATISTICS["aupr"](data.values, data.strata) == pytest.approx(100 * aupr(s_in, s_out), abs=1e-10)
    # a stratified resample keeps 120 in-distribution and 80 OOD examples; the same model twice -> 0
    same = paired_bootstrap([data.values], [data.values], resamples=200, statistic=data.statistic, strata=data.strata)
    assert same["lo"] == same["hi"] == 0.0
    # perplexity: exp(sum NLL / sum tokens) over blocks
    blocks = [[3.0 * 4, 4], [2.0 * 4, 4], [5.0 * 2, 2]]
    ppl = example_data(score_record("ppl", {"test_ppl_sliding": blocks}), "test_ppl_sliding")
    assert STATISTICS["ppl"](ppl.values, None) == pytest.approx(math.exp(30.0 / 10), rel=1e-14)
    # the perplexity ratio: every block's NLL per token lowered by 0.1 -> ratio exp(-0.1) on every resample
    lower = ExampleData(ppl.indices, ppl.values - np.outer([4, 4, 2], [0.1, 0.0]), ppl.statistic)
    iv = paired_bootstrap([ppl.values], [lower.values], resamples=100, statistic=ppl.statistic)
    assert iv["ratio"] == pytest.approx(math.exp(-0.1), rel=1e-12)
    assert iv["ratio_lo"] == pytest.approx(math.exp(-0.1), rel=1e-12) == pytest.approx(iv["ratio_hi"], rel=1e-12)
    assert example_data(rec, "other") is None
    with pytest.raises(ValueError, match="kind"):
        score_record("median", {"x": [1.0]})


def test_lead_paragraph_uses_the_tables_metric_and_word():
    claims = [
        {"title": "claim A", "rpc": "r", "baseline": "b", "suite": "clean", "metric": "top1", "verdict": REPRODUCED,
         "family": "primary", "rpc_label": "RPC",
         "intervals": {"seeds": ["0", "1", "2"], "per_seed_diff": {"0": 1.0, "1": 2.0, "2": 3.0},
                       "seed_ci": _ci(0.5, 3.5), "bootstrap": {"pooled": _ci(1.0, 3.0)}, "p_holm": 0.012}},
        {"title": "claim B", "rpc": "r", "baseline": "b", "suite": "corruptions", "metric": "mCE", "family": "secondary",
         "verdict": INCONCLUSIVE, "intervals": {"seeds": ["0", "1", "2"], "per_seed_diff": {"0": -1.0, "1": 2.0, "2": -4.0},
                                              "seed_ci": _ci(-8.0, 6.0), "bootstrap": {"pooled": _ci(-3.0, 0.5)},
                                              "p_holm": 0.9}},
        {"title": "claim C", "rpc": "r2", "baseline": "b", "suite": "ppl", "metric": "test_ppl_sliding", "family": "lm",
         "rpc_label": "RPC-LM",
         "verdict": UNRESOLVED, "intervals": {"seeds": ["0"], "per_seed_diff": {"0": -0.5}, "seed_ci": None,
                                            "bootstrap": None, "p_holm": None}},
    ]
    res = {"models": {"r": {"label": "RPC"}, "r2": {"label": "RPC-LM"}, "b": {"label": "Base"}}, "claims": claims,
           "sparsity": {"models": {"r": {"label": "RPC", "verdict": "fired", "runs": {
               "r-s0": {"blocks": [{"frac_nonzero": 0.05}, {"frac_nonzero": 0.2}]}}}}}}
    text = lead_paragraph(res)
    assert "PAP's sparse step: RPC: fired (up to 20 % of S entries non-zero)." in text
    assert ("The paper's claims, primary (powered): RPC clean top1 +2.00 (reproduced); secondary (exploratory, "
            "1 claim): 1 inconclusive.") in text
    assert "Language model (the paper's claims): RPC-LM ppl test_ppl_sliding -0.50 (unresolved (one seed))." in text
    assert "library's own" not in text      # no claim of that family here
    # at most five sentences; with no claim of two seeds the first screen says no claim can be decided
    assert len(text.split(". ")) <= 5
    for c in claims:
        c["intervals"]["per_seed_diff"] = {"0": 1.0}
    assert "Every model has one seed, so no claim can be decided" in lead_paragraph(res)

def test_mce_reference_errors_are_recomputed_on_every_resample():
    # two corruptions x 2 severities, 200 examples; the baseline normalises: its mCE is 100 on every resample,
    # and the RPC model's is its errors over the baseline's on the same resampled examples
    from rpc_attention.evaluate.per_example import encode_bits
    from rpc_attention.report.mce import mce_example_data

    rng = np.random.default_rng(0)
    settings = [f"{c}@{s}" for c in ("noise", "blur") for s in (1, 2)]

    def record(p_right):
        bits = {s: encode_bits(rng.random(200) < p) for s, p in zip(settings, p_right)}
        return {"indices": "0:200", "correct": bits, "metrics": {"mCE": {"settings": settings, "error": True,
                                                                         "weights": [0.0] * 4}}}

    base, rpc = record([0.6, 0.5, 0.7, 0.4]), record([0.7, 0.6, 0.7, 0.5])
    b, r = mce_example_data(base, base), mce_example_data(rpc, base)
    idx = rng.integers(0, 200, size=(50, 200))
    assert np.allclose(b.statistic(b.values[idx], None), 100.0, rtol=0, atol=1e-12)
    # a straightforward float64 loop over resamples and corruptions
    for row in idx[:5]:
        def err(rec, s, row=row):
            return 1.0 - np.array([rec["correct"][s][i] == "1" for i in row], dtype=float)

        ratios = [sum(err(rpc, s).sum() for s in settings if s.startswith(c)) /
                  sum(err(base, s).sum() for s in settings if s.startswith(c)) for c in ("noise", "blur")]
        assert float(r.statistic(r.values[row], None)) == pytest.approx(100.0 * np.mean(ratios), rel=1e-12)
    iv = paired_bootstrap([b.values], [r.values], resamples=200, statistic=r.statistic)
    assert iv["lo"] < iv["diff"] < iv["hi"] < 0          # the RPC record errs less
    # records over different examples cannot be paired: no recomputed data (the caller falls back)
    assert mce_example_data(rpc, dict(base, indices="1:201")) is None


def test_a_statistic_of_column_sums_bootstraps_to_the_same_interval_as_the_gathered_resamples():
    """The draw-count path (``of_column_sums``) against the plain gather of every resample, on integer
    per-image counts (mIoU) and 0/1 errors (mCE) with strata: the sums are integers, so equal exactly."""
    import functools

    from rpc_attention.evaluate.per_example import _miou, of_column_sums
    from rpc_attention.report.mce import mce_statistic

    rng = np.random.default_rng(3)
    n, classes = 37, 4
    seg = [rng.integers(0, 50, size=(n, 2 * 3 * classes)).astype(np.float64) for _ in range(4)]
    groups = np.kron(np.eye(2), np.ones((3, 1)))  # 6 settings -> 2 corruptions
    err = [rng.integers(0, 2, size=(n, 12)).astype(np.float64) for _ in range(4)]
    strata = rng.integers(0, 2, size=n)
    for plain, values in ((functools.partial(_miou, classes=classes), seg),
                          (functools.partial(mce_statistic, groups=groups), err)):
        summed = of_column_sums(functools.partial(plain.func, **plain.keywords))
        for st in (None, strata):
            a = paired_bootstrap(values[:2], values[2:], 300, seed=5, statistic=plain, strata=st)
            b = paired_bootstrap(values[:2], values[2:], 300, seed=5, statistic=summed, strata=st)
            assert a == b
    assert not getattr(functools.partial(_miou, classes=classes), "column_sums", False)
