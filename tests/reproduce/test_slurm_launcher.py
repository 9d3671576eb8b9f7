"""``--launcher slurm`` against what a real scheduler does, with stand-in SLURM commands on PATH (shell
scripts that print what sinfo / squeue / sbatch print on a real cluster and log their calls): a CPU-only
partition asks for no GPU; jobs no node can run are refused before anything is submitted; an sbatch
refusal is one message and leaves no file behind; --time shorter than the warning signal is refused;
the study's jobs still in the queue are followed or refused with the scancel command; --status asks
squeue; a launcher follows its jobs with squeue (no sacct needed); a job the launcher cancelled, or one
whose stage another job has taken over, writes no marker; a failed stage rerun from its checkpoint says
so and counts its earlier seconds; SIGTERM and SIGHUP stop a run as Ctrl-C does; the resume hint
repeats the whole command. The same paths run on a real SLURM in ``tests/slurm`` (``make test-slurm``)."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from rpc_attention.cli import main
from rpc_attention.reproduce import LaunchOptions, SlurmOptions, study_status
from rpc_attention.reproduce.launch import interrupted_by_signals, live_jobs
from rpc_attention.reproduce.pipeline import Pipeline, Stage, atomic_write_json, read_json
from rpc_attention.reproduce.slurm import _gres_gpus, _Queue, check_resources, slurm_parameters

SMOKE = ["reproduce", "--study", "smoke"]


class FakeSlurm:
    """Stand-ins for SLURM's commands in a directory that is alone on PATH (with this Python's)."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.calls = root / "calls.log"
        for name in ("sinfo", "squeue", "sbatch", "scancel", "sacct", "srun"):
            self.set(name, "", 0 if name != "sacct" else 1)

    def set(self, name: str, stdout: str, code: int = 0, stderr: str = "") -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\necho \"{name} $*\" >> '{self.calls}'\n"
                        f"printf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {code}\n")
        path.chmod(0o755)

    def called(self, name: str) -> list:
        if not self.calls.exists():
            return []
        return [line for line in self.calls.read_text().splitlines() if line.startswith(name + " ")]


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{Path(sys.executable).parent}")
    fake.set("sinfo", "vm|2|(null)|cpu*|idle\n")
    return fake


def _stage(kind, name=None):
    return Stage(name or f"{kind}.x", kind, fn=lambda ctx: None)


def test_a_cpu_study_asks_for_no_gpu_and_gpus_per_node_0_is_accepted(capsys):
    cpu = LaunchOptions("slurm", slurm=SlurmOptions(time_min=60), device="cpu").resolved_slurm()
    for kind in ("train", "eval", "analyze", "report"):
        p = slurm_parameters(_stage(kind), cpu)
        assert "gpus_per_node" not in p and p["ntasks_per_node"] == 1, kind
    gpu = LaunchOptions("slurm", slurm=SlurmOptions(time_min=60), device="cuda").resolved_slurm()
    assert slurm_parameters(_stage("eval"), gpu)["gpus_per_node"] == 1
    assert slurm_parameters(_stage("train"), gpu)["gpus_per_node"] == 8
    base = SMOKE + ["--launcher", "slurm", "--time", "60", "--dry-run"]
    assert main(base + ["--device", "cpu", "--gpus-per-node", "0"]) == 0
    capsys.readouterr()
    assert main(base + ["--device", "cpu", "--gpus-per-node", "2"]) == 2
    assert "hold GPUs they do not use" in capsys.readouterr().err
    with pytest.raises(ValueError, match="would have no GPU"):
        LaunchOptions("slurm", slurm=SlurmOptions(time_min=60, gpus_per_node=0), device="cuda").check()
    assert main(base + ["--gpus-per-node", "-1"]) == 2
    assert "--gpus-per-node must be >= 0" in capsys.readouterr().err


def test_time_shorter_than_the_warning_signal_is_refused(capsys):
    for minutes in (1, 2):
        assert main(SMOKE + ["--launcher", "slurm", "--time", str(minutes), "--dry-run"]) == 2
        assert "give at least 3 minutes" in capsys.readouterr().err
    assert main(SMOKE + ["--launcher", "slurm", "--time", "3", "--dry-run"]) == 0


def test_gpus_in_sinfo_generic_resources():
    assert _gres_gpus("(null)") == 0 and _gres_gpus("gpu:8") == 8
    assert _gres_gpus("gpu:a100:4(S:0-1),gpu:v100:2") == 6 and _gres_gpus("mps:100,gpu:2") == 2


