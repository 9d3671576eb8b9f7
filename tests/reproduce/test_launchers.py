"""Launchers on a tiny study of cheap stages, in real processes: ``--jobs 2`` runs independent stages at
once with dependencies respected; a stage killed with SIGKILL mid-stage (under ``--jobs 2`` and under
submitit's local executor) is recorded as failed with its log, and the rerun resumes it from its
checkpoint and ends with the results of a clean run; ``--status`` on a running and a finished study;
two launchers on one directory are refused; the sbatch file submitit writes carries our options."""

import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import cloudpickle
import pytest
import torch

from rpc_attention.cli import main
from rpc_attention.reproduce import LaunchOptions, SlurmOptions, StageSelectionError, study_status
from rpc_attention.reproduce.launch import launch_stages, status_rows
from rpc_attention.reproduce.pipeline import Pipeline, Stage, atomic_write_json, read_json
from rpc_attention.reproduce.worker import configure_process

STEPS = 4


def counting_stage(ctx, hold="", meet=""):
    """A resumable stage: STEPS float32 steps, a checkpoint after each. While the file ``hold`` exists it
    stops after step 2 (writing ``<name>.holding``) until it is killed. With a folder ``meet`` it writes
    ``<name>.started`` there first and waits until every train stage has started, so two stages that do run
    at once are seen to overlap however slowly their worker processes start."""
    if meet:
        Path(meet, f"{ctx.stage.name}.started").touch()
        others = [s.name for s in ctx.pipeline.stages if s.kind == "train"]
        deadline = time.monotonic() + 120
        while not all(Path(meet, f"{n}.started").exists() for n in others):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ctx.stage.name} ran alone: the other train stages never started beside it")
            time.sleep(0.05)
    ckpt = ctx.out_dir / "ckpt" / f"{ctx.stage.name}.json"
    state = read_json(ckpt) if ckpt.exists() and not ctx.fresh else None
    state = state or {"step": 0, "x": [float(v) for v in range(1, 9)]}
    attempts = ctx.out_dir / "ckpt" / f"{ctx.stage.name}.steps"
    x = torch.tensor(state["x"], dtype=torch.float32)
    for step in range(state["step"], STEPS):
        x = torch.tanh(x @ torch.full((8, 8), 0.1 * (ctx.params["scale"] + step)))  # float32 work
        atomic_write_json(ckpt, {"step": step + 1, "x": x.tolist()})
        with open(attempts, "a") as f:
            f.write(f"{step + 1}\n")
        time.sleep(0.2)
        if hold and Path(hold).exists() and step + 1 == 2:
            (ctx.out_dir / f"{ctx.stage.name}.holding").write_text(str(os.getpid()))
            time.sleep(120)  # killed here
    return {"result": {"x": x.tolist(), "threads": torch.get_num_threads()}}


def combine_stage(ctx, fail=False):
    if fail:
        raise RuntimeError("the combination failed")
    values = [json.loads((ctx.out_dir / "stages" / f"{d}.done.json").read_text())["result"]["x"] for d in ctx.stage.deps]
    return {"result": {"sum": [a + b for a, b in zip(*values)]}}


def report_stage(ctx):
    """What the study's report does, in small: results.json from the done markers (timing left out)."""
    results = {}
    for s in ctx.pipeline.stages:
        m = ctx.pipeline.marker(s.name)
        if m and s.name != ctx.stage.name:
            # a fingerprint covers the params and the threads, and, below, when the upstream stages finished
            results[s.name] = {"result": m["result"], "fingerprint": None if s.deps else m["fingerprint"]}
    atomic_write_json(ctx.out_dir / "results.json", {"stages": results, "table": ctx.pipeline.stage_table()})
    return {}


@dataclass(frozen=True)
class TinyStudy:
    """A picklable pipeline factory (what ``StudyFactory`` is for real studies)."""

    hold: str = ""
    fail: bool = False
    meet: str = ""

    def __call__(self, out_dir, log=None):
        stages = [
            Stage("train.a", "train", partial(counting_stage, hold=self.hold, meet=self.meet), params={"scale": 1}),
            Stage("train.b", "train", partial(counting_stage, meet=self.meet), params={"scale": 2}),
            Stage("eval.ab", "eval", partial(combine_stage, fail=self.fail), deps=["train.a", "train.b"]),
            Stage("report", "report", report_stage, after=["train.a", "train.b", "eval.ab"]),
        ]
        return Pipeline(stages, out_dir, log=log or (lambda m: None))


def launched(out, launcher="local", jobs=2, factory=TinyStudy()):
    pipe = factory(out)
    pipe.runtime = {"threads": 1}
    # submitit's job process imports what its pickle names: this test module is not on its path, so
    # cloudpickle sends the tiny study's code with the job (the spawned --jobs workers get sys.path)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with pipe.lock():
            return launch_stages(pipe, factory, LaunchOptions(launcher, jobs, poll_s=0.1))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def serial(out, factory=TinyStudy()):
    pipe = factory(out)
    pipe.runtime = {"threads": 1}
    pipe.prepare = lambda: configure_process(1)
    with pipe.lock():
        return pipe.run()


