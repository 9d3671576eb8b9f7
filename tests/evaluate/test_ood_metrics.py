"""OOD metrics against hand-computed values and sklearn."""

from __future__ import annotations

import numpy as np
import pytest

from rpc_attention.evaluate.ood import aupr, auroc, fpr_at_recall, msp_score, ood_metrics


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


def test_against_sklearn_with_ties():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.RandomState(0)
    si = np.round(rng.randn(300), 1)  # rounding creates many ties
    so = np.round(rng.randn(200) + 0.7, 1)
    y = np.r_[np.zeros(300), np.ones(200)]
    s = np.r_[si, so]
    assert auroc(si, so) == pytest.approx(sk.roc_auc_score(y, s), abs=1e-12)
    assert aupr(si, so) == pytest.approx(sk.average_precision_score(y, s), abs=1e-12)
    fpr, tpr, _ = sk.roc_curve(y, s)
    assert fpr_at_recall(si, so, 0.95) == pytest.approx(fpr[np.searchsorted(tpr, 0.95)], abs=1e-12)
    m = ood_metrics(si, so)
    assert set(m) == {"AUPR", "AUROC", "FPR95"} and 0 <= m["AUPR"] <= 100


def test_msp_score_and_class_restriction():
    import torch

    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    s = msp_score(logits)
    assert s[1] == pytest.approx(-1 / 3) and s[0] < s[1]
    s2 = msp_score(logits, classes=[1, 2])
    assert torch.allclose(s2, torch.tensor([-0.5, -0.5]))


def test_bad_scores():
    with pytest.raises(ValueError):
        auroc([], [1.0])
    with pytest.raises(ValueError):
        aupr([float("nan")], [1.0])
