"""The resumable pipeline on small fake stages: skip finished stages, resume after a failure or a kill,
atomic outputs, fingerprints, stage selection, skipped components, dry-run plan."""

import json
import os

import pytest

from rpc_attention.reproduce.pipeline import (
    Pipeline,
    Stage,
    StageSelectionError,
    StageSkipped,
    atomic_write_json,
    atomic_write_text,
)


class Recorder:
    """Fake stage functions that count calls and write one output file each (atomically)."""

    def __init__(self):
        self.calls = []
        self.fail = {}      # name -> exception to raise on the next call
        self.contexts = {}

    def fn(self, ctx):
        name = ctx.stage.name
        self.calls.append(name)
        self.contexts[name] = ctx
        exc = self.fail.pop(name, None)
        if exc is not None:
            raise exc
        path = ctx.out_dir / "out" / f"{name}.txt"
        atomic_write_text(path, f"{name} {ctx.params}")
        return {"outputs": {"file": str(path)}, "result": {"value": len(self.calls)}}


def make(tmp_path, rec, params=None):
    params = params or {}
    stages = [
        Stage("train.a", "train", rec.fn, params=params.get("train.a", {"steps": 1}), estimate_s=10),
        Stage("train.b", "train", rec.fn, params={"steps": 2}, estimate_s=20),
        Stage("eval.a.clean", "eval", rec.fn, deps=["train.a"], params={"suite": "clean"}, estimate_s=3),
        Stage("eval.b.clean", "eval", rec.fn, deps=["train.b"], params={"suite": "clean"}, estimate_s=3),
        Stage("report", "report", rec.fn, after=["train.a", "train.b", "eval.a.clean", "eval.b.clean"]),
    ]
    return Pipeline(stages, tmp_path, log=lambda m: None)


def test_runs_all_then_skips_finished(tmp_path):
    rec = Recorder()
    s = make(tmp_path, rec).run()
    assert rec.calls == ["train.a", "train.b", "eval.a.clean", "eval.b.clean", "report"]
    assert s["ok"] == rec.calls and not s["failed"]
    m = json.loads((tmp_path / "stages" / "train.a.done.json").read_text())
    assert m["status"] == "done" and m["seconds"] >= 0 and m["outputs"]["file"].endswith("train.a.txt")
    assert m["params"] == {"steps": 1} and m["result"] == {"value": 1}
    rec.calls.clear()
    s = make(tmp_path, rec).run()
    assert rec.calls == []
    assert len(s["cached"]) == 5


def test_failure_then_rerun_resumes_without_redoing_finished(tmp_path):
    rec = Recorder()
    rec.fail["eval.a.clean"] = RuntimeError("boom")
    rec.fail["train.b"] = RuntimeError("kaputt")
    s = make(tmp_path, rec).run()
    assert s["failed"] == ["train.b", "eval.a.clean"]
    assert s["blocked"] == ["eval.b.clean"]          # needs train.b
    assert "report" in s["ok"]                       # the report runs after whatever happened
    failed = json.loads((tmp_path / "stages" / "eval.a.clean.failed.json").read_text())
    assert "boom" in failed["error"] and "Traceback" in failed["traceback"]
    rec.calls.clear()
    s = make(tmp_path, rec).run()
    # train.a finished before: not rerun. The failed/blocked ones run, the report refreshes.
    assert rec.calls == ["train.b", "eval.a.clean", "eval.b.clean", "report"]
    assert not s["failed"] and "train.a" in s["cached"]
    assert not (tmp_path / "stages" / "eval.a.clean.failed.json").exists()


