"""The publish views beyond a whole table: a table's columns by suite, the views a `decide`-shaped study
needs (primary and own verdicts, power, run), and the drift between two published runs of one study."""

import copy
import json
from pathlib import Path

import pytest

from rpc_attention.report.publish import Context, PublishError, publish_results, render_view, stale_blocks


def _cell(m: float, s: float = 0.5) -> dict:
    return {"n": 3, "mean": m, "std": s, "values": [m - s, m, m + s]}


def _claim(cid: str, family: str, diffs: list, rpc: str = "rpc6", higher: bool = True, target: float = 1.0,
           verdict: str = "inconclusive") -> dict:
    n = len(diffs)
    d = sum(diffs) / n
    return {"id": cid, "title": f"claim {cid}", "suite": "clean", "metric": "top1", "higher": higher, "table": "vision",
            "margin": target / 4, "target": target, "family": family, "verdict": verdict, "rpc": rpc,
            "intervals": {"per_seed_diff": {str(i): x for i, x in enumerate(diffs)}, "family": 2,
                          "seed_ci": {"diff": d, "lo": d - 1.0, "hi": d + 1.0, "n": n},
                          "bootstrap": {"pooled": {"diff": d, "lo": d - 0.5, "hi": d + 0.5, "n_examples": 2000}}}}


def _results(study: str = "quick", clean_rpc: float = 81.25, shift: float = 0.0) -> dict:
    return {
        "study": study, "generated": "2026-12-03 20:00 UTC",
        "setup": {"cpu": "Test CPU", "cpu_count": 2, "versions": {"torch": "2.14.1"}},
        "stages": [{"name": "train.a", "kind": "train", "status": "done", "seconds": 60.0, "cpu_s": 100.0},
                   {"name": "train.b", "kind": "train", "status": "done", "seconds": 30.0, "cpu_s": 50.0}],
        "tables": {"vision": {
            "title": "Image classification",
            "columns": [{"key": "clean:top1", "header": "clean top-1"}, {"key": "ood:AUPR_msp", "header": "OOD AUPR"}],
            "rows": [{"label": "SymViT", "cells": {"clean:top1": _cell(80.0), "ood:AUPR_msp": _cell(60.0)}},
                     {"label": "RPC", "cells": {"clean:top1": _cell(clean_rpc), "ood:AUPR_msp": _cell(61.0)}}],
            "paper": {"baseline": {"clean:top1": {"value": 70.44}, "ood:AUPR_msp": {"value": 17.43}},
                      "rpc": {"clean:top1": {"value": 71.49, "change": "6 iters"},
                              "ood:AUPR_msp": {"value": 20.35, "change": "5 iters"}}}}},
        "claims": [_claim("clean", "primary", [0.5 + shift, 1.25, 2.0]),
                   _claim("mce", "primary", [8.0, 9.0, 10.0], higher=False, target=3.0)],
    }


def test_a_table_view_can_show_the_columns_of_some_suites():
    md = render_view(_results(), "table:vision:ood")
    assert "| model | OOD AUPR |" in md and "clean top-1" not in md and "81.25" not in md
    assert "| *paper: baseline (ImageNet-scale)* | 17.43 |" in md and "70.44" not in md
    both = render_view(_results(), "table:vision:clean,ood")
    assert both == render_view(_results(), "table:vision")
    with pytest.raises(PublishError, match="no column of suite.*pgd.*its suites: clean, ood"):
        render_view(_results(), "table:vision:pgd")


def test_views_of_evaluations_the_results_lack_are_one_clear_error():
    for view, suite in (("eps:pgd", "pgd"), ("corruptions", "corruptions"), ("sparse", "sparse")):
        with pytest.raises(PublishError, match=f"no '{suite}' evaluations"):
            render_view(_results(), view)
    with pytest.raises(PublishError, match="no S-activity record of rpc6"):
        render_view(_results(), "sparsity:rpc6")


