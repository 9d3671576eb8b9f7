"""Verdict rules on synthetic numbers: each branch of RULES_TEXT."""

import math

import pytest

from rpc_attention.report.verdict import (
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    RULES_TEXT,
    SINGLE_SEED_FACTOR,
    effect,
    verdict,
)


def test_effect_orientation_and_sigma():
    e = effect([10.0, 12.0], [13.0, 15.0], higher_is_better=True, margin=1.0)
    assert e.delta == pytest.approx(3.0) and e.raw_diff == pytest.approx(3.0)
    assert e.sigma == pytest.approx(math.sqrt(2.0))      # sample std of (10, 12) and (13, 15)
    e = effect([36.0], [35.0], higher_is_better=False, margin=0.02, relative_margin=True)
    assert e.delta == pytest.approx(1.0) and e.raw_diff == pytest.approx(-1.0)
    assert e.margin == pytest.approx(0.72) and e.sigma is None


def test_reproduced_beyond_two_sigma():
    v = verdict([70.0, 70.2, 69.8], [72.0, 72.2, 71.8], higher_is_better=True, margin=1.0)
    assert v["verdict"] == REPRODUCED and "2 sigma" in v["reason"]


def test_lower_is_better_direction():
    # RPC lowers mCE clearly: reproduced; raises it clearly: not reproduced
    assert verdict([100, 100.5, 99.5], [90, 90.5, 89.5], higher_is_better=False)["verdict"] == REPRODUCED
    assert verdict([90, 90.5, 89.5], [100, 100.5, 99.5], higher_is_better=False)["verdict"] == NOT_REPRODUCED


def test_worse_beyond_noise_is_not_reproduced():
    v = verdict([72.0, 72.1, 71.9], [70.0, 70.1, 69.9])
    assert v["verdict"] == NOT_REPRODUCED and "worse" in v["reason"]


def test_within_noise_small_sigma_is_not_reproduced():
    # difference 0.1 within 2 sigma = 0.2, and 2 sigma < margin 1: an effect of 1 point would have shown
    v = verdict([70.0, 70.1, 69.9], [70.1, 70.2, 70.0], margin=1.0)
    assert v["verdict"] == NOT_REPRODUCED and "no effect of the claimed size" in v["reason"]


def test_within_noise_large_sigma_is_inconclusive():
    v = verdict([68.0, 72.0, 70.0], [69.0, 73.0, 71.0], margin=1.0)
    assert v["verdict"] == INCONCLUSIVE


def test_single_seed_rules():
    assert verdict([70.0], [75.0])["verdict"] == INCONCLUSIVE        # big gain, but one seed
    assert "better" in verdict([70.0], [75.0])["reason"]
    assert verdict([70.0], [70.0 - SINGLE_SEED_FACTOR * 1.0 + 0.01])["verdict"] == INCONCLUSIVE
    v = verdict([70.0], [70.0 - SINGLE_SEED_FACTOR * 1.0 - 0.01])
    assert v["verdict"] == NOT_REPRODUCED and "single seed" in v["reason"]
    # one seed on one side only: still no noise estimate
    assert verdict([70.0, 71.0], [80.0])["verdict"] == INCONCLUSIVE


def test_missing_numbers():
    assert verdict([], [70.0])["verdict"] == NOT_MEASURED
    assert verdict([70.0], [float("nan")])["verdict"] == NOT_MEASURED


def test_rules_text_states_every_rule():
    for word in ("reproduced", "not reproduced", "inconclusive at this scale", "2 sigma", "margin", "One seed",
                 "not measured"):
        assert word in RULES_TEXT
