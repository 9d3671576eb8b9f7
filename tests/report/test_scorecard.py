"""The scorecard: one row per claim of the paper in the paper's order, the count line, a lead of at most three
sentences, "not run" rows with why and the command, and the README's scorecard equal to the results."""

import json
import re
from pathlib import Path

from rpc_attention.report.paper import KPCA_ROWS, SCORECARD
from rpc_attention.report.publish import render_view
from rpc_attention.report.scorecard import count_line, scorecard_lead, scorecard_lines, scorecard_rows

ROOT = Path(__file__).resolve().parents[2]


def _claim(cid, verdict, diffs, paper_id=None):
    return {"id": cid, "title": f"claim {cid}", "verdict": verdict, "paper_id": paper_id,
            "effect": {"baseline_mean": 80.0, "rpc_mean": 80.0 + sum(diffs) / len(diffs)},
            "intervals": {"per_seed_diff": {str(i): d for i, d in enumerate(diffs)}, "min_detectable": 1.5,
                          "tests": {"interval": {"lo": -0.5, "hi": 2.5}} if len(diffs) > 1 else None}}


RES = {"study": "paper", "plan": {"sha256": "ab" * 32}, "models": {"symvit": {"seeds": [1000, 1001, 1002]}},
       "claims": [_claim("clean", "reproduced", [1.0, 1.2]), _claim("mce", "contradicted", [-1.0, -2.0]),
                  _claim("pgd", "inconclusive", [0.1, 0.3]), _claim("clean_pcp", "reproduced", [5.0, 5.0], "clean"),
                  _claim("lm_ppl", "unresolved (one seed)", [3.0])],
       "not_run": [{"id": "base_clean", "title": "RPC-SymViT-base raises clean top-1", "reason": "needs ImageNet",
                    "command": "rpc-attention reproduce --study imagenet", "cost": "days of 8 GPUs"}]}


def test_one_row_per_claim_of_the_paper_in_its_order():
    rows = scorecard_rows(RES)
    assert [r["id"] for r in rows] == list(SCORECARD) and len(rows) == 14
    by = {r["id"]: r for r in rows}
    assert by["clean"]["verdict"] == "reproduced" and by["clean"]["claim"] == "claim clean"   # not the variant
    assert by["clean"]["paper"] == "70.44 → 71.49" and by["clean"]["ours"] == "80.00 → 81.10"
    assert by["clean"]["difference"] == "+1.10 [-0.50, +2.50]" and by["clean"]["mde"] == "1.50"
    assert by["lm_ppl"]["difference"] == "+3.00 (one seed)"
    assert by["base_clean"]["verdict"] == "not run" and "needs ImageNet" in by["base_clean"]["note"]
    assert "`rpc-attention reproduce --study imagenet`" in by["base_clean"]["note"]
    assert by["scaled_s"]["paper"] == "beats the baseline (no numbers)" and by["scaled_s"]["note"] == "not in this study"


def test_group_means_over_unequal_seeds_say_how_many_the_difference_pairs():
    res = json.loads(json.dumps(RES))
    res["claims"][0]["effect"].update(n_baseline=7, n_rpc=4)
    by = {r["id"]: r for r in scorecard_rows(res)}
    assert by["clean"]["ours"] == "80.00 → 81.10 (means of 7 / 4 seeds; the difference pairs 2)"
    res["claims"][0]["effect"].update(n_baseline=2, n_rpc=2)
    assert {r["id"]: r for r in scorecard_rows(res)}["clean"]["ours"] == "80.00 → 81.10"


def test_the_kernel_pca_rows_follow_the_paper_rows_where_the_study_tests_them():
    res = json.loads(json.dumps(RES))
    res["claims"].append(_claim("k1_symvit", "reproduced", [-0.2, -0.3]))
    rows = scorecard_rows(res)
    assert [r["id"] for r in rows] == list(SCORECARD) + list(KPCA_ROWS) and len(rows) == 20
    by = {r["id"]: r for r in rows}
    assert by["k1_symvit"]["verdict"] == "reproduced" and by["k1_scaled"]["note"] == "not in this study"
    assert by["k2_cka_exact"]["paper"] == "aligned beyond chance (no numbers)"
    assert count_line(rows).startswith("20 claims: 2 reproduced")


def test_the_count_line_and_a_lead_of_at_most_three_sentences():
    rows = scorecard_rows(RES)
    assert count_line(rows) == ("14 claims: 1 reproduced, 1 contradicted, 0 equivalent, 1 inconclusive, 10 not run, "
                                "1 unresolved (one seed)")
    lead = scorecard_lead(RES, rows)
    assert len(re.findall(r"[.!?](?:\s|$)", lead)) <= 3, lead
    assert "fresh seeds 1000-1002 from the plan abababababab" in lead
    assert "Reproduced: clean top-1." in lead and "Contradicted: mCE." in lead
    lines = scorecard_lines(RES, "elsewhere")
    assert lines[0] == f"**{count_line(rows)}.**" and "Claims not in this study are decided in elsewhere." in lines


def test_the_readmes_scorecard_is_the_published_results():
    # the README's first screen carries the count line; the table is in docs/reproduce.md
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- results (\S+) scorecard:count -->\n(.*?)<!-- /results -->", text, re.S)
    assert m, "the README shows the scorecard's count line"
    res = json.loads((ROOT / "docs" / "results" / f"{m.group(1)}.json").read_text())
    assert m.group(2) == render_view(res, "scorecard:count")
    assert text.index(m.group(0)) < text.index("## Install"), "the count line comes before the install section"
    docs = (ROOT / "docs" / "reproduce.md").read_text()
    table = re.search(rf"<!-- results {m.group(1)} scorecard -->\n(.*?)<!-- /results -->", docs, re.S)
    assert table and table.group(1) == render_view(res, "scorecard")
    assert "docs/reproduce.md#the-paper-scorecard" in text
