"""Stage functions: a name that the package does not know is an error of its registry, not a skip."""

from types import SimpleNamespace

import pytest

from rpc_attention.reproduce import stages
from rpc_attention.reproduce.pipeline import Stage, StageContext


def _context(tmp_path, fn, params):
    stage = Stage(name="s", kind="test", fn=fn, params=params)
    return StageContext(out_dir=tmp_path, stage=stage, pipeline=SimpleNamespace(log=lambda msg: None, threads=None))


def test_train_stage_with_unknown_preset_raises_with_the_presets_message(tmp_path):
    ctx = _context(tmp_path, stages.train_stage, {"run": "r", "preset": "fmnist-symvitt", "seed": 0})
    with pytest.raises(ValueError, match="unknown preset 'fmnist-symvitt'.*fmnist-symvit"):
        stages.train_stage(ctx)


def test_eval_stage_with_unknown_suite_raises_before_any_work(tmp_path):
    ctx = _context(tmp_path, stages.eval_stage, {"run": "r", "suite": "pgdd"})
    with pytest.raises(ValueError, match="unknown suite 'pgdd'"):
        stages.eval_stage(ctx)
    assert not (tmp_path / "runs").exists()