def test_jobs_no_node_can_run_are_refused_before_anything_is_submitted(slurm, tmp_path, capsys):
    stages = [_stage("train"), _stage("eval"), _stage("report", "report")]
    errors, _ = check_resources(stages, SlurmOptions(time_min=60, gpus_per_node=0, cpus_per_task=1))
    assert errors == []
    errors, _ = check_resources(stages, SlurmOptions(time_min=60, gpus_per_node=8, cpus_per_task=1))
    assert len(errors) == 2 and "0 node(s)" in errors[0] and "vm, 2 CPUs, 0 GPUs" in errors[0]
    out = tmp_path / "study"
    # the defaults (10 CPUs per task) on a 2-CPU node: refused, nothing submitted, no marker written
    assert main(SMOKE + ["--out", str(out), "--launcher", "slurm", "--time", "60"]) == 2
    err = capsys.readouterr().err
    assert "ask for 1 node(s) with 10 CPUs and 0 GPUs" in err and "--cpus-per-task" in err
    assert slurm.called("sinfo") and not slurm.called("sbatch")
    assert not list((out / "stages").glob("*.json"))
    # sinfo not answering: a warning, not a refusal
    slurm.set("sinfo", "", 1, "sinfo: error: Unable to contact slurm controller")
    assert check_resources(stages, SlurmOptions(time_min=60))[1][0].startswith("sinfo did not answer")


def test_an_sbatch_refusal_is_one_message_and_leaves_no_file(slurm, tmp_path, capsys):
    slurm.set("sbatch", "", 1, "sbatch: error: Invalid generic resource (gres) specification\n")
    out = tmp_path / "study"
    code = main(SMOKE + ["--out", str(out), "--launcher", "slurm", "--time", "60", "--cpus-per-task", "1",
                         "--threads", "1", "--stages", "train.symvit-s0"])
    err = capsys.readouterr().err
    assert code == 2 and "submitting stage train.symvit-s0 failed" in err and "Invalid generic resource" in err
    assert "Traceback" not in err
    assert [p.name for p in (out / "logs" / "submitit").rglob("*") if p.is_file()] == []


def _records(out, ids):
    out = Path(out)
    atomic_write_json(out / "study.json", {"study": "tiny", "stages": [
        {"name": n, "kind": n.split(".")[0]} for n in ids]})
    for name, job_id in ids.items():
        atomic_write_json(out / "stages" / f"{name}.job.json", {"name": name, "launcher": "slurm", "job_id": job_id,
                                                                 "log": str(out / "logs" / f"{job_id}.out")})


def test_status_asks_squeue_for_what_the_scheduler_does(slurm, tmp_path):
    _records(tmp_path, {"train.a": "12", "train.b": "13", "eval.ab": "14"})
    # train.a requeued: waiting in the queue with its running marker in place; train.b started but not
    # yet written its marker; eval.ab waits for its dependencies
    atomic_write_json(tmp_path / "stages" / "train.a.running.json", {"job": {"job_id": "12"}, "started": 1.0})
    slurm.set("squeue", "12|PENDING|BeginTime\n13|RUNNING|None\n14|PENDING|Dependency\n")
    pipe = Pipeline([_stage("x")], tmp_path)
    with pipe.lock():
        rows = {r["name"]: r for r in study_status(tmp_path)}
    assert rows["train.a"]["status"] == "queued" and "BeginTime" in rows["train.a"]["reason"]
    assert rows["train.b"]["status"] == "running" and rows["eval.ab"]["status"] == "queued"
    # nobody follows them any more (the launcher was killed): said so
    rows = {r["name"]: r for r in study_status(tmp_path)}
    assert rows["train.b"]["status"] == "running" and "no launcher follows it" in rows["train.b"]["reason"]
    slurm.set("squeue", "", 1, "slurm_load_jobs error: Invalid job id specified\n")  # all ended
    rows = {r["name"]: r for r in study_status(tmp_path)}
    assert rows["train.a"]["status"] == "interrupted" and rows["train.b"]["status"] == "not run"


def test_jobs_still_queued_are_refused_with_the_scancel_command_unless_a_slurm_run_follows_them(slurm, tmp_path, capsys):
    out = tmp_path / "study"
    for name, job_id in {"train.symvit-s0": "21", "train.rpc6-s0": "22"}.items():
        atomic_write_json(out / "stages" / f"{name}.job.json", {"name": name, "launcher": "slurm", "job_id": job_id,
                                                                 "log": "x.out"})
    slurm.set("squeue", "21|RUNNING|None\n")
    assert set(live_jobs(Pipeline([_stage("train", "train.symvit-s0"), _stage("train", "train.rpc6-s0")], out))) == \
        {"train.symvit-s0"}
    capsys.readouterr()
    for extra in (["--jobs", "2"], ["--launcher", "slurm", "--time", "60", "--cpus-per-task", "1", "--force"]):
        assert main(SMOKE + ["--out", str(out), "--threads", "1", *extra]) == 2
        err = capsys.readouterr().err
        assert "still queued or running (train.symvit-s0)" in err and "scancel 21" in err
    assert not slurm.called("sbatch") and not (out / "stages" / "train.symvit-s0.running.json").exists()


