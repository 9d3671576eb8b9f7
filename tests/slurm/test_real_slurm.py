"""``reproduce --launcher slurm`` on a real SLURM (``make test-slurm``; see ``conftest.py``): a CPU-only
node, no GPU options. The smoke study gives the numbers of a serial run; a training job requeued by
``scontrol requeue`` resumes from its checkpoint; a job cancelled with ``scancel`` is recorded as failed
with its log, and the rerun completes; the submitting command stopped by SIGTERM cancels its jobs, and
killed by SIGKILL leaves them queued, where the rerun follows them: no stage runs twice, none is lost.
Without accounting (no ``sacct``) throughout; the scancel case again with accounting (slurmdbd)."""

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_launchers_smoke import VOLATILE, _stable

pytestmark = pytest.mark.slurm

SLURM = ["--launcher", "slurm", "--time", "10", "--cpus-per-task", "1", "--threads", "1"]
# a training long enough to be requeued or cancelled between two checkpoints (a few hundred steps)
LONG = ["--set", "train_subset=2048", "--set", "epochs=3", "--set",
        "train_overrides=[model.kwargs.embed_dim=32, model.kwargs.depth=2, model.kwargs.num_heads=2, "
        "train.log_every=2, train.threads=0, train.save_every=8]"]
FEW = ["--stages", "train.symvit-s0,eval.symvit-s0.clean,report"]
TWO = ["--stages", "train.symvit-s0,train.rpc6-s0,eval.symvit-s0.clean,eval.rpc6-s0.clean,report"]
_serial_cache = {}


def reproduce(out, *args, env=None, wait=True, timeout=900):
    argv = [sys.executable, "-m", "rpc_attention", "reproduce", "--study", "smoke", "--out", str(out), *args]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    if not wait:
        return proc
    out_text, err_text = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, out_text, err_text)


def results(out, ignore=()):
    skip = VOLATILE | set(ignore)

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in skip}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(_stable(json.loads((Path(out) / "results.json").read_text()), out))


def serial(tmp_path_factory, *args):
    if args not in _serial_cache:
        out = tmp_path_factory.mktemp("serial")
        res = reproduce(out, "--threads", "1", *args)
        assert res.returncode == 0, res.stderr[-3000:]
        _serial_cache[args] = out
    return _serial_cache[args]


