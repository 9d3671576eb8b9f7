"""Power from measured variance: ``rpc-attention reproduce --power DIR`` on a finished study's
results.json, the report's power rows against a hand computation, and the example-level MDE."""

import json
import math

import pytest
from scipy import stats

from rpc_attention.cli import main
from rpc_attention.report.families import power_rows
from rpc_attention.report.power import example_mde, examples_needed, mde, power, seeds_needed


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
    # the seed MDE: 80 % of the noncentral t past Holm's strictest critical value (family of 2)
    crit = stats.t.ppf(1 - 0.05 / 4, 2)
    assert stats.nct.sf(crit, 2, (clean["seed_mde"] - 0.25) * math.sqrt(3) / sd) == pytest.approx(0.8, abs=1e-8)
    # the example MDE: the 95 % interval [0.4, 2.2] read as normal, se = 1.8 / (2 x 1.96)
    se = 1.8 / (2 * stats.norm.ppf(0.975))
    assert clean["example_mde"] == pytest.approx(0.25 + (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * se, rel=1e-12)
    assert clean["mde"] == max(clean["seed_mde"], clean["example_mde"]) and clean["meets_target"] is False
    assert clean["seeds_needed"] == seeds_needed(1.0, sd, 0.25, family=2)
    assert rows["mce"]["delta"] == pytest.approx(25 / 3) and rows["mce"]["example_mde"] is None
    assert rows["fgsm"]["seed_mde"] is None and rows["fgsm"]["mde"] is None     # one seed: no noise figure
    assert rows["fgsm"]["example_mde"] is not None and rows["fgsm"]["meets_target"] is None


def test_examples_needed_makes_the_example_mde_the_target():
    n = examples_needed(0.4, 2.2, 2000, target=1.0, margin=0.25)
    scale = math.sqrt(2000 / n)   # the interval's width at n examples
    assert example_mde(1.3 - 0.9 * scale, 1.3 + 0.9 * scale, 0.25) == pytest.approx(1.0, abs=1e-3)
    assert examples_needed(0.4, 2.2, 2000, target=0.2, margin=0.25) is None


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
    assert f"| {seeds_needed(2.0, sd, 0.25, family=2)} |" in capsys.readouterr().out
    assert main(["reproduce", "--power", str(tmp_path), "--target", "nope=1"]) == 2
    assert "not a claim of this study" in capsys.readouterr().err
    assert main(["reproduce", "--power", str(tmp_path / "missing")]) == 2


def test_power_and_mde_agree():
    assert power(mde(1.0, 5, 0.2, family=3), 1.0, 5, 0.2, family=3) == pytest.approx(0.8, abs=1e-8)
    assert mde(0.0, 5) is None and mde(1.0, 1) is None
