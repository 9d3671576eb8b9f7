"""The `smoke` study end to end with the real components (trainer, eval suites, KPCA analysis, LM):
every stage finishes, the report has its tables, figures and verdicts; a rerun does nothing; an
interrupted training stage resumes from the trainer's checkpoint without redoing other stages."""

import json

import pytest

from rpc_attention.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reproduce-smoke")]


def test_smoke_study_end_to_end(tmp_path, capsys):
    # one test function on purpose: the study runs once, whatever worker pytest-xdist picks
    out = tmp_path / "smoke"
    rc = main(["reproduce", "--study", "smoke", "--out", str(out)])
    assert rc == 0, sorted(p.name for p in (out / "stages").glob("*.failed.json"))
    check_report(out)
    check_rerun_does_nothing(out, capsys)
    check_interrupted_training_resumes_from_checkpoint(out, capsys)


def check_report(smoke_dir):
    stages = json.loads((smoke_dir / "study.json").read_text())["stages"]
    names = [s["name"] for s in stages]
    assert {"train.symvit-s0", "train.rpc6-s0", "train.rpc2all-s0", "train.symlm-s0", "train.rpc_symlm-s0",
            "eval.rpc6-s0.pgd", "eval.rpc2all-s0.corruptions", "eval.symlm-s0.wordswap", "analyze.symvit-s0",
            "eval.symvit-s0.patch", "eval.rpc6-s0.patch",
            "train.rpc_pcp-s0", "eval.rpc_pcp-s0.pgd", "eval.symvit-s0.sparse", "eval.rpc_pcp-s0.sparse",
            "report"} <= set(names)
    for n in names:
        assert (smoke_dir / "stages" / f"{n}.done.json").exists(), n
    res = json.loads((smoke_dir / "results.json").read_text())
    # no path of this machine: everything under the study directory is relative to it
    assert res["out_dir"] == "." and str(smoke_dir.resolve()) not in (smoke_dir / "results.json").read_text()
    claims = {c["id"]: c for c in res["claims"]}
    assert set(claims) == {"clean", "fgsm", "pgd", "mce", "ood_aupr", "sparse_input", "key_corruption", "lm_ppl",
                           "lm_wordswap", "clean_pcp", "fgsm_pcp", "mce_pcp", "ood_aupr_pcp", "sparse_input_pcp",
                           "key_corruption_pcp"}
    for c in claims.values():  # every claim measured; one seed -> "unresolved (one seed)"
        assert c["verdict"] == "unresolved (one seed)", c
        # every claim gets an example interval from the real suites' records (mCE, AUPR and perplexity
        # included), and the statistic recomputed on all examples is the metric's difference
        pooled = c["intervals"]["bootstrap"]["pooled"]
        assert pooled["diff"] == pytest.approx(c["intervals"]["per_seed_diff"]["0"], rel=1e-9, abs=1e-9), c["id"]
        assert c["baseline_values"] and c["rpc_values"]
    assert claims["mce"]["baseline_values"] == [100.0]   # normalised by SymViT's own errors
    # every RPC model's training recorded its S activity; the PCP-active threshold makes S non-zero
    sp = res["sparsity"]["models"]
    assert set(sp) == {"rpc6", "rpc2all", "rpc_pcp", "rpc_symlm"}
    for key, m in sp.items():
        (run,) = m["runs"].values()
        assert run["blocks"] and m["verdict"] in ("fired", "acted as iterated attention"), key
    assert sp["rpc_pcp"]["verdict"] == "fired"
    assert all(b["causal"] for b in sp["rpc_symlm"]["runs"]["rpc_symlm-s0"]["blocks"])
    md = (smoke_dir / "report.md").read_text()
    assert "**Sparse corruption**" in md
    for heading in ("## Verdicts", "## Setup", "### Time per stage", "## Image classification and robustness",
                    "## Language modelling", "## Kernel-PCA analysis", "## PAP's sparse step: did it fire?",
                    "## Verdict rules"):
        assert heading in md
    figs = [f["path"] for f in res["figures"] if f.get("path")]
    assert "figures/attack_curves.png" in figs and "figures/jproj_symvit-s0.png" in figs
    for f in figs:
        assert (smoke_dir / f).read_bytes()[:4] == b"\x89PNG"
    assert (smoke_dir / "report.html").read_text().count("data:image/png;base64,") == len(figs)


def check_rerun_does_nothing(smoke_dir, capsys):
    capsys.readouterr()
    assert main(["reproduce", "--study", "smoke", "--out", str(smoke_dir)]) == 0
    captured = capsys.readouterr()  # the pipeline logs its progress (stderr); the summary is output
    assert "> " not in "\n".join(l[:2] for l in captured.err.splitlines())   # no stage started
    assert "= report: done earlier" in captured.err
    assert "38 cached" in captured.out
    assert main(["reproduce", "--study", "smoke", "--out", str(smoke_dir), "--dry-run"]) == 0
    assert "0 of 38 stages to run" in capsys.readouterr().out


def check_interrupted_training_resumes_from_checkpoint(smoke_dir, capsys):
    st = smoke_dir / "stages"
    done = json.loads((st / "train.rpc6-s0.done.json").read_text())
    # what a kill during the stage leaves behind: a running marker, no done marker, the checkpoints
    (st / "train.rpc6-s0.done.json").unlink()
    (st / "train.rpc6-s0.running.json").write_text(json.dumps({"name": "train.rpc6-s0", "attempts": 1}))
    assert list((smoke_dir / "runs" / "rpc6-s0" / "checkpoints").iterdir())
    capsys.readouterr()
    assert main(["reproduce", "--study", "smoke", "--out", str(smoke_dir), "--stages", "train.*"]) == 0
    out = capsys.readouterr().err  # the pipeline's progress log
    assert "> train.rpc6-s0: resuming" in out and "resuming from the last checkpoint" in out
    assert "> train.symvit-s0" not in out and "= train.symvit-s0: done earlier" in out
    again = json.loads((st / "train.rpc6-s0.done.json").read_text())
    assert again["resumed"] is True and again["fingerprint"] == done["fingerprint"]


def test_missing_data_path_fails_fast(tmp_path, capsys):
    assert main(["reproduce", "--study", "imagenet", "--out", str(tmp_path / "x")]) == 2
    assert "data.imagenet" in capsys.readouterr().err
    assert main(["reproduce", "--study", "wikitext103", "--set", "data.wikitext103=/nonexistent",
                 "--out", str(tmp_path / "y")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["reproduce", "--study", "quick", "--set", "bogus=1", "--dry-run"]) == 2
    assert main(["reproduce", "--study", "quick", "--stages", "nothing.*", "--dry-run",
                 "--out", str(tmp_path / "z")]) == 2
