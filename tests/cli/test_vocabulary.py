"""One command-line vocabulary: help on every flag, --device, --run, --study, fractions for eps."""

import argparse

import pytest

from rpc_attention.cli import build_parser, main


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_flag_has_help():
    missing = [(name, a.option_strings or a.dest) for name, p in _subparsers().items() for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert missing == []


@pytest.mark.parametrize("command", ["train", "eval", "eval-external", "analyze", "generate", "bench", "reproduce"])
def test_commands_that_run_a_model_take_device(command):
    flags = {f for a in _subparsers()[command]._actions for f in a.option_strings}
    assert "--device" in flags


@pytest.mark.parametrize("command", ["train", "eval", "eval-external", "analyze", "generate", "compare"])
def test_run_directories_arrive_as_run(command):
    flags = {f for a in _subparsers()[command]._actions for f in a.option_strings}
    assert "--run" in flags


def test_train_device_flag_sets_the_config_key(capsys):
    assert main(["train", "--preset", "fmnist-symvit", "--device", "cpu", "--print-config"]) == 0
    assert "device: cpu" in capsys.readouterr().out


def test_train_run_and_resume_spellings(tmp_path, capsys):
    missing = tmp_path / "missing"
    for argv in (["--run", str(missing), "--resume"], ["--resume", str(missing)]):
        assert main(["train", *argv]) == 2
        assert "config.yaml" in capsys.readouterr().err
    assert main(["train", "--resume"]) == 2
    assert "--run DIR" in capsys.readouterr().err
    assert main(["train", "--preset", "fmnist-symvit", "--run", "a", "--out", "b"]) == 2
    assert "alias of --run" in capsys.readouterr().err


def test_reproduce_study_and_deprecated_preset(capsys):
    assert main(["reproduce", "--study", "smoke", "--dry-run", "--out", "/tmp/unused-study"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(["reproduce", "--preset", "smoke", "--dry-run", "--out", "/tmp/unused-study"]) == 0
    assert "--preset is deprecated; use --study smoke" in capsys.readouterr().err
    assert main(["reproduce", "--study", "quick", "--set", "eval_limt=3", "--dry-run"]) == 2
    assert "did you mean eval_limit" in capsys.readouterr().err


def test_study_settings_take_yaml_values():
    from dataclasses import dataclass
    from typing import List, Optional

    from rpc_attention.reproduce.specs import setting
    from rpc_attention.reproduce.studies import StudyError, parse_settings

    @dataclass(frozen=True)
    class Settings:
        seeds: List[int] = setting([0])
        eval_limit: int = 10
        eps: str = "1:6/255"
        lm: bool = True
        ratio: float = 0.5
        data_root: Optional[str] = setting(None, "data.root")

    defaults = Settings()
    s = parse_settings(["seeds=[0, 1]", "eval_limit=3", "eps=0.01", "lm=false", "ratio=1/4", "data.root=/x"],
                       defaults, "t")
    assert s == {"seeds": [0, 1], "eval_limit": 3, "eps": "0.01", "lm": False, "ratio": 0.25, "data.root": "/x"}
    assert parse_settings(["seeds=0,1,2"], defaults, "t")["seeds"] == [0, 1, 2]
    assert parse_settings([], defaults, "t")["seeds"] == [0] and defaults.seeds == [0]
    with pytest.raises(StudyError, match="expected an integer"):
        parse_settings(["eval_limit=lots"], defaults, "t")
    with pytest.raises(StudyError, match="expected an integer"):
        parse_settings(["seeds=0,one"], defaults, "t")
    with pytest.raises(StudyError, match="expected true or false"):
        parse_settings(["lm=maybe"], defaults, "t")
    with pytest.raises(StudyError, match="did you mean data.root"):
        parse_settings(["data.rot=/x"], defaults, "t")


def test_analysis_settings_and_eps_fractions():
    import argparse

    from rpc_attention.kpca.options import (
        AnalysisOptions,
        add_analysis_arguments,
        options_from_namespace,
        options_from_settings,
    )

    o = options_from_settings(["limit=2", "protocol=exact", "fgsm_eps=2.5/255", "figures=false", "ema=true"])
    assert (o.limit, o.protocols, o.figures, o.ema) == (2, ("exact",), False, True)
    assert o.fgsm_eps == pytest.approx(2.5 / 255, rel=1e-15)
    assert options_from_settings([]) == AnalysisOptions()
    assert AnalysisOptions().analysis_kwargs()["fgsm_eps"] == pytest.approx(2 / 255, rel=1e-15)
    with pytest.raises(ValueError, match="did you mean limit"):
        options_from_settings(["limt=2"])
    with pytest.raises(ValueError, match="did you mean 2/255"):
        options_from_settings(["fgsm_eps=2"])
    with pytest.raises(ValueError, match="expected an integer"):
        options_from_settings(["limit=two"])
    with pytest.raises(ValueError, match="choose paper, exact or both"):
        options_from_settings(["protocol=all"])
    # the command line's defaults are the dataclass's
    parser = argparse.ArgumentParser()
    add_analysis_arguments(parser)
    assert options_from_namespace(parser.parse_args([])) == AnalysisOptions()
    with pytest.raises(ValueError, match="did you mean 2/255"):
        options_from_namespace(parser.parse_args(["--fgsm-eps", "2"]))


def test_analyze_model_kwargs_setting_needs_timm(tmp_path, capsys):
    assert main(["analyze", "--run", str(tmp_path), "--out", str(tmp_path / "o"), "--set",
                 "model.kwargs.img_size=64"]) == 2
    assert "--timm models only" in capsys.readouterr().err
    assert main(["analyze", "--timm", "x", "--out", str(tmp_path / "o"), "--set", "limit=4"]) == 2
    assert "model.kwargs.NAME=VALUE" in capsys.readouterr().err
