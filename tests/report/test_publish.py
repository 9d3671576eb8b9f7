"""Numbers in the README and docs come from published results: blocks are rendered from
``docs/results/<name>.json`` and a block whose text differs is reported (and fails this suite)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rpc_attention.report.publish import PublishError, find_blocks, publish_results, render_view, stale_blocks

ROOT = Path(__file__).resolve().parents[2]


def _results(clean_rpc: float = 81.25) -> dict:
    cell = lambda m, s: {"n": 3, "mean": m, "std": s, "values": [m - s, m, m + s]}  # noqa: E731
    return {
        "study": "quick", "generated": "2026-12-03 20:00 UTC",
        "setup": {"cpu": "Test CPU", "cpu_count": 2, "versions": {"torch": "2.14.1"}},
        "stages": [{"name": "train.a", "kind": "train", "status": "done", "seconds": 60.0, "cpu_s": 100.0},
                   {"name": "report", "kind": "report", "status": "running", "seconds": 1.0}],
        "tables": {"vision": {
            "title": "Image classification", "columns": [{"key": "clean", "header": "clean top-1"}],
            "rows": [{"label": "SymViT", "cells": {"clean": cell(80.0, 1.0)}},
                     {"label": "RPC", "cells": {"clean": cell(clean_rpc, 0.5)}}],
            "paper": {"baseline": {}, "rpc": {}}}},
        "claims": [{"title": "RPC raises clean top-1", "suite": "clean", "metric": "top1", "higher": True,
                    "margin": 0.25, "family": "primary", "verdict": "inconclusive",
                    "intervals": {"per_seed_diff": {"0": 0.5, "1": 1.25, "2": 2.0},
                                  "seed_ci": {"diff": 1.25, "lo": -0.5, "hi": 3.0}}}],
    }


def _repo(tmp_path: Path, text: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(text)
    study = tmp_path / "study"
    study.mkdir()
    (study / "results.json").write_text(json.dumps(_results()))
    return study


BLOCKS = ("Intro.\n\n<!-- results quick table:vision -->\nold text\n<!-- /results -->\n\n"
          "<!-- results quick verdicts -->\n<!-- /results -->\nEnd.\n")


def test_publish_renders_every_block_from_the_results(tmp_path):
    study = _repo(tmp_path, BLOCKS)
    publish_results(study, tmp_path, "quick")
    text = (tmp_path / "README.md").read_text()
    assert "old text" not in text and text.startswith("Intro.") and text.endswith("End.\n")
    assert "| RPC | 81.25 ± 0.50 (n=3) |" in text
    assert "+1.25 [-0.50, +3.00]" in text and "**inconclusive**" in text
    assert stale_blocks(tmp_path) == []
    assert json.loads((tmp_path / "docs/results/quick.json").read_text())["study"] == "quick"


def test_a_number_typed_by_hand_is_stale(tmp_path):
    study = _repo(tmp_path, BLOCKS)
    publish_results(study, tmp_path, "quick")
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("81.25", "81.30"))
    assert stale_blocks(tmp_path) == ["README.md: quick table:vision"]


def test_other_results_are_not_replaced_without_force(tmp_path):
    study = _repo(tmp_path, BLOCKS)
    publish_results(study, tmp_path, "quick")
    (study / "results.json").write_text(json.dumps(_results(clean_rpc=79.0)))
    with pytest.raises(PublishError, match="--force"):
        publish_results(study, tmp_path, "quick")
    assert "81.25" in (tmp_path / "README.md").read_text()
    publish_results(study, tmp_path, "quick", force=True)
    assert "| RPC | 79.00 ± 0.50 (n=3) |" in (tmp_path / "README.md").read_text()


def test_unknown_views_and_missing_results_are_one_clear_error(tmp_path):
    with pytest.raises(PublishError, match="unknown results view 'nope'"):
        render_view(_results(), "nope")
    with pytest.raises(PublishError, match="no 'lm' table"):
        render_view(_results(), "table:lm")
    with pytest.raises(PublishError, match="no 'own' claims"):
        render_view(_results(), "verdicts:own")
    assert render_view(_results(), "verdicts:primary") == render_view(_results(), "verdicts")
    with pytest.raises(PublishError, match="results.json not found"):
        publish_results(tmp_path / "missing", tmp_path, "quick")


def test_cli_check_exits_1_on_a_stale_block_and_2_on_bad_input(tmp_path):
    study = _repo(tmp_path, BLOCKS)
    run = lambda *a: subprocess.run([sys.executable, "-m", "rpc_attention", "publish", *a, "--root", str(tmp_path)],  # noqa: E731
                                    capture_output=True, text=True)
    assert run(str(study)).returncode == 2  # no --as
    assert run(str(study), "--as", "quick").returncode == 0
    ok = run("--check")
    assert ok.returncode == 0 and "2 result blocks current, 0 stale" in ok.stdout
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("81.25", "81.30"))
    bad = run("--check")
    assert bad.returncode == 1 and "stale: README.md: quick table:vision" in bad.stdout


def test_the_repository_result_blocks_match_the_published_results():
    blocks = find_blocks(ROOT)
    # the lm-gap study's tables in docs/language-model.md at least
    assert {(b.name, b.view) for b in blocks} >= {("lm-gap", "table:lm"), ("lm-gap", "verdicts")}
    assert stale_blocks(ROOT) == []