def _decide() -> dict:
    """A `decide`-shaped study: 21 seeds of SymViT, RPC-6 (primary: clean, mCE) and robust PAP (own)."""
    res = _results(study="decide")
    res["claims"] = [_claim("clean", "primary", [1.0 + 0.1 * (i % 5) for i in range(21)]),
                     _claim("mce", "primary", [-3.0 - 0.2 * (i % 7) for i in range(21)], higher=False, target=3.0,
                            verdict="reproduced"),
                     _claim("sparse_keys", "own", [30.0 + (i % 3) for i in range(21)], rpc="rpc_robust", target=5.0,
                            verdict="reproduced")]
    for c in res["claims"]:
        c["intervals"]["family"] = 2 if c["family"] == "primary" else 1
    return res


def test_the_decide_study_renders_its_primary_verdicts_power_and_run_line():
    res = _decide()
    primary = render_view(res, "verdicts:primary")
    assert "### Primary" in primary and "claim clean" in primary and "claim mce" in primary
    assert "sparse_keys" not in primary and "**reproduced**" in primary and "*Rule: confirmatory" in primary
    own = render_view(res, "verdicts:own")
    assert "claim sparse_keys" in own and "claim clean" not in own
    power = render_view(res, "power")
    rows = [line for line in power.splitlines() if line.startswith("| claim ") and "family" not in line]
    assert [r.split(" | ")[1:3] for r in rows] == [["primary", "21"], ["primary", "21"]]  # own claims: not in it
    assert render_view(res, "run").startswith("`decide` study, 2 of 2 stages done; 1m30s of stage time")
    # a report stage (running while it writes the results) counts among the stages, as --dry-run counts it
    res["stages"] = res["stages"] + [{"name": "report", "kind": "report", "status": "running"}]
    assert render_view(res, "run").startswith(
        "`decide` study, 3 stages: 2 of 2 done and the report, which wrote these results; 1m30s of stage time")


def test_power_without_primary_claims_is_an_error():
    res = _decide()
    res["claims"] = [c for c in res["claims"] if c["family"] != "primary"]
    with pytest.raises(PublishError, match="no primary claim"):
        render_view(res, "power")


def _drift(a: dict, b: dict) -> str:
    published = {"quick": a, "quick-avx2": b}
    return render_view(a, "drift:quick-avx2", Context("quick", published.__getitem__))


def test_drift_gives_both_differences_the_change_and_the_largest_change_per_table():
    a, b = _results(), _results(clean_rpc=81.75, shift=0.3)
    b["setup"].update(cpu="Other CPU", cpu_capability="AVX2")
    b["claims"][1]["verdict"] = "reproduced"
    md = _drift(a, b)
    assert md.startswith("`quick` (Test CPU, generated 2026-12-03 20:00 UTC) against `quick-avx2` (Other CPU, "
                         "AVX2 kernels, generated")
    # clean: per-seed differences 0.5 / 1.25 / 2.0 against 0.8 / 1.25 / 2.0: the mean moves by 0.1
    assert "| claim clean | +1.25 [+0.25, +2.25] | +1.35 [+0.35, +2.35] | 0.10 | inconclusive |" in md
    assert "| claim mce | +9.00 [+8.00, +10.00] | +9.00 [+8.00, +10.00] | 0.00 | inconclusive → reproduced |" in md
    # one cell of four moved, by 0.5, in RPC's clean top-1
    assert "| vision | 4 | 3 | 0.50 | RPC, clean top-1 |" in md
    assert md.rstrip().endswith("Largest |change|, vision: 0.10 in a claim's difference, 0.50 in a cell's mean; "
                                "verdicts that differ: 1 of 2.")
    assert "| vision | 4 | 4 | 0.00 |" in _drift(a, copy.deepcopy(a))
    summary = render_view(a, "drift:quick-avx2:summary", Context("quick", {"quick-avx2": b}.__getitem__))
    assert summary == ("`quick` (Test CPU, generated 2026-12-03 20:00 UTC) against `quick-avx2` (Other CPU, AVX2 "
                       "kernels, generated 2026-12-03 20:00 UTC). Largest |change|, vision: 0.10 in a claim's difference, 0.50 in a "
                       "cell's mean; verdicts that differ: 1 of 2.\n")


