"""Results carry no path of the machine that ran them: a study's results.json writes the paths under its
directory relative to it, publishing strips them from results written before, and
``publish --relative-paths`` cleans every published file (idempotent: rerun it after a merge)."""

import json
from pathlib import Path

from rpc_attention.cli import main
from rpc_attention.report.collect import relative_to_study
from rpc_attention.report.publish import publish_results, relative_published_results

ROOT = Path(__file__).resolve().parents[2]


def test_paths_under_the_study_directory_become_relative_also_inside_text(tmp_path):
    out = tmp_path / "study"
    res = {"out_dir": str(out), "evals": {"mce": {"run_dir": f"{out}/runs/rpc6-s0",
                                                  "protocol": f"CE normalised by baseline run {out}/runs/symvit-s0; x",
                                                  "note": f"see {out}.", "other": "/data/imagenet", "n": 3}},
           "list": [str(out), f"{out}-other/x"]}
    clean = relative_to_study(res, out)
    assert clean == {"out_dir": ".", "evals": {"mce": {"run_dir": "runs/rpc6-s0",
                                                       "protocol": "CE normalised by baseline run runs/symvit-s0; x",
                                                       "note": "see ..", "other": "/data/imagenet", "n": 3}},
                     "list": [".", f"{out}-other/x"]}  # a sibling directory is not the study's
    assert relative_to_study(clean, out) == clean


def test_publishing_and_relative_paths_strip_the_study_directory(tmp_path, capsys):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text("Nothing rendered here.\n")
    study = tmp_path / "study"
    study.mkdir()
    old = {"study": "quick", "out_dir": "/work/runs/demo", "evals": {"run_dir": "/work/runs/demo/runs/a-s0"}}
    (study / "results.json").write_text(json.dumps(old))
    dest = publish_results(study, tmp_path, "quick")
    assert json.loads(dest.read_text()) == {"study": "quick", "out_dir": ".", "evals": {"run_dir": "runs/a-s0"}}
    (tmp_path / "docs" / "results" / "lm.json").write_text(json.dumps(old))  # merged from elsewhere
    assert relative_published_results(tmp_path) == [tmp_path / "docs" / "results" / "lm.json"]
    assert relative_published_results(tmp_path) == []
    assert main(["publish", "--root", str(tmp_path), "--relative-paths"]) == 0
    assert "0 result file(s) rewritten" in capsys.readouterr().out


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_the_published_results_hold_no_absolute_path():
    import re

    # an absolute POSIX path at the start of a string or after a space, a bracket, a quote, "=", ":" or ","
    path = re.compile(r"(?:^|[\s(\[{'\"=:,])(/(?:[\w.+-]+/)*[\w.+-]+)")
    found = {}
    for f in sorted((ROOT / "docs" / "results").glob("*.json")):
        res = json.loads(f.read_text())
        hits = sorted({m.group(1) for s in _strings(res) for m in path.finditer(s)})
        if hits:
            found[f.name] = hits[:5]
        assert res.get("out_dir") in (None, "."), f.name
    assert not found, f"machine paths in docs/results (run `rpc-attention publish --relative-paths`): {found}"
