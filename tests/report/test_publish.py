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
                                  "seed_ci": {"diff": 1.25, "lo": -0.5, "hi": 3.0},
                                  "tests": {"interval": {"diff": 1.25, "lo": -0.75, "hi": 3.25}}}}],
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
    assert "+1.25 [-0.75, +3.25]" in text and "**inconclusive**" in text
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


def _patch_results() -> dict:
    """Patch-suite records of a baseline, a variant and a control over three seeds (clean and 1-patch top-1)."""
    def rec(clean, one, two):
        return {"status": "done", "metrics": {"clean_top1": clean, "top1@1patch": one, "top1@2patch": two}}

    return {
        "models": {"symvit": {"label": "SymViT", "role": "baseline"}, "rob": {"label": "robust", "role": "rpc"},
                   "clip": {"label": "SymViT + clip", "role": "variant"}},
        "evals": {"patch": {
            "symvit": {"0": rec(80.0, 20.0, 5.0), "1": rec(82.0, 22.0, 6.0), "2": rec(78.0, 18.0, 4.0)},
            "rob": {"0": rec(79.0, 31.0, 9.0), "1": rec(81.0, 30.0, 8.0), "2": rec(80.0, 32.0, 7.0)},
            # one seed missing: the difference pairs the two seeds both models have
            "clip": {"0": rec(79.0, 21.0, 5.0), "1": rec(80.0, 24.0, 6.0)}}},
    }


def test_frontier_view_pairs_each_model_with_the_baseline_by_seed():
    from scipy import stats

    text = render_view(_patch_results(), "frontier")
    lines = text.splitlines()
    assert lines[0].startswith("| model | seeds | clean top-1 (%) | 1-patch top-1 (%) | 2-patch top-1 (%)")
    assert "| SymViT | 3 | 80.00 ± 2.00 | 20.00 ± 2.00 | 5.00 ± 1.00 | — | — |" in text
    # robust - SymViT per seed: clean -1, -1, +2; 1-patch +11, +8, +14 (mean 11, sd 3)
    half = stats.t.ppf(0.975, 2) * 3.0 / 3 ** 0.5
    assert f"| +0.00 [{-stats.t.ppf(0.975, 2) * 3 ** 0.5 / 3 ** 0.5:+.2f}," in text
    assert f"+11.00 [{11 - half:+.2f}, {11 + half:+.2f}] |" in text
    # the control: two paired seeds (clean -1, -2; 1-patch +1, +2)
    assert "| SymViT + clip | 2 | 79.50 ± 0.71 | 22.50 ± 2.12 |" in text
    with pytest.raises(PublishError, match="no 'sparse' evaluations"):
        render_view(_patch_results(), "frontier:sparse")


def test_variants_view_shows_each_attack_variant_beside_the_worst_case():
    res = _patch_results()
    for model, per_seed in res["evals"]["patch"].items():
        for e in per_seed.values():
            e["metrics"]["top1@1patch_ce"] = e["metrics"]["top1@1patch"] + 2.0
            if model == "rob":  # only the defended model faces the BPDA variant
                e["metrics"]["top1@1patch_ce_bpda"] = e["metrics"]["top1@1patch"] + 1.0
    text = render_view(res, "variants:1")
    assert text.splitlines()[0] == "| model | ce (%) | ce_bpda (%) | worst case (%) |"
    assert "| SymViT | 22.00 ± 2.00 | — | 20.00 ± 2.00 |" in text
    assert "| robust | 33.00 ± 1.00 | 32.00 ± 1.00 | 31.00 ± 1.00 |" in text
    with pytest.raises(PublishError, match="number of patches"):
        render_view(res, "variants:ce")


def test_frontier_figure_is_drawn_from_the_same_rows(tmp_path):
    from rpc_attention.report.figures import patch_frontier

    figs = patch_frontier(_patch_results(), tmp_path)
    assert [f["path"] for f in figs] == ["figures/patch_frontier.png"]
    assert (tmp_path / "figures" / "patch_frontier.png").stat().st_size > 1000
    assert patch_frontier({"evals": {}}, tmp_path) == []


def test_certify_frontier_view_and_figure(tmp_path):
    from rpc_attention.report.figures import certify_frontier

    def rec(clean, defended, cert):
        return {"status": "done", "metrics": {"clean_top1": clean, "defended_top1_patch": defended,
                                              "certified_top1_patch": cert, "certified_top1_token": cert + 10}}

    res = {"models": {"symvit": {"label": "SymViT", "role": "baseline"}, "md": {"label": "masked", "role": "variant"}},
           "evals": {"certify": {"symvit": {"0": rec(80.0, 70.0, 20.0), "1": rec(82.0, 72.0, 22.0)},
                                 "md": {"0": rec(79.0, 75.0, 40.0), "1": rec(81.0, 77.0, 46.0)}}}}
    text = render_view(res, "frontier:certify")
    assert text.splitlines()[0].startswith("| model | seeds | undefended clean top-1 (%) | defended clean top-1 (%) | "
                                           "certified top-1, 1 patch (%) |")
    assert "defended − SymViT | certified − SymViT |" in text.splitlines()[0]
    assert "| masked | 2 | 80.00 ± 1.41 | 76.00 ± 1.41 | 43.00 ± 4.24 | — | 53.00 ± 4.24 | +5.00" in text
    figs = certify_frontier(res, tmp_path)
    assert [f["path"] for f in figs] == ["figures/certify_frontier.png"]
    assert certify_frontier({"evals": {}}, tmp_path) == []