def test_keyboard_interrupt_leaves_running_marker_and_next_run_resumes(tmp_path):
    rec = Recorder()
    rec.fail["train.b"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        make(tmp_path, rec).run()
    assert rec.calls == ["train.a", "train.b"]
    assert (tmp_path / "stages" / "train.b.running.json").exists()
    assert not (tmp_path / "stages" / "train.b.done.json").exists()
    p = make(tmp_path, Recorder())
    plan = {e.stage.name: e.action for e in p.plan()}
    assert plan["train.a"] == "done" and plan["train.b"].startswith("resume")
    rec2 = Recorder()
    make(tmp_path, rec2).run()
    assert rec2.calls[0] == "train.b" and "train.a" not in rec2.calls
    assert rec2.contexts["train.b"].resuming is True and rec2.contexts["train.b"].fresh is False
    assert json.loads((tmp_path / "stages" / "train.b.done.json").read_text())["resumed"] is True
    assert not (tmp_path / "stages" / "train.b.running.json").exists()


def test_changed_params_rerun_stage_and_dependants(tmp_path):
    rec = Recorder()
    make(tmp_path, rec).run()
    rec.calls.clear()
    make(tmp_path, rec, params={"train.a": {"steps": 5}}).run()
    assert rec.calls == ["train.a", "eval.a.clean", "report"]
    assert rec.contexts["train.a"].fresh is True   # changed parameters: start over, not resume


def test_force_reruns_selected(tmp_path):
    rec = Recorder()
    make(tmp_path, rec).run()
    rec.calls.clear()
    make(tmp_path, rec).run(selection=["train.b"], force=True)
    assert rec.calls == ["train.b"]
    assert rec.contexts["train.b"].fresh is True


def test_stage_selection_globs_and_missing_dependency(tmp_path):
    rec = Recorder()
    p = make(tmp_path, rec)
    with pytest.raises(StageSelectionError, match="needs stage train.a"):
        p.run(selection=["eval.a.*"])
    assert rec.calls == []
    p.run(selection=["train.*"])
    assert rec.calls == ["train.a", "train.b"]
    rec.calls.clear()
    p.run(selection=["eval"])            # a kind / prefix selects eval.*
    assert rec.calls == ["eval.a.clean", "eval.b.clean"]
    with pytest.raises(StageSelectionError, match="matches no stage"):
        p.run(selection=["nope.*"])


def test_skipped_component_propagates_and_is_retried(tmp_path):
    rec = Recorder()
    state = {"installed": False}

    def maybe(ctx):
        if not state["installed"]:
            raise StageSkipped("segmentation is not installed")
        return rec.fn(ctx)

    def stages():
        return [Stage("train.seg", "train", maybe), Stage("eval.seg.seg", "eval", rec.fn, deps=["train.seg"]),
                Stage("report", "report", rec.fn, after=["train.seg", "eval.seg.seg"])]

    s = Pipeline(stages(), tmp_path, log=lambda m: None).run()
    assert s["skipped"] == ["train.seg", "eval.seg.seg"] and s["ok"] == ["report"] and not s["failed"]
    m = json.loads((tmp_path / "stages" / "eval.seg.seg.skipped.json").read_text())
    assert "not installed" in m["reason"]
    rows = {r["name"]: r for r in Pipeline(stages(), tmp_path).stage_table()}
    assert rows["train.seg"]["status"] == "skipped" and "not installed" in rows["train.seg"]["reason"]
    # unchanged skip: the report is not redone
    rec.calls.clear()
    Pipeline(stages(), tmp_path, log=lambda m: None).run()
    assert rec.calls == []
    state["installed"] = True
    Pipeline(stages(), tmp_path, log=lambda m: None).run()
    assert rec.calls == ["train.seg", "eval.seg.seg", "report"]


def test_dry_run_plan_has_estimates(tmp_path):
    rec = Recorder()
    p = make(tmp_path, rec)
    text = p.format_plan(p.plan())
    assert "train.a" in text and "10s" in text and "5 of 5 stages to run" in text
    assert "(estimates: calibrated constants per stage kind;" in text
    p.run(selection=["train.a"])
    text = p.format_plan(p.plan())
    assert "4 of 5 stages to run" in text
    assert rec.calls == ["train.a"]


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]  # no temporary file left behind


def test_invalid_pipelines_rejected(tmp_path):
    f = lambda ctx: None  # noqa: E731
    with pytest.raises(ValueError, match="unknown stage"):
        Pipeline([Stage("a", "x", f, deps=["b"])], tmp_path)
    with pytest.raises(ValueError, match="before its dependency"):
        Pipeline([Stage("a", "x", f, deps=["b"]), Stage("b", "x", f)], tmp_path)
    with pytest.raises(ValueError, match="invalid stage name"):
        Stage("a/b", "x", f)


def test_lock_prevents_concurrent_runs(tmp_path):
    p1, p2 = Pipeline([], tmp_path), Pipeline([], tmp_path)
    with p1.lock():
        with pytest.raises(StageSelectionError, match="another"):
            with p2.lock():
                pass
    with p2.lock():
        pass
