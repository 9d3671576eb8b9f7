"""The second plan format's parts (reproduce.design): targets on the natural scale, the sd bound, the cost
model, the probability that a claim is decided, the allocation, and the seed-major stage order."""

import math

import numpy as np
import pytest
from scipy import stats

from rpc_attention.reproduce import design as G
from rpc_attention.reproduce.specs import StudyError


def test_log_odds_target_by_hand_and_never_past_the_ceiling():
    row = {"baseline": 17.43, "rpc": 20.35, "higher": True}
    got = G.natural_target(row, "logit", 89.78)
    step = math.log(0.2035 / 0.7965) - math.log(0.1743 / 0.8257)
    want = 100 / (1 + math.exp(-(math.log(0.8978 / 0.1022) + step))) - 89.78
    assert got["target"] == pytest.approx(want, rel=1e-12) and got["margin"] == pytest.approx(0.25 * want)
    for ours in (50.0, 90.0, 99.0, 99.9):
        t = G.natural_target(row, "logit", ours)["target"]
        assert 0 < t < 100 - ours
    # the first format's relative rule asked 14.68 points of an 87.6 baseline: the log-odds step asks far less
    assert G.natural_target(row, "logit", 87.6)["target"] < 2.0


def test_log_scale_target_is_the_relative_change_and_lower_is_better():
    row = {"baseline": 36.36, "rpc": 35.26, "higher": False}
    got = G.natural_target(row, "log", 288.92)
    assert got["target"] == pytest.approx(288.92 * (1 - 35.26 / 36.36), rel=1e-12)
    with pytest.raises(ValueError, match="no improvement"):
        G.natural_target({"baseline": 30.0, "rpc": 29.0, "higher": True}, "logit", 50.0)
    with pytest.raises(ValueError, match="between 0 and 100"):
        G.natural_target(row | {"higher": True, "baseline": 20.0, "rpc": 30.0}, "logit", 100.0)


def test_kernel_pca_targets():
    assert G.kpca_target("k1", -2.0)["target"] == pytest.approx(0.2)
    assert G.kpca_target("k2", 0.18)["target"] == pytest.approx(0.82)
    with pytest.raises(ValueError):
        G.kpca_target("k3", 0.1)


def test_sd_upper_bound_covers_the_true_sd_at_its_level():
    rng = np.random.default_rng(0)
    n = 5
    sds = rng.normal(0.0, 1.0, size=(20000, n)).std(axis=1, ddof=1)
    bounds = np.array([G.sd_upper(s, n) for s in sds[:4000]])
    assert abs(float(np.mean(bounds >= 1.0)) - G.SD_LEVEL) < 0.02
    assert G.sd_upper(1.0, 19) == pytest.approx(math.sqrt(18 / stats.chi2.ppf(0.2, 18)))


def test_cost_model_scales_above_its_fixed_part():
    cm = G.CostModel(train={"a": 40.0}, evals={"clean:a": {"s": 12.0, "examples": 1000},
                                               "ood:a": {"s": 3.0, "examples": None}}, fixed_s=2.0)
    assert cm.eval_s("clean", "a", 2000) == pytest.approx(2.0 + 10.0 * 2)
    assert cm.eval_s("ood", "a", 5000) == 3.0
    assert G.CostModel.from_dict(cm.as_dict()) == cm
    with pytest.raises(StudyError, match="no time of pgd"):
        cm.eval_s("pgd", "a", 10)


def _res(cpu, stages):
    return {"setup": {"cpu": cpu}, "stages": [{"name": n, "status": "done", "cpu_s": s} for n, s in stages],
            "evals": {"clean": {"a": {"1": {"n_examples": 1000}}, "b": {"1": {"n_examples": 1000}}}}}


def test_cost_model_from_stages_fills_in_from_a_reference_at_the_measured_ratio():
    here = _res("Intel", [("train.a-s1", 30.0), ("eval.a-s1.clean", 6.0)])
    ref = _res("AMD", [("train.a-s2", 40.0), ("train.b-s2", 80.0), ("eval.a-s2.clean", 8.0), ("eval.b-s2.clean", 16.0)])
    cm = G.build_cost_model([("here", here)], ("ref", ref))
    assert cm.cpu == "Intel" and cm.train["a"] == 30.0 and cm.train["b"] == pytest.approx(60.0)
    assert cm.evals["clean:b"]["s"] == pytest.approx(12.0)


def test_decide_probability_against_a_simulation():
    delta, se, n, margin, target, family = 0.9, 0.4, 20, 0.3, 1.2, 10
    p = G.decide_probability(delta, se, n, margin, target, family)
    c2 = stats.t.ppf(1 - 0.05 / (2 * family), n - 1)
    c1 = stats.t.ppf(1 - 0.05 / family, n - 1)
    x = np.random.default_rng(1).normal(delta, se, size=200000)
    sim = float(np.mean((x > margin + c2 * se) | (x < target - c1 * se)))
    assert p == pytest.approx(sim, abs=0.005)
    assert G.decide_probability(0.0, 0.01, n, margin, target, family) == 1.0   # se small: every outcome decides


def _claims():
    return [G.ClaimPlan("c", "clean", "s", "r", 1.5, 0.7, 0.01, 0.0, 1000, 0.9, 0.225, 8000),
            G.ClaimPlan("aa", "autoattack", "s", "r", 1.3, 3.0, 3.0, 0.0, 100, 1.9, 0.475, 8000)]


def test_allocation_stays_in_budget_and_runs_cheap_suites_on_every_seed():
    cm = G.CostModel(train={"s": 30.0, "r": 40.0}, evals={"clean:s": {"s": 3.0, "examples": 1000},
                                                          "clean:r": {"s": 4.0, "examples": 1000},
                                                          "autoattack:s": {"s": 300.0, "examples": 100},
                                                          "autoattack:r": {"s": 400.0, "examples": 100}})
    claims = _claims()
    d, spent = G.allocate(claims, cm, 20000.0, 2, {"v": ("s", "r")})
    assert spent <= 20000.0 and spent == pytest.approx(G.design_cost(claims, d, cm))
    assert G.claim_n(claims[0], d) == d.seeds["s"] == d.seeds["r"]
    assert G.claim_n(claims[1], d) <= d.seeds["s"]
    with pytest.raises(StudyError, match="raise --budget-hours"):
        G.allocate(claims, cm, 10.0, 2, {"v": ("s", "r")})
