"""``rpc-attention compare RUN --against NAME`` (what ``make demo`` ends with): a study run against its
published results: verdicts, numbers printed alike, the largest difference, both machines."""

import copy
import json
from pathlib import Path

import pytest

from rpc_attention.cli import main
from rpc_attention.report.drift import agreement, agreement_lines

ROOT = Path(__file__).resolve().parents[2]
QUICK = json.loads((ROOT / "docs" / "results" / "quick.json").read_text())


def _moved(res, by=0.5, machine="Intel Xeon", isa="AVX512_AMX"):
    """A copy with one table cell's mean moved by ``by``, one verdict flipped and another machine."""
    out = copy.deepcopy(res)
    t = out["tables"]["vision"]
    row = t["rows"][0]
    key = next(k for k, c in row["cells"].items() if c.get("n"))
    row["cells"][key]["mean"] += by
    out["claims"][0]["verdict"] = "contradicted" if out["claims"][0]["verdict"] != "contradicted" else "reproduced"
    out["setup"] = dict(out["setup"], cpu=machine, cpu_capability=isa)
    return out, f"vision: {row['label']}", out["claims"][0]["id"]


def test_identical_results_agree_everywhere():
    g = agreement(QUICK, QUICK)
    assert g["verdicts"] == g["verdicts_equal"] == len(QUICK["claims"]) and not g["verdicts_differ"]
    assert g["numbers"] == g["numbers_equal"] > 100 and g["largest"][0] == 0.0


def test_a_moved_number_and_verdict_are_counted_and_named():
    run, where, cid = _moved(QUICK)
    g = agreement(run, QUICK)
    assert g["verdicts_equal"] == g["verdicts"] - 1 and g["verdicts_differ"] == [cid]
    assert g["numbers_equal"] == g["numbers"] - 1
    change, at, _, _ = g["largest"]
    assert change == pytest.approx(0.5) and at.startswith(where)
    lines = agreement_lines(run, QUICK, "quick")
    assert lines[1] == f"- verdicts: {g['verdicts'] - 1} of {g['verdicts']} equal (differ: {cid})"
    assert lines[3] == "- this run: Intel Xeon (AVX512_AMX kernels, 2 CPUs); published: AMD EPYC (AVX512 kernels, 2 CPUs)"


def test_cli_against_a_published_name_and_its_errors(tmp_path, capsys, monkeypatch):
    run, _, _ = _moved(QUICK)
    study = tmp_path / "demo"
    study.mkdir()
    (study / "results.json").write_text(json.dumps(run))
    monkeypatch.chdir(ROOT)  # published names resolve under docs/results
    assert main(["compare", str(study), "--against", "quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("This run against the published `quick`") and "largest difference 0.50" in out
    assert main(["compare", str(study), "--against", "nope"]) == 2
    assert "published results docs/results/nope.json not found" in capsys.readouterr().err
    other = dict(run, study="smoke")
    (study / "results.json").write_text(json.dumps(other))
    assert main(["compare", str(study), "--against", "quick"]) == 2
    assert "compare two runs of one study" in capsys.readouterr().err
    assert main(["compare", str(study), str(study), "--against", "quick"]) == 2
    assert main(["compare", str(study)]) == 2
    assert "--out DIR is needed" in capsys.readouterr().err