def test_the_launcher_follows_its_jobs_with_squeue_without_sacct(slurm, monkeypatch):
    import rpc_attention.reproduce.slurm as S

    monkeypatch.setattr(S, "QUEUE_INTERVAL_S", 0.0)
    queue = _Queue()
    queue.follow("31")
    queue.follow("32")
    slurm.set("squeue", "31|RUNNING|None\n32|PENDING|Dependency\n")
    assert queue.ended("31") is None and queue.ended("32") is None
    slurm.set("squeue", "32|PENDING|Dependency\n")  # 31 was cancelled: it left the queue
    assert queue.ended("31") == "left the queue" and queue.ended("32") is None
    slurm.set("sacct", "CANCELLED by 0\n")  # with accounting, its final state is named
    slurm.set("squeue", "", 1, "slurm_load_jobs error: Invalid job id specified\n")
    assert queue.ended("32") == "state CANCELLED by 0"
    # the controller not answering: still running as far as anyone knows, then one error
    queue.follow("33")
    slurm.set("squeue", "", 1, "slurm_load_jobs error: Unable to contact slurm controller\n")
    assert queue.ended("33") is None
    monkeypatch.setattr(S, "UNREACHABLE_S", 0.0)
    time.sleep(0.01)
    with pytest.raises(Exception, match="squeue has failed"):
        queue.ended("33")


def _job_pipeline(out, fn, job_id="41"):
    pipe = Pipeline([Stage("train.a", "train", fn)], out, log=lambda m: None)
    pipe.job = {"launcher": "slurm", "job_id": job_id, "log": "x.out"}
    return pipe


def test_a_cancelled_job_or_one_whose_stage_was_taken_over_writes_no_marker(tmp_path):
    def taken_over(ctx):  # a second job started on the stage meanwhile
        running = read_json(ctx.pipeline.marker_path("train.a", "running"))
        atomic_write_json(ctx.pipeline.marker_path("train.a", "running"), {**running, "job": {"job_id": "42"}})
        return {"result": {"x": 1}}

    assert _job_pipeline(tmp_path / "a", taken_over).run_stage("train.a") == "cancelled"
    assert not (tmp_path / "a" / "stages" / "train.a.done.json").exists()
    assert (tmp_path / "a" / "stages" / "train.a.running.json").exists()  # the other job's

    def cancelled(ctx):  # its launcher cancelled it while it ran
        atomic_write_json(ctx.out_dir / "stages" / "train.a.job.json", {"job_id": "41", "cancelled": 1.0})
        raise RuntimeError("killed mid-write")

    assert _job_pipeline(tmp_path / "b", cancelled).run_stage("train.a") == "cancelled"
    assert not (tmp_path / "b" / "stages" / "train.a.failed.json").exists()
    # not cancelled, its own stage: written as always
    assert _job_pipeline(tmp_path / "c", lambda ctx: {"result": {"x": 1}}).run_stage("train.a") == "done"


def test_a_failed_stage_rerun_from_its_checkpoint_is_resumed_and_counts_its_earlier_seconds(tmp_path):
    def flaky(ctx):
        ckpt = ctx.out_dir / "ckpt"
        if not ckpt.exists():
            ckpt.write_text("half")
            raise RuntimeError("node lost")
        return {"result": {"resumed_from": ckpt.read_text(), "resuming": ctx.resuming}}

    pipe = _job_pipeline(tmp_path, flaky)
    assert pipe.run_stage("train.a") == "failed"
    failed = read_json(tmp_path / "stages" / "train.a.failed.json")
    pipe.job = {"launcher": "slurm", "job_id": "43", "log": "y.out"}
    assert pipe.run_stage("train.a") == "done"
    done = read_json(tmp_path / "stages" / "train.a.done.json")
    assert done["resumed"] is True and done["result"] == {"resumed_from": "half", "resuming": True}
    assert done["attempts"] == 2
    assert done["seconds"] == pytest.approx(done["attempt_s"] + failed["seconds"])
    # a lost job (recorded by the launcher) counts the same way
    pipe2 = _job_pipeline(tmp_path / "lost", lambda ctx: {"result": {"resuming": ctx.resuming}})
    pipe2.marker_dir.mkdir(parents=True)
    atomic_write_json(pipe2.marker_path("train.a", "running"), {
        "started": time.time() - 5, "attempts": 1, "fingerprint": pipe2.fingerprint(pipe2.stages[0]),
        "job": {"job_id": "41"}, "earlier_s": 2.0})
    pipe2.record_lost("train.a", "the slurm job 41 ended without finishing the stage")
    lost = read_json(pipe2.marker_path("train.a", "failed"))
    assert pipe2.run_stage("train.a") == "done"
    done = read_json(pipe2.marker_path("train.a", "done"))
    assert done["resumed"] is True and done["result"]["resuming"] is True
    assert done["seconds"] == pytest.approx(done["attempt_s"] + lost["seconds"] + 2.0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tmp_path, signum):
    from test_launchers import TinyStudy, launched, results, serial

    out, hold = tmp_path / "study", tmp_path / "hold"
    hold.write_text("")
    seen = {}

    def send_when_holding():
        for _ in range(2400):
            if (out / "train.a.holding").exists():
                break
            time.sleep(0.05)
        seen["pid"] = int((out / "train.a.holding").read_text())
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=send_when_holding)
    sender.start()
    with pytest.raises(KeyboardInterrupt), interrupted_by_signals():
        launched(out, "local", factory=TinyStudy(hold=str(hold)))
    sender.join()
    with pytest.raises(ProcessLookupError):  # the worker was stopped with the run
        for _ in range(100):
            os.kill(seen["pid"], 0)
            time.sleep(0.1)
    assert (out / "stages" / "train.a.running.json").exists()
    assert read_json(out / "stages" / "train.a.job.json")["cancelled"]
    assert signal.getsignal(signum) is not None
    hold.unlink()
    again = launched(out, "local")
    assert "train.a" in again["ok"] and not again["failed"]
    clean = tmp_path / "clean"
    serial(clean)
    assert results(out) == results(clean)