def results(out):
    return json.loads((Path(out) / "results.json").read_text())["stages"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    assert not serial(out)["failed"]
    return results(out)


def test_jobs_2_runs_stages_at_once_in_order_with_the_serial_numbers(tmp_path, clean):
    (tmp_path / "meet").mkdir()
    summary = launched(tmp_path / "run", factory=TinyStudy(meet=str(tmp_path / "meet")))
    tmp_path = tmp_path / "run"
    assert sorted(summary["ok"]) == ["eval.ab", "report", "train.a", "train.b"]
    assert results(tmp_path) == clean  # bit for bit: the same floats, the same fingerprints
    m = {n: read_json(tmp_path / "stages" / f"{n}.done.json") for n in ("train.a", "train.b", "eval.ab", "report")}
    assert m["train.a"]["started"] < m["train.b"]["finished"] and m["train.b"]["started"] < m["train.a"]["finished"]
    assert m["eval.ab"]["started"] >= max(m["train.a"]["finished"], m["train.b"]["finished"])
    assert m["report"]["started"] >= m["eval.ab"]["finished"]
    assert m["train.a"]["result"]["threads"] == 1 and m["train.a"]["pid"] != m["train.b"]["pid"] != os.getpid()
    rows = {r["name"]: r for r in status_rows(TinyStudy()(tmp_path))}
    assert {r["status"] for r in rows.values()} == {"done"}
    assert rows["train.a"]["job_id"].startswith("local-") and rows["train.a"]["log"] == "logs/train.a.log"
    assert "stage train.a" in (tmp_path / "logs" / "train.a.log").read_text()
    assert launched(tmp_path)["cached"] == ["train.a", "train.b", "eval.ab", "report"]  # rerun: nothing to do


def _kill_when_holding(out, name, seen):
    """SIGKILL the worker running stage ``name`` once it holds mid-stage; note its status meanwhile."""
    holding = out / f"{name}.holding"
    for _ in range(2400):
        if holding.exists():
            break
        time.sleep(0.05)
    seen["status"] = {r["name"]: r["status"] for r in status_rows(TinyStudy()(out))}
    pid = read_json(out / "stages" / f"{name}.running.json")["pid"]
    os.kill(pid, signal.SIGKILL)
    holding.unlink()
    Path(seen["hold"]).unlink()


@pytest.mark.parametrize("launcher", ["local", "submitit-local"])
def test_a_worker_killed_mid_stage_is_failed_with_its_log_and_the_rerun_resumes_it(tmp_path, clean, launcher):
    out = tmp_path / "study"
    hold = tmp_path / "hold"
    hold.write_text("")
    seen = {"hold": str(hold)}
    killer = threading.Thread(target=_kill_when_holding, args=(out, "train.a", seen))
    killer.start()
    summary = launched(out, launcher, factory=TinyStudy(hold=str(hold)))
    killer.join()
    assert seen["status"]["train.a"] == "running" and seen["status"]["eval.ab"] in ("not run", "queued")
    assert summary["failed"] == ["train.a"] and summary["blocked"] == ["eval.ab"]
    assert sorted(summary["ok"]) == ["report", "train.b"]
    failed = read_json(out / "stages" / "train.a.failed.json")
    assert "ended without finishing" in failed["error"] and failed["log"]
    assert "stage train.a" in Path(failed["log"]).read_text()  # the log is kept
    rows = {r["name"]: r for r in study_status_of(out)}
    assert rows["train.a"]["status"] == "failed" and rows["train.a"]["log"] and rows["train.a"]["job_id"]
    table = {r["name"]: r for r in json.loads((out / "results.json").read_text())["table"]}
    assert table["train.a"]["status"] == "failed" and "log: " in table["train.a"]["reason"]  # in the report
    again = launched(out, launcher)
    assert sorted(again["ok"]) == ["eval.ab", "report", "train.a"] and again["cached"] == ["train.b"]
    assert results(out) == clean
    # resumed from its checkpoint: steps 1-2 once, then 3-4
    assert (out / "ckpt" / "train.a.steps").read_text().split() == ["1", "2", "3", "4"]


def study_status_of(out):
    return status_rows(TinyStudy()(out))


def test_a_failing_stage_keeps_its_log_and_is_reported(tmp_path):
    summary = launched(tmp_path, factory=TinyStudy(fail=True))
    assert summary["failed"] == ["eval.ab"] and "report" in summary["ok"]
    failed = read_json(tmp_path / "stages" / "eval.ab.failed.json")
    assert "the combination failed" in failed["error"] and failed["job_id"].startswith("local-")
    assert "the combination failed" in (tmp_path / "logs" / "eval.ab.log").read_text()
    table = {r["name"]: r for r in json.loads((tmp_path / "results.json").read_text())["table"]}
    assert table["eval.ab"]["reason"].endswith("(log: logs/eval.ab.log)")


def test_two_launchers_on_one_directory_are_refused(tmp_path, capsys):
    pipe = TinyStudy()(tmp_path)
    with pipe.lock():
        with pytest.raises(StageSelectionError, match="another rpc-attention reproduce is running"):
            launched(tmp_path)
        assert main(["reproduce", "--study", "smoke", "--out", str(tmp_path), "--jobs", "2"]) == 2
    assert "another rpc-attention reproduce is running" in capsys.readouterr().err


def test_status_of_a_study_directory(tmp_path, capsys):
    assert main(["reproduce", "--status", str(tmp_path)]) == 2
    assert "holds no study" in capsys.readouterr().err
    # a study.json with stages (what every run writes first), one stage done, one queued by a launcher
    atomic_write_json(tmp_path / "study.json", {"study": "tiny", "stages": [
        {"name": "train.a", "kind": "train"}, {"name": "train.b", "kind": "train"}, {"name": "eval.ab", "kind": "eval"}]})
    atomic_write_json(tmp_path / "stages" / "train.a.done.json", {"job_id": "11", "seconds": 3.0, "log": "x.log"})
    atomic_write_json(tmp_path / "stages" / "train.b.job.json", {"job_id": "12", "log": str(tmp_path / "b.log"),
                                                                   "submitted": time.time()})
    pipe = Pipeline([Stage("x", "x", fn=lambda ctx: None)], tmp_path)
    with pipe.lock():
        rows = {r["name"]: r for r in study_status(tmp_path)}
        assert rows["train.b"]["status"] == "queued" and rows["train.b"]["log"] == "b.log"
        atomic_write_json(tmp_path / "stages" / "train.b.running.json", {"job": {"job_id": "12"}})
        assert {r["name"]: r["status"] for r in study_status(tmp_path)}["train.b"] == "running"
    rows = {r["name"]: r for r in study_status(tmp_path)}
    assert rows["train.b"]["status"] == "interrupted"  # nothing holds the lock: killed
    assert rows["train.a"]["status"] == "done" and rows["train.a"]["job_id"] == "11"
    assert rows["eval.ab"]["status"] == "not run"
    assert main(["reproduce", "--status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "train.b" in out and "interrupted" in out and "11" in out


def test_the_sbatch_file_carries_the_options_and_resources_of_each_stage_kind(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string

    from rpc_attention.reproduce.slurm import slurm_parameters

    opts = SlurmOptions(partition="gpu", time_min=2880, account="proj42", qos="high", constraint="a100",
                        nodes=2, gpus_per_node=8, cpus_per_task=10)
    train = Stage("train.symvit-s0", "train", fn=lambda ctx: None)
    text = _make_sbatch_string(command="python -m x", folder=tmp_path, **slurm_parameters(train, opts))
    for line in ["--partition=gpu", "--time=2880", "--account=proj42", "--qos=high", "--constraint=a100",
                 "--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=10",
                 "--kill-on-invalid-dep=yes", "--job-name=rpc.train.symvit-s0", f"--output={tmp_path}/%j_0_log.out"]:
        assert f"#SBATCH {line}" in text.splitlines(), line
    assert "--dependency" not in text and "--signal=USR2@120" in text
    ev = Stage("eval.symvit-s0.clean", "eval", fn=lambda ctx: None, deps=["train.symvit-s0"])
    text = _make_sbatch_string(command="x", folder=tmp_path, **slurm_parameters(ev, opts, {"train.symvit-s0": "101"}))
    assert "#SBATCH --dependency=afterok:101" in text and "#SBATCH --gpus-per-node=1" in text
    assert "#SBATCH --nodes=1" in text and "#SBATCH --ntasks-per-node=1" in text
    report = Stage("report", "report", fn=lambda ctx: None, after=["eval.symvit-s0.clean"])
    text = _make_sbatch_string(command="x", folder=tmp_path,
                               **slurm_parameters(report, SlurmOptions(time_min=60), after={"eval.symvit-s0.clean": "102"}))
    assert "#SBATCH --dependency=afterany:102" in text and "gpus-per-node" not in text
    assert not [line for line in text.splitlines() if line.startswith(("#SBATCH --partition", "#SBATCH --account"))]


def test_launcher_options_are_checked(capsys):
    assert main(["reproduce", "--study", "smoke", "--partition", "gpu", "--dry-run"]) == 2
    assert "add --launcher slurm" in capsys.readouterr().err
    assert main(["reproduce", "--study", "smoke", "--jobs", "0", "--dry-run"]) == 2
    assert "--jobs 0" in capsys.readouterr().err
    assert main(["reproduce", "--study", "smoke", "--launcher", "slurm", "--time", "60", "--nodes", "0", "--dry-run"]) == 2
    assert "--nodes must be >= 1" in capsys.readouterr().err
    assert main(["reproduce", "--study", "smoke", "--launcher", "slurm", "--dry-run"]) == 2
    assert "--launcher slurm needs --time" in capsys.readouterr().err


def test_slurm_without_sbatch_is_one_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no SLURM commands, even on a cluster
    assert shutil.which("sbatch") is None
    assert main(["reproduce", "--study", "smoke", "--out", str(tmp_path), "--launcher", "slurm", "--time", "60"]) == 2
    assert "sbatch is not on this machine's PATH" in capsys.readouterr().err
    assert not list((tmp_path / "stages").glob("*.json"))  # nothing ran
