"""A study directory holds one study: another study (or other settings) there is refused without --force."""

import json

import pytest

from rpc_attention.cli import main
from rpc_attention.files import json_default
from rpc_attention.reproduce import Pipeline, get_study


def _finished_study(out, name="quick", settings=()):
    """What a finished study leaves (its study.json, a done marker, a run's weights, the report)."""
    study = get_study(name, list(settings))
    out.mkdir(parents=True)
    (out / "study.json").write_text(json.dumps({"study": name, "settings": study.settings}, default=json_default))
    (out / "stages").mkdir()
    (out / "stages" / "train.symvit-s0.done.json").write_text("{}")
    (out / "runs" / "symvit-s0").mkdir(parents=True)
    (out / "runs" / "symvit-s0" / "model.safetensors").write_bytes(b"weights of the quick study")
    (out / "report.md").write_text("# quick report")
    (out / "notes.txt").write_text("the user's own file")
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _no_stages(self, *args, **kwargs):
    # stands in for running the stages: these tests are about what happens to the directory before
    return {"ok": [], "failed": [], "blocked": []}


def _files(out):
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".reproduce.lock"}


@pytest.mark.parametrize("argv,needle", [
    (["--study", "smoke"], "holds the study 'quick'; running 'smoke' there would retrain"),
    (["--study", "smoke", "--dry-run"], "holds the study 'quick'"),
    (["--study", "quick", "--set", "eval_limit=7"], "holds the study 'quick' with other settings (eval_limit: 2000 -> 7)"),
])
def test_another_study_or_other_settings_is_refused_and_nothing_changes(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(Pipeline, "run", _no_stages)
    out = tmp_path / "study"
    before = _finished_study(out)
    assert main(["reproduce", "--out", str(out)] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "--force" in err, err
    assert _files(out) == before


def test_the_same_study_and_settings_pass_the_check(tmp_path, capsys):
    out = tmp_path / "study"
    _finished_study(out, "smoke")
    assert main(["reproduce", "--study", "smoke", "--out", str(out), "--dry-run"]) == 0


def test_force_restarts_a_directory_of_another_study_cleanly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Pipeline, "run", _no_stages)
    out = tmp_path / "study"
    _finished_study(out)
    assert main(["reproduce", "--study", "smoke", "--out", str(out), "--dry-run", "--force"]) == 0
    assert (out / "runs" / "symvit-s0" / "model.safetensors").exists()  # a dry run removes nothing
    assert main(["reproduce", "--study", "smoke", "--out", str(out), "--force"]) == 0
    assert "removed the study 'quick'" in capsys.readouterr().err
    assert not (out / "runs").exists() and not (out / "stages").exists() and not (out / "report.md").exists()
    assert (out / "notes.txt").read_text() == "the user's own file"  # only what a study writes is removed
    assert json.loads((out / "study.json").read_text())["study"] == "smoke"