def test_the_resume_hint_repeats_the_whole_command(monkeypatch, capsys):
    import rpc_attention.reproduce as R

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "run_study", interrupted)
    argv = SMOKE + ["--out", "/tmp/my study", "--set", "seeds=[0, 1]", "--launcher", "slurm", "--time", "60",
                    "--cpus-per-task", "1", "--threads", "1", "--force"]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert ("run `rpc-attention reproduce --study smoke --out '/tmp/my study' --set 'seeds=[0, 1]' --launcher slurm "
            "--time 60 --cpus-per-task 1 --threads 1` again to resume") in err


def test_a_slurm_job_stops_its_stage_at_sigterm_and_notes_when(tmp_path):
    from rpc_attention.reproduce.slurm import SubmititStage, _stop_on_sigterm
    from rpc_attention.reproduce.worker import StageJob

    running = tmp_path / "stages" / "train.a.running.json"
    atomic_write_json(running, {"started": 1.0, "job": {"job_id": "51"}})
    stage, previous = SubmititStage(), signal.getsignal(signal.SIGTERM)
    try:
        _stop_on_sigterm(stage, StageJob(factory=None, out_dir=str(tmp_path), stage="train.a", threads=1), "51")
        stage.checkpointing = True  # submitit's own requeue after the time-limit warning: the checkpoint finishes
        os.kill(os.getpid(), signal.SIGTERM)
        assert "stopped" not in read_json(running)
        stage.checkpointing = False  # scancel, scontrol requeue, preemption: the stage stops now
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert read_json(running)["stopped"] > 1.0
    finally:
        signal.signal(signal.SIGTERM, previous)


class _ClusterLike:
    """An executor that, like SLURM, starts a job once its dependencies have ended: jobs end in the order
    submitted, one per poll, without running their stage (as a cancelled job ends without a marker).
    ``seen`` holds, for each submitted stage, the markers in place when it was submitted."""

    name = "slurm"
    handles_dependencies = True

    def __init__(self, pipe) -> None:
        self.pipe, self.jobs, self.seen = pipe, [], {}

    def submit(self, stage, job, needs, after):
        self.seen[stage.name] = {n: self.pipe.status(n) for n in self.pipe.by_name}
        handle = type("J", (), {"job_id": str(len(self.jobs) + 1), "log": "x.out", "ended": None})()
        handle.poll = lambda h=handle: h.ended
        handle.cancel = lambda: None
        self.jobs.append(handle)
        return handle

    def wait(self, timeout):
        live = [j for j in self.jobs if j.ended is None]
        if live:
            live[0].ended = "state CANCELLED"

    def cancel(self, jobs):
        pass

    def close(self):
        return []


def test_a_stage_that_runs_after_others_is_submitted_once_their_lost_jobs_are_recorded(tmp_path):
    # SLURM would start the report the moment the cancelled training left the queue, before the
    # launcher records the training as failed: the report would list it as still running
    from rpc_attention.reproduce.launch import run_graph

    stages = [Stage("train.a", "train", fn=lambda ctx: None),
              Stage("report", "report", fn=lambda ctx: None, after=("train.a",))]
    pipe = Pipeline(stages, tmp_path, log=lambda m: None)
    executor = _ClusterLike(pipe)
    run_graph(pipe, pipe.checked_plan(), executor, make_job=lambda s: s.name, max_jobs=0, poll_s=0)
    assert list(executor.seen) == ["train.a", "report"]
    assert executor.seen["report"]["train.a"] == "failed"
