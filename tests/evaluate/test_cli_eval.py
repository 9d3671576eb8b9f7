"""``rpc-attention eval``: a run end to end, and bad input (one line, exit 2, nothing overwritten)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rpc_attention.cli import main


def _eval(run, *extra):
    return main(["eval", "--run", str(run), *extra])


def test_eval_writes_json_and_markdown(tiny_run, capsys):
    rc = _eval(tiny_run, "--suite", "clean,fgsm", "--set", "fgsm.eps=1/255,4/255", "--limit", "16")
    assert rc == 0
    for name in ("clean", "fgsm"):
        with open(tiny_run / "eval" / f"{name}.json") as fh:
            rec = json.load(fh)
        assert rec["suite"] == name and rec["n_examples"] == 16 and rec["source"]["kind"] == "run"
        assert rec["model"]["run_dir"] == os.path.abspath(tiny_run)
        assert (tiny_run / "eval" / f"{name}.md").read_text().startswith(f"### {name}")
    rec = json.loads((tiny_run / "eval" / "fgsm.json").read_text())
    assert [r["eps"] for r in rec["rows"]] == ["1/255", "4/255"]
    assert rec["settings"]["eps"] == pytest.approx([1 / 255, 4 / 255]) and rec["wall_time_s"] > 0
    assert "| eps | top1 |" in capsys.readouterr().out


def test_suite_list(capsys):
    assert main(["eval", "--suite", "list"]) == 0
    out = capsys.readouterr().out
    assert "pgd" in out and "corruptions" in out


@pytest.fixture()
def run_copy(tiny_run, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(tiny_run, d, ignore=shutil.ignore_patterns("eval"))
    (d / "eval").mkdir()
    (d / "eval" / "clean.json").write_text("SENTINEL")
    (d / "eval" / "corruptions.json").write_text("SENTINEL")
    return d


@pytest.mark.parametrize("args,msg", [
    (["--suite", "clean,nope"], "unknown suite"),
    (["--suite", "clean,pgd", "--set", "pgd.eps=1/255,abc"], "not a number"),
    (["--suite", "pgd", "--set", "pgd.eps=1:/255"], "eps range"),
    (["--suite", "clean", "--set", "pgd.steps=3"], "not selected"),
    (["--suite", "clean", "--set", "clean.bogus=1"], "unknown option of suite 'clean'"),
    (["--suite", "pgd", "--set", "pgd.step=3"], "did you mean pgd.steps"),
    (["--suite", "pgd", "--set", "step=3"], "did you mean steps"),
    (["--suite", "pgd", "--set", "pgd.steps=many"], "expected an integer"),
    (["--suite", "clean", "--set", "device=cpu"], "give the device with --device cpu"),
    (["--suite", "clean", "--set", "novalue"], "KEY=VALUE"),
    (["--suite", "clean", "--limit", "0"], "--limit"),
    (["--suite", "clean,corruptions", "--set", "corruptions.root=MISSING"], "does not exist"),
    (["--suite", "clean,corruptions", "--set", "corruptions.root=PARTIAL"], "lacks"),
])
def test_bad_input_exits_2_without_overwriting(run_copy, tmp_path, capsys, args, msg):
    partial = tmp_path / "partial"
    (partial / "fog" / "1").mkdir(parents=True)
    args = [a.replace("MISSING", str(tmp_path / "nowhere")).replace("PARTIAL", str(partial)) for a in args]
    assert _eval(run_copy, *args) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert (run_copy / "eval" / "clean.json").read_text() == "SENTINEL"
    assert (run_copy / "eval" / "corruptions.json").read_text() == "SENTINEL"
    assert sorted(os.listdir(run_copy / "eval")) == ["clean.json", "corruptions.json"]


def test_run_without_weights_or_dir(run_copy, tmp_path, capsys):
    os.remove(run_copy / "model.safetensors")
    assert _eval(run_copy, "--suite", "clean") == 2
    err = capsys.readouterr().err
    assert "no weights" in err and len(err.strip().splitlines()) == 1
    assert (run_copy / "eval" / "clean.json").read_text() == "SENTINEL"
    assert _eval(tmp_path / "does-not-exist", "--suite", "clean") == 2
    assert "does not exist" in capsys.readouterr().err


def test_values_are_yaml_and_eps_takes_fractions(tiny_run, tmp_path):
    out = tmp_path / "ev"
    rc = _eval(tiny_run, "--suite", "fgsm", "--set", "eps=[0.01, 2.5/255]", "--set", "batch_size=8",
               "--limit", "8", "--device", "cpu", "--out", str(out))
    assert rc == 0
    rec = json.loads((out / "fgsm.json").read_text())
    assert rec["settings"]["eps"] == pytest.approx([0.01, 2.5 / 255])
    assert rec["settings"]["batch_size"] == 8 and rec["settings"]["device"] == "cpu"


def test_a_result_with_other_settings_is_kept_unless_force(tiny_run, tmp_path, capsys):
    out = tmp_path / "ev"
    assert _eval(tiny_run, "--suite", "clean", "--limit", "8", "--out", str(out)) == 0
    first = (out / "clean.json").read_text()
    # the same settings again: replaced (the same numbers); other settings: refused, the result kept
    assert _eval(tiny_run, "--suite", "clean", "--limit", "8", "--out", str(out)) == 0
    capsys.readouterr()
    assert _eval(tiny_run, "--suite", "clean", "--limit", "16", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a clean result with other settings (limit: 8 -> 16)" in err and "--force" in err
    assert len(err.splitlines()) == 1
    assert json.loads((out / "clean.json").read_text())["n_examples"] == 8
    assert json.loads(first)["options"]["limit"] == 8
    assert _eval(tiny_run, "--suite", "clean", "--limit", "16", "--out", str(out), "--force") == 0
    assert json.loads((out / "clean.json").read_text())["n_examples"] == 16
