"""OOD metrics against hand-computed values and a float64 reference written from the definitions."""

from __future__ import annotations

import numpy as np
import pytest

from rpc_attention.evaluate.ood import (
    aupr,
    auroc,
    energy_score,
    fpr_at_recall,
    max_logit_score,
    msp_score,
    ood_metric,
    ood_metrics,
    ood_scores,
)
from rpc_attention.evaluate.per_example import roc_area


def test_hand_computed_toy():
    # OOD positive. in: 0.1 0.4 0.35 0.8 ; ood: 0.9 0.6 0.5 0.3 (higher = more OOD)
    si = [0.1, 0.4, 0.35, 0.8]
    so = [0.9, 0.6, 0.5, 0.3]
    # pairs ood > in: 0.9>4, 0.6>3, 0.5>3, 0.3>1 -> 11 of 16
    assert auroc(si, so) == pytest.approx(11 / 16)
    # ranking: .9(o) .8(i) .6(o) .5(o) .4(i) .35(i) .3(o) .1(i)
    # AP = 1/4 * (1/1 + 2/3 + 3/4 + 4/7)
    assert aupr(si, so) == pytest.approx((1 + 2 / 3 + 3 / 4 + 4 / 7) / 4)
    # 95 % recall needs all 4 OOD -> threshold 0.3 -> in-dist >= 0.3: 0.4 0.35 0.8 -> 3/4
    assert fpr_at_recall(si, so, 0.95) == pytest.approx(0.75)
    # 50 % recall -> threshold 0.6 -> in >= 0.6: 0.8 -> 1/4
    assert fpr_at_recall(si, so, 0.5) == pytest.approx(0.25)


def test_ties_and_perfect_separation():
    assert auroc([0.5, 0.5], [0.5, 0.5]) == pytest.approx(0.5)
    assert auroc([0.0, 0.1], [0.5, 0.7]) == 1.0 and aupr([0.0, 0.1], [0.5, 0.7]) == 1.0
    assert fpr_at_recall([0.0, 0.1], [0.5, 0.7]) == 0.0
    assert auroc([0.5, 0.7], [0.0, 0.1]) == 0.0


def _reference_metrics(si: np.ndarray, so: np.ndarray, recall: float = 0.95):
    """AUROC, AP and FPR at ``recall`` straight from their definitions, in float64 (OOD positive)."""
    si, so = np.asarray(si, np.float64), np.asarray(so, np.float64)
    # AUROC: P(ood > in) + 0.5 P(ood == in) over every (ood, in) pair
    auroc_ref = ((so[:, None] > si[None, :]).mean() + 0.5 * (so[:, None] == si[None, :]).mean())
    # AP: at each distinct threshold t (descending) flag every score >= t; sum (R_t - R_prev) * P_t
    ap_ref, prev_recall, fpr_ref = 0.0, 0.0, None
    for t in np.unique(np.r_[si, so])[::-1]:
        tp, fp = float((so >= t).sum()), float((si >= t).sum())
        ap_ref += (tp / so.size - prev_recall) * tp / (tp + fp)
        prev_recall = tp / so.size
        if fpr_ref is None and tp >= recall * so.size:  # the largest threshold reaching the recall
            fpr_ref = fp / si.size
    return auroc_ref, ap_ref, fpr_ref


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_float64_reference_with_ties(seed):
    rng = np.random.RandomState(seed)
    si = np.round(rng.randn(300), 1)  # rounding creates many ties, within and across the two sets
    so = np.round(rng.randn(200) + 0.7, 1)
    auroc_ref, ap_ref, fpr_ref = _reference_metrics(si, so)
    # Each metric is a sum of at most ~500 float64 terms in [0, 1]: rounding error stays below
    # 500 * eps(float64) ~ 1e-13, so 1e-12 separates a different definition from summation order.
    assert auroc(si, so) == pytest.approx(auroc_ref, abs=1e-12)
    assert aupr(si, so) == pytest.approx(ap_ref, abs=1e-12)
    assert fpr_at_recall(si, so, 0.95) == pytest.approx(fpr_ref, abs=1e-12)
    m = ood_metrics(si, so)
    assert m == pytest.approx({"AUPR": 100 * ap_ref, "AUROC": 100 * auroc_ref, "FPR95": 100 * fpr_ref}, abs=1e-10)


def test_ood_is_the_positive_class():
    # swapping the two sets must change AUPR (it is not symmetric) and mirror AUROC
    rng = np.random.RandomState(3)
    si, so = rng.randn(50), rng.randn(30) + 1.0
    assert auroc(so, si) == pytest.approx(1.0 - auroc(si, so), abs=1e-12)
    assert aupr(si, so) == pytest.approx(_reference_metrics(si, so)[1], abs=1e-12)
    assert abs(aupr(si, so) - aupr(so, si)) > 0.05


def test_msp_score_and_class_restriction():
    import torch

    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    s = msp_score(logits)
    assert s[1] == pytest.approx(-1 / 3) and s[0] < s[1]
    s2 = msp_score(logits, classes=[1, 2])
    assert s2.dtype == torch.float64 and s2.tolist() == [-0.5, -0.5]


def test_max_logit_and_energy_scores_from_their_definitions_in_float64():
    import math

    import torch

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5], [30.0, -30.0, 29.0]])
    rows = logits.double().tolist()
    assert max_logit_score(logits).tolist() == [-max(r) for r in rows]
    energy = [-math.log(sum(math.exp(v) for v in r)) for r in rows]
    assert energy_score(logits).tolist() == pytest.approx(energy, abs=1e-12)  # float64 sums of 3 terms
    assert energy_score(logits, classes=[1, 2])[0].item() == pytest.approx(-math.log(1 + math.exp(-1)), abs=1e-12)
    every = ood_scores(logits)
    assert list(every) == ["msp", "max_logit", "energy"] and every["energy"].tolist() == energy_score(logits).tolist()
    # a higher score means more OOD: the confident first row scores lowest under each of them
    assert all(every[k][0] < every[k][1] for k in every)


def test_ood_metric_names_say_which_score_produced_them():
    assert ood_metric("AUPR", "energy") == "AUPR_energy" and ood_metric("FPR95", "msp") == "FPR95_msp"
    with pytest.raises(ValueError, match="scores msp, max_logit, energy"):
        ood_metric("AUPR", "softmax")


@pytest.mark.parametrize("seed", [0, 1])
def test_roc_area_of_resamples_is_scikit_learns_auroc_with_ties(seed):
    rng = np.random.RandomState(seed)
    scores = np.round(rng.randn(3, 60), 1)  # ties within and across the classes
    positive = np.r_[np.zeros(35), np.ones(25)]
    want = [auroc(row[:35], row[35:]) for row in scores]
    # a rank sum of 60 float64 values: 1e-12 separates a different definition from summation order
    assert roc_area(scores, positive) == pytest.approx(want, abs=1e-12)


def test_bad_scores():
    with pytest.raises(ValueError):
        auroc([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        aupr([float("nan")], [1.0])
    with pytest.raises(ValueError, match="finite"):
        fpr_at_recall([0.0], [float("inf")])
