"""Carrying a study's state without weights (reproduce/state.py) and the seed-major stage order."""

import json

import pytest

from rpc_attention.reproduce.pipeline import Stage
from rpc_attention.reproduce.specs import StudyError
from rpc_attention.reproduce.state import load_state, save_state
from rpc_attention.reproduce.studies import _seed_major


def _study(tmp_path):
    out = tmp_path / "study"
    (out / "stages").mkdir(parents=True)
    stages = [{"name": "train.a-s1", "kind": "train", "deps": []},
              {"name": "eval.a-s1.clean", "kind": "eval", "deps": ["train.a-s1"]},
              {"name": "train.a-s2", "kind": "train", "deps": []},
              {"name": "eval.a-s2.clean", "kind": "eval", "deps": ["train.a-s2"]},
              {"name": "report", "kind": "report", "deps": []}]
    (out / "study.json").write_text(json.dumps({"study": "x", "stages": stages}))
    for name in ("train.a-s1", "eval.a-s1.clean", "train.a-s2"):
        (out / "stages" / f"{name}.done.json").write_text(json.dumps({"name": name}))
    (out / "stages" / "eval.a-s2.clean.running.json").write_text("{}")
    for run in ("a-s1", "a-s2"):
        r = out / "runs" / run
        (r / "eval").mkdir(parents=True)
        (r / "checkpoints").mkdir()
        (r / "model.safetensors").write_bytes(b"w" * 1000)
        (r / "checkpoints" / "step_1.safetensors").write_bytes(b"c" * 1000)
        (r / "config.yaml").write_text("seed: 1\n")
        (r / "eval" / "clean.json").write_text("{}")
    return out


def test_save_keeps_records_drops_weights_and_retrains_unfinished_models(tmp_path):
    out = _study(tmp_path)
    got = save_state(out, tmp_path / "state")
    st = tmp_path / "state"
    assert got["retrain"] == ["train.a-s2"] and got["stages"] == 2
    assert (st / "stages" / "eval.a-s1.clean.done.json").is_file()
    assert not (st / "stages" / "train.a-s2.done.json").exists()       # its evaluation is unfinished
    assert not list(st.glob("stages/*.running.json"))
    assert (st / "runs" / "a-s1" / "config.yaml").is_file() and (st / "runs" / "a-s1" / "eval" / "clean.json").is_file()
    assert not (st / "runs" / "a-s1" / "model.safetensors").exists()
    assert not (st / "runs" / "a-s1" / "checkpoints").exists() and not (st / "runs" / "a-s2").exists()
    # saved twice: the same tree (replaced whole)
    save_state(out, st)
    assert sorted(p.name for p in (st / "stages").iterdir()) == ["eval.a-s1.clean.done.json", "train.a-s1.done.json"]


def test_load_puts_it_back_and_never_overwrites(tmp_path):
    out = _study(tmp_path)
    save_state(out, tmp_path / "state")
    got = load_state(tmp_path / "state", tmp_path / "again")
    assert got["stages"] == 2 and (tmp_path / "again" / "study.json").is_file()
    with pytest.raises(StudyError, match="not empty"):
        load_state(tmp_path / "state", out)
    with pytest.raises(StudyError, match="no study"):
        save_state(tmp_path / "nothing", tmp_path / "x")


def test_seed_major_order_keeps_each_seeds_trainings_first():
    def st(name, kind, seed):
        return Stage(name, kind, fn=lambda ctx: None, params={"seed": seed})
    stages = [st("train.a-s1", "train", 1), st("train.a-s2", "train", 2), st("train.b-s1", "train", 1),
              st("eval.a-s1.x", "eval", 1), st("eval.a-s2.x", "eval", 2), st("eval.b-s1.x", "eval", 1)]
    got = [s.name for s in _seed_major(stages, None)]
    assert got == ["train.a-s1", "train.b-s1", "eval.a-s1.x", "eval.b-s1.x", "train.a-s2", "eval.a-s2.x"]
