"""Power from measured variance: ``rpc-attention reproduce --power DIR`` on a finished study's
results.json, the report's power rows against a hand computation on the one interval over seeds and
examples."""

import json
import math

import pytest
from scipy import stats

from rpc_attention.cli import main
from rpc_attention.report.families import power_rows
from rpc_attention.report.power import combined_se, mde, power, seeds_needed


def _claim(cid, family, diffs, higher=True, margin=0.25, target=1.0, pooled=None, m=2):
    return {"id": cid, "title": f"claim {cid}", "family": family, "higher": higher, "margin": margin, "target": target,
            "suite": "clean", "metric": "top1", "verdict": "inconclusive",
            "intervals": {"per_seed_diff": {str(i): d for i, d in enumerate(diffs)}, "family": m,
                          "bootstrap": {"pooled": pooled} if pooled else None}}


def _results(tmp_path):
    res = {"claims": [
        _claim("clean", "primary", [1.0, 2.5, 0.3], pooled={"lo": 0.4, "hi": 2.2, "n_examples": 2000}),
        # lower is better: -8 error points are +8 in the paper's direction
        _claim("mce", "primary", [-8.0, -11.0, -6.0], higher=False, margin=0.75, target=3.0),
        # one seed: an example interval alone gives no MDE (no noise figure across training seeds)
        _claim("fgsm", "secondary", [0.5], m=0, pooled={"lo": 0.1, "hi": 0.9, "n_examples": 500}),
    ]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    return res


def test_power_rows_against_a_hand_computation(tmp_path):
    rows = {r["id"]: r for r in power_rows(_results(tmp_path))}
    d = [1.0, 2.5, 0.3]
    sd = stats.tstd(d)
    clean = rows["clean"]
    assert clean["delta_over_sd"] == pytest.approx((sum(d) / 3) / sd, rel=1e-12)
    # the example part: the 95 % interval [0.4, 2.2] read as normal, se = 1.8 / (2 x 1.96)
    se_ex = 1.8 / (2 * stats.norm.ppf(0.975))
    assert clean["se_examples"] == pytest.approx(se_ex, rel=1e-12)
    assert clean["se_seeds"] == pytest.approx(sd / math.sqrt(3), rel=1e-12)
    # one se over both parts, on the seeds' n - 1 df (written out here)
    se, df = math.sqrt(sd ** 2 / 3 + se_ex ** 2), 2
    # the MDE: 80 % of the noncentral t past Holm's strictest critical value (family of 2) on that se and df
    crit = stats.t.ppf(1 - 0.05 / 4, df)
    assert stats.nct.sf(crit, df, (clean["mde"] - 0.25) / se) == pytest.approx(0.8, abs=1e-8)
    assert clean["meets_target"] is False
    assert clean["seeds_needed"] == seeds_needed(1.0, sd, 0.25, family=2, se_examples=se_ex)
    # without an example part the interval is the seeds' t interval (df = n - 1)
    assert rows["mce"]["delta"] == pytest.approx(25 / 3) and rows["mce"]["se_examples"] == 0.0
    sd_m = stats.tstd([8.0, 11.0, 6.0])
    crit = stats.t.ppf(1 - 0.05 / 4, 2)
    assert stats.nct.sf(crit, 2, (rows["mce"]["mde"] - 0.75) * math.sqrt(3) / sd_m) == pytest.approx(0.8, abs=1e-8)
    assert rows["fgsm"]["mde"] is None and rows["fgsm"]["meets_target"] is None   # one seed: no noise figure


def test_combined_se_adds_the_variances_on_the_seeds_df():
    se, df = combined_se(2.0, 4, 0.0)
    assert float(se) == pytest.approx(1.0) and float(df) == pytest.approx(3.0)
    se, df = combined_se(2.0, 4, 1.0)
    assert float(se) == pytest.approx(math.sqrt(2.0)) and float(df) == pytest.approx(3.0)
    se, df = combined_se(0.0, 4, 0.5)
    assert float(se) == pytest.approx(0.5) and float(df) == pytest.approx(3.0)
    # more examples (a smaller example part) never need more seeds
    assert seeds_needed(1.0, 1.0, 0.25, se_examples=0.1) <= seeds_needed(1.0, 1.0, 0.25, se_examples=0.2)
    # an example part larger than the target allows: no number of seeds reaches the power
    assert seeds_needed(1.0, 1.0, 0.25, se_examples=1.0) is None


def test_power_command_prints_every_claim(tmp_path, capsys):
    _results(tmp_path)
    assert main(["reproduce", "--power", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| claim clean | primary | 3 |" in out and "| claim mce | primary | 3 | 8.33 |" in out
    assert "| claim fgsm | secondary | 1 |" in out and "no noise figure (one seed)" in out
    assert "misses it by" in out
    # a target of the user's: the seeds it needs change with it
    assert main(["reproduce", "--power", str(tmp_path), "--target", "clean=2.0"]) == 0
    sd = stats.tstd([1.0, 2.5, 0.3])
    se_ex = 1.8 / (2 * stats.norm.ppf(0.975))
    assert f"| {seeds_needed(2.0, sd, 0.25, family=2, se_examples=se_ex)} |" in capsys.readouterr().out
    assert main(["reproduce", "--power", str(tmp_path), "--target", "nope=1"]) == 2
    assert "not a claim of this study" in capsys.readouterr().err
    assert main(["reproduce", "--power", str(tmp_path / "missing")]) == 2


def test_power_and_mde_agree():
    assert power(mde(1.0, 5, 0.2, family=3), 1.0, 5, 0.2, family=3) == pytest.approx(0.8, abs=1e-8)
    got = mde(1.0, 5, 0.2, family=3, se_examples=0.3)
    assert power(got, 1.0, 5, 0.2, family=3, se_examples=0.3) == pytest.approx(0.8, abs=1e-8)
    assert mde(0.0, 5) is None and mde(1.0, 1) is None