def test_drift_compares_runs_of_one_study_only():
    with pytest.raises(PublishError, match="'decide' study.*'quick' study"):
        _drift(_results(), _results(study="decide"))
    with pytest.raises(PublishError, match="drift:NAME"):
        render_view(_results(), "drift")
    with pytest.raises(PublishError, match="only ':summary'"):
        render_view(_results(), "drift:quick:all", Context("quick", {"quick": _results()}.__getitem__))


def test_drift_blocks_are_rendered_and_checked_from_two_published_files(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- results quick drift:quick-avx2 -->\n<!-- /results -->\n")
    for name, res in (("quick", _results()), ("quick-avx2", _results(clean_rpc=81.75))):
        study = tmp_path / name
        study.mkdir()
        (study / "results.json").write_text(json.dumps(res))
    with pytest.raises(PublishError, match="no published results .*quick-avx2.json"):
        publish_results(tmp_path / "quick", tmp_path, "quick")  # the block needs the other results too
    publish_results(tmp_path / "quick-avx2", tmp_path, "quick-avx2")
    assert "| vision | 4 | 3 | 0.50 | RPC, clean top-1 |" in (tmp_path / "README.md").read_text()
    assert stale_blocks(tmp_path) == []


def test_the_setup_records_the_cpu_kernels_and_the_variables_that_cap_them():
    import torch

    from rpc_attention.report.collect import setup_info
    from rpc_attention.reproduce import get_study

    setup = setup_info(get_study("smoke"), environ={"ONEDNN_MAX_CPU_ISA": "AVX2", "HOME": "/x"})
    assert setup["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert setup["kernel_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_the_cost_view_sums_estimates_and_measured_time_per_group_of_finished_stages():
    def stage(name, kind, est, cpu, wall, status="done"):
        return {"name": name, "kind": kind, "estimate_s": est, "cpu_s": cpu, "seconds": wall, "status": status}

    res = {"stages": [stage("train.a-s0", "train", 40.0, 50.0, 60.0), stage("train.b-s0", "train", 40.0, 30.0, 35.0),
                      stage("eval.a-s0.square", "eval", 30.0, 180.0, 190.0),
                      stage("eval.b-s0.square", "eval", 30.0, 99.0, 99.0, status="failed"),
                      stage("report", "report", 0.0, 5.0, 5.0)]}
    rows = [line.split(" | ") for line in render_view(res, "cost").splitlines()[2:] if line]
    assert [r[0].lstrip("| ") for r in rows] == ["eval: square", "train", "**all**"]  # by CPU time, then the total
    assert rows[0][1:] == ["1", "30s", "3m00s", "3m10s", "6.00 |"]
    assert rows[1][1:] == ["2", "1m20s", "1m20s", "1m35s", "1.00 |"]
    assert rows[2][1:] == ["3", "1m50s", "4m20s", "4m45s", "2.36 |"]
    with pytest.raises(PublishError, match="no finished stages"):
        render_view({"stages": [stage("report", "report", 0.0, 1.0, 1.0)]}, "cost")


def test_the_scorecard_count_view_is_the_first_line_of_the_scorecard():
    res = json.loads((Path(__file__).resolve().parents[2] / "docs/results/paper.json").read_text(encoding="utf-8"))
    full = render_view(res, "scorecard")
    count = render_view(res, "scorecard:count")
    assert "\n" not in count.strip() and full.startswith(count.strip())
    assert count.startswith("**14 claims:") and "reproduced" in count
    with pytest.raises(PublishError, match="scorecard:count"):
        render_view(res, "scorecard:counts")
