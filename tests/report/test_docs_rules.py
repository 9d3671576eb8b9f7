"""docs/reproduce.md states the rule's constants as the code has them: the margins, the t quantiles of
the MDE at three seeds, the pilot's figures and the seeds `decide` takes from them. A change of the code
that leaves the text behind fails here (the study numbers themselves are rendered blocks,
tests/report/test_publish.py)."""

import re
from pathlib import Path

from scipy import stats

from rpc_attention.reproduce.study_data import DECIDE_SEEDS, MARGIN_SHARE, PILOT, TARGETS, pilot_seeds

TEXT = " ".join((Path(__file__).resolve().parents[2] / "docs" / "reproduce.md").read_text(encoding="utf-8").split())


def test_the_margins_are_a_quarter_of_the_targets():
    m = {k: f"{MARGIN_SHARE * v:g}" for k, v in TARGETS.items()}
    assert (f"{m['clean']} points of clean top-1, {m['fgsm']} of FGSM and PGD, {m['mce']} mCE points, "
            f"{m['sparse_keys']} points for the robust key-corruption claim") in TEXT
    assert m["fgsm"] == m["pgd"]


def test_the_mde_quantiles_at_three_seeds():
    two, power, one = stats.t.ppf(1 - 0.05 / 4, 2), stats.t.ppf(0.8, 2), stats.t.ppf(1 - 0.05 / 2, 2)
    assert f"`t(1 − 0.05/4, 2)` = {two:.1f} and `t(0.8, 2)` = {power:.2f} (a single claim: {one:.1f})" in TEXT


def test_the_pilot_and_the_seeds_of_decide():
    (c, cr), (m, mr), (k, kr) = PILOT["clean"], PILOT["mce"], PILOT["sparse_keys"]
    assert f"clean +{c:g}, {cr:g}; mCE +{m:g}, {mr:g}; robust key corruption +{k:g}, {kr:g}" in TEXT
    seeds = pilot_seeds()
    assert (f"clean {seeds['clean']}, mCE {seeds['mce']}, key corruption {seeds['sparse_keys']}, so `decide` "
            f"trains {DECIDE_SEEDS} seeds") in TEXT
    assert len(re.findall(rf"\b{DECIDE_SEEDS} seeds\b", TEXT)) >= 2
