"""Every published study recomputes from its committed files (``rpc-attention verify``), and a number or
verdict changed by hand in a results file is found."""

import json
from pathlib import Path

import pytest

from rpc_attention.cli import main
from rpc_attention.report.recompute import read_examples, verify_results, write_examples

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = sorted((ROOT / "docs" / "results").glob("*.json"))


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_every_published_study_recomputes_from_its_files(path):
    out = verify_results(path)
    assert out["claims"] and out["differences"] == [], out["differences"][:5]


def test_a_verdict_typed_by_hand_is_found(tmp_path, capsys):
    src = ROOT / "docs" / "results" / "decide.json"
    res = json.loads(src.read_text())
    res["claims"][0]["verdict"] = "contradicted"
    res["claims"][1]["intervals"]["tests"]["interval"]["lo"] += 0.5
    bad = tmp_path / "decide.json"
    bad.write_text(json.dumps(res))
    assert main(["verify", str(bad)]) == 1
    text = capsys.readouterr().out
    assert "clean: verdict published 'contradicted', recomputed 'reproduced'" in text
    assert "mce: interval.lo published" in text
    assert main(["verify", str(tmp_path / "none.json")]) == 2


def test_examples_files_are_deterministic_and_a_corrupt_one_is_an_error(tmp_path):
    records = {"clean": {"a": {"0": {"indices": "0:3", "correct": {"clean": "101"}}}}}
    write_examples(tmp_path / "a.gz", records)
    write_examples(tmp_path / "b.gz", json.loads(json.dumps(records)))
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert read_examples(tmp_path / "a.gz") == records and read_examples(tmp_path / "none.gz") is None
    (tmp_path / "c.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a gzipped JSON examples file"):
        read_examples(tmp_path / "c.gz")
