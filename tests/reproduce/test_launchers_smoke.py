"""Identical numbers whatever the launcher: a few stages of the `smoke` study (two trainings, an
evaluation of the RPC model, the report) run serially in this process, with ``--jobs 2`` in worker
processes and through submitit's local executor (real processes, no mock) give the same results.json
bit for bit, timing fields and the study folder's path aside."""

import json

import pytest

from rpc_attention.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("reproduce-launchers")]

STAGES = "train.symvit-s0,train.rpc6-s0,eval.rpc6-s0.clean,report"
# what differs between two runs of the same stages: wall and CPU times, load, when (generated, a stage's
# start and finish), where
VOLATILE = {"seconds", "cpu_s", "load", "load_average", "generated", "elapsed_s", "images_per_s", "tokens_per_s",
            "started", "finished"}


def _stable(value, out):
    if isinstance(value, dict):
        return {k: _stable(v, out) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(str(out), "<study>")
    return value


def _results(tmp_path, name, *launch):
    out = tmp_path / name
    assert main(["reproduce", "--study", "smoke", "--out", str(out), "--threads", "1", "--stages", STAGES, *launch]) == 0
    return _stable(json.loads((out / "results.json").read_text()), out)


def test_the_smoke_study_gives_the_same_results_json_serially_with_jobs_2_and_through_submitit(tmp_path):
    serial = _results(tmp_path, "serial")
    assert [s["status"] for s in serial["stages"] if s["name"] in STAGES.split(",")[:3]] == ["done"] * 3
    assert serial["evals"]["clean"]["rpc6"]["0"]["metrics"]  # an evaluation result is part of what is compared
    assert _results(tmp_path, "jobs2", "--jobs", "2") == serial
    assert _results(tmp_path, "submitit", "--launcher", "submitit-local", "--jobs", "2") == serial
