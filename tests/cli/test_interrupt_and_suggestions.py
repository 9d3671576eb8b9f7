"""Ctrl-C says how to resume; a misspelt suite name gets a suggestion."""

import pytest

from rpc_attention.cli import main


def test_interrupted_training_prints_the_resume_command(tmp_path, capsys, monkeypatch):
    from rpc_attention.train import trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "run_training", interrupted)
    run = tmp_path / "r"
    assert main(["train", "--preset", "fmnist-symvit", "--run", str(run)]) == 130
    assert capsys.readouterr().err.strip() == (
        f"interrupted; continue from the last checkpoint with: rpc-attention train --resume {run}")


def test_interrupted_study_prints_the_same_command_resumes(tmp_path, capsys, monkeypatch):
    import rpc_attention.reproduce as R

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "run_study", interrupted)
    assert main(["reproduce", "--study", "smoke", "--out", str(tmp_path / "s")]) == 130
    err = capsys.readouterr().err
    assert f"rpc-attention reproduce --study smoke --out {tmp_path / 's'}` again to resume" in err


@pytest.mark.parametrize("typo,suggestion", [("pgdd", "pgd"), ("corruption", "corruptions"), ("wordswp", "wordswap")])
def test_misspelt_suite_gets_a_suggestion(tmp_path, capsys, typo, suggestion):
    assert main(["eval", "--run", str(tmp_path), "--suite", f"clean,{typo}"]) == 2
    err = capsys.readouterr().err
    assert f"unknown suite {typo!r}; did you mean {suggestion}" in err and len(err.strip().splitlines()) == 1