def wait_for(cond, what, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def record(out, stage):
    path = Path(out) / "stages" / f"{stage}.job.json"
    return json.loads(path.read_text()) if path.exists() else None


def marker(out, stage, status="done"):
    path = Path(out) / "stages" / f"{stage}.{status}.json"
    return json.loads(path.read_text()) if path.exists() else None


def status(out, env):
    # a generous limit: on a loaded machine importing torch alone has taken 40 s
    res = subprocess.run([sys.executable, "-m", "rpc_attention", "reproduce", "--status", str(out)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("stage", "") and not cells[0].startswith("-"):
            rows[cells[0]] = {"status": cells[2], "job": cells[3], "log": cells[5], "reason": cells[6]}
    return rows


def in_queue(cluster, job_ids):
    res = cluster.run(["squeue", "-h", "-o", "%i"])
    return sorted(set(res.stdout.split()) & {str(j) for j in job_ids})


def first_checkpoint(out):
    return list((Path(out) / "runs" / "symvit-s0" / "checkpoints").glob("step_*"))


@contextmanager
def started_study(cluster, tmp_path, tmp_path_factory, args, ready, what):
    """The start the requeue, scancel and kill tests share: the serial reference of the smoke study with
    ``args``, then the same study submitted to ``cluster`` by a command left running, waited on until
    ``ready(out)`` (``what`` names it in the time-out). Yields ``(reference, out, proc)``; the submitting
    command is killed on the way out, whatever happened."""
    reference = serial(tmp_path_factory, *args)
    out = tmp_path / "study"
    proc = reproduce(out, *SLURM, *args, env=cluster.env, wait=False)
    try:
        wait_for(lambda: ready(out), what)
        yield reference, out, proc
    finally:
        proc.kill()


def test_the_smoke_study_through_slurm_gives_the_serial_numbers(cluster, tmp_path, tmp_path_factory):
    reference = serial(tmp_path_factory)
    out = tmp_path / "study"
    res = reproduce(out, *SLURM, env=cluster.env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "38 ok" in res.stdout
    assert results(out) == results(reference)  # every number, bit for bit
    rows = status(out, cluster.env)
    assert len(rows) == 38 and {r["status"] for r in rows.values()} == {"done"}
    assert all(r["job"].isdigit() for r in rows.values())
    sbatch = (out / "logs" / "submitit").glob("*_submitted.pkl")
    assert len(list(sbatch)) == 38  # one job per stage, none twice


def test_a_requeued_training_job_resumes_from_its_checkpoint(cluster, tmp_path, tmp_path_factory):
    with started_study(cluster, tmp_path, tmp_path_factory, (*LONG, *FEW), first_checkpoint,
                       "the first checkpoint") as (reference, out, proc):
        job = record(out, "train.symvit-s0")["job_id"]
        # requeued and held (so that the test sees it waiting): --status says queued, with SLURM's reason,
        # although the stage's running marker is still there
        assert cluster.run(["scontrol", "requeuehold", job]).returncode == 0
        wait_for(lambda: "PENDING" in cluster.run(["squeue", "-h", "-o", "%T", "-j", job]).stdout, "pending", 120)
        row = status(out, cluster.env)["train.symvit-s0"]
        # SLURM's reason for a job requeued in held state: "job requeued in held state" (22.05)
        assert row["status"] == "queued" and "SLURM: PENDING (" in row["reason"] and "held" in row["reason"], row
        assert marker(out, "train.symvit-s0", "running")["stopped"]  # stopped at SIGTERM, when noted
        assert cluster.run(["scontrol", "release", job]).returncode == 0
        text, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-2000:] + err[-3000:]
    done = marker(out, "train.symvit-s0")
    assert done["resumed"] is True and done["attempts"] == 2 and done["job_id"] == job  # the same job, again
    log = (out / "logs" / "submitit" / f"{job}_0_log.out").read_text()
    assert "resuming from the last checkpoint" in log
    assert results(out, ignore={"resumed"}) == results(reference, ignore={"resumed"})


def _scancel_then_rerun(cluster, tmp_path, tmp_path_factory):
    with started_study(cluster, tmp_path, tmp_path_factory, (*LONG, *FEW), first_checkpoint,
                       "the first checkpoint") as (reference, out, proc):
        job = record(out, "train.symvit-s0")["job_id"]
        assert cluster.run(["scancel", job]).returncode == 0
        text, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, text[-2000:] + err[-3000:]
    rows = status(out, cluster.env)
    train = rows["train.symvit-s0"]
    seen = cluster.run(["squeue", "-h", "-o", "%i|%T|%r", "-j", job]).stdout
    markers = {f.name: f.read_text() for f in (out / "stages").glob("train.symvit-s0.*")}
    assert train["status"] == "failed" and f"slurm job {job} ended without finishing" in train["reason"], (
        train, seen, markers, err[-3000:])
    assert train["log"] == f"logs/submitit/{job}_0_log.out" and (out / train["log"]).is_file()
    assert rows["eval.symvit-s0.clean"]["status"] != "done" and rows["report"]["status"] == "done"
    table = {r["name"]: r for r in json.loads((out / "results.json").read_text())["stages"]}
    assert table["train.symvit-s0"]["status"] == "failed" and f"(log: {train['log']})" in table["train.symvit-s0"]["reason"]
    assert "train.symvit-s0" in (out / "report.md").read_text()
    again = reproduce(out, *SLURM, *LONG, *FEW, env=cluster.env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    done = marker(out, "train.symvit-s0")
    assert done["resumed"] is True and done["attempts"] == 2 and done["job_id"] != job
    assert done["seconds"] > done["attempt_s"]  # the cancelled attempt counts
    assert results(out, ignore={"resumed"}) == results(reference, ignore={"resumed"})


def test_a_cancelled_job_is_failed_with_its_log_and_the_rerun_completes(cluster, tmp_path, tmp_path_factory):
    _scancel_then_rerun(cluster, tmp_path, tmp_path_factory)


def test_with_accounting_a_cancelled_job_is_failed_with_its_log_and_the_rerun_completes(
        accounting_cluster, tmp_path, tmp_path_factory):
    assert accounting_cluster.run(["sacct", "-n", "-X"]).returncode == 0  # sacct answers here
    _scancel_then_rerun(accounting_cluster, tmp_path, tmp_path_factory)


def _all_submitted(out, stages):
    return all(record(out, s) for s in stages)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_submitting_command_killed_then_rerun_runs_every_stage_once(cluster, tmp_path, tmp_path_factory, signum):
    stages = TWO[1].split(",")
    # the report is submitted only once the launcher has recorded every other stage's outcome
    early = [s for s in stages if s != "report"]
    with started_study(cluster, tmp_path, tmp_path_factory, TWO, lambda out: _all_submitted(out, early),
                       "every stage but the report submitted") as (reference, out, proc):
        jobs = {s: record(out, s)["job_id"] for s in early}
        # the jobs still waiting for others are held, so that some are queued when the launcher is gone
        held = [j for j in jobs.values() if cluster.run(["scontrol", "hold", j]).returncode == 0]
        assert held
        os.kill(proc.pid, signum)
        text, err = proc.communicate(timeout=300)
    if signum == signal.SIGKILL:
        rows = status(out, cluster.env)  # before the release: held jobs are still queued
        assert any("no launcher follows it" in (r["reason"] or "") for r in rows.values()), rows
    for j in held:
        cluster.run(["scontrol", "release", j])
    left = in_queue(cluster, jobs.values())
    if signum == signal.SIGTERM:
        assert proc.returncode == 130, err[-3000:]
        assert "interrupted; run `rpc-attention reproduce --study smoke --out" in err and "--launcher slurm" in err
        assert left == []  # cancelled, and gone before the command returned
    else:
        assert left, "the jobs finished before the test could kill their launcher"
    again = reproduce(out, *SLURM, *TWO, env=cluster.env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    submitted = sorted((out / "logs" / "submitit").glob("*_submitted.pkl"))
    if signum == signal.SIGKILL:
        # the jobs still queued when the rerun started are followed, under their ids; none is submitted again
        followed = [s for s in early if f"{s}: following slurm job {jobs[s]}" in again.stderr + again.stdout]
        assert followed and len(submitted) == len(stages)
        assert all(record(out, s)["job_id"] == jobs[s] for s in early)
    for s in stages:  # every stage done once, by the job on record
        done = marker(out, s)
        assert done is not None and str(done["job_id"]) == str(record(out, s)["job_id"])
    assert results(out, ignore={"resumed"}) == results(reference, ignore={"resumed"})
