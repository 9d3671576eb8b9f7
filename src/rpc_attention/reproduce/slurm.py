"""A study's stages as SLURM jobs through submitit (``reproduce --launcher slurm``), or through
submitit's local executor (``--launcher submitit-local``: the same path in real processes on this
machine).

Each stage is one job with the resources of its kind (:func:`slurm_parameters`): a training stage
takes ``nodes`` x ``gpus_per_node`` GPUs with one task per GPU, and the tasks run the trainer's DDP
through ``torch.distributed`` with the environment submitit exports (``MASTER_ADDR``, ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``); evaluation and analysis stages take one GPU; compare and report none.
A job waits for the jobs of the stages it needs (``afterok``; the report: ``afterany``) and is removed
from the queue when one of them fails (``kill-on-invalid-dep``). A job's output and errors go to
``DIR/logs/submitit/<job id>_<task>_log.out``.

Preemption and time limits: SLURM signals the job ``signal_delay_s`` before stopping it; submitit
then requeues it (:class:`SubmititStage` is ``Checkpointable``), and the requeued job finds the
stage's running marker and resumes it; a training stage continues from the trainer's last checkpoint.

The launcher follows its jobs with ``squeue`` (a job that left the queue has ended; its stage markers
say how), not with submitit's ``sacct``-based state: a cluster without accounting has no ``sacct``,
and there submitit reports a cancelled job as UNKNOWN for ever. ``sacct``, where it answers, only adds
the final state to the log line. Before submitting, :func:`check_resources` compares what each job asks
for with the nodes ``sinfo`` lists, so a job no node can run is refused instead of pending for ever.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import submitit

from .pipeline import Stage, note_stopped, read_json
from .worker import FINISHED_OK, StageJob, run_stage_job

SIGNAL_DELAY_S = 120  # seconds between SLURM's warning signal and the job's end: time to requeue
# Requeues after a time-out (preemptions do not count): a 300-epoch training with a 24 h limit needs several.
MAX_REQUEUES = 20
GPU_KINDS = ("eval", "analyze")  # one GPU each; train: nodes x gpus_per_node; others: none
QUEUE_INTERVAL_S = 5.0  # at most one squeue call per this many seconds while following jobs
# squeue failing without a break for this long (the controller unreachable): the launcher gives up
UNREACHABLE_S = 600.0
# after cancelling, how long the launcher waits for its jobs to leave the queue (SLURM's KillWait, 30 s
# by default, plus the time to clean up) before it exits and says which are still there
CANCEL_WAIT_S = 120.0


class StageJobFailed(RuntimeError):
    """The stage failed (its failed marker says why): the job exits non-zero, so SLURM does not start
    the stages that need it."""


class SubmititStage(submitit.helpers.Checkpointable):
    """The callable a submitit job runs: one stage (:func:`run_stage_job`). Requeued on preemption or
    time-out with ``force`` off, so the requeued job resumes the stage instead of starting it over."""

    def __call__(self, job: StageJob) -> str:
        env = submitit.JobEnvironment()
        self.checkpointing = False
        _stop_on_sigterm(self, job, str(env.job_id))
        if env.num_tasks > 1:
            # torch.distributed's env:// variables; the trainer picks cuda:LOCAL_RANK itself
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        try:
            outcome = run_stage_job(job, env.job_id, str(env.paths.stdout))
        except KeyboardInterrupt:  # SIGTERM (see _stop_on_sigterm): said in the log already, no traceback
            raise SystemExit(143) from None
        if outcome not in FINISHED_OK:
            raise StageJobFailed(f"stage {job.stage}: {outcome} (see {job.out_dir}/stages/{job.stage}.failed.json)")
        return outcome

    checkpointing = False  # submitit is checkpointing this job for its requeue (a SIGTERM follows)

    def checkpoint(self, job: StageJob) -> submitit.helpers.DelayedSubmission:
        self.checkpointing = True
        note_stopped(Path(job.out_dir) / "stages" / f"{job.stage}.running.json", str(submitit.JobEnvironment().job_id))
        return submitit.helpers.DelayedSubmission(type(self)(), replace(job, force=False))


def _stop_on_sigterm(stage: SubmititStage, job: StageJob, job_id: str) -> None:
    """SIGTERM reaches a job when it is cancelled, requeued or preempted, and SLURM kills it KillWait
    (30 s by default) later. submitit ignores the signal, so the stage would go on for that long: a
    short stage could even finish and write its marker after the launcher had recorded the job as
    ended, and a training would write checkpoints into a stage the next job resumes. So the stage
    stops at SIGTERM (a KeyboardInterrupt: its running marker stays, with the time it ran, and the
    next job or run resumes it). Not while submitit checkpoints the job for its own requeue after the
    time-limit warning: that requeue is what sends the signal, and the checkpoint must finish."""
    running = Path(job.out_dir) / "stages" / f"{job.stage}.running.json"
    record = Path(job.out_dir) / "stages" / f"{job.stage}.job.json"

    def handler(signum, frame) -> None:
        if stage.checkpointing:
            print(f"$ job {job_id}: SIGTERM during the requeue after the time-limit warning: ignored", flush=True)
            return
        why = "cancelled by the launcher" if is_cancelled(read_json(record), job_id) else "cancelled, requeued or preempted"
        print(f"$ job {job_id}: SIGTERM ({why}): stopping stage {job.stage}; the next job resumes it", flush=True)
        note_stopped(running, job_id)
        raise KeyboardInterrupt(f"job {job_id}: SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def is_cancelled(record: Optional[dict], job_id: str) -> bool:
    """Whether a stage's job record says the launcher cancelled job ``job_id``."""
    return bool(record) and str(record.get("job_id")) == str(job_id) and bool(record.get("cancelled"))


def slurm_parameters(stage: Stage, options, needs: Optional[Dict[str, str]] = None,
                     after: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters of ``stage``'s job (``options``: a ``SlurmOptions``;
    ``needs`` / ``after``: job ids of the stages it waits for, by stage name)."""
    # gpus_per_node 0: a CPU-only study (--device cpu): no job asks for a GPU
    gpus_per_node = 8 if options.gpus_per_node is None else options.gpus_per_node
    if stage.kind == "train":
        nodes, gpus = options.nodes, gpus_per_node
    else:
        nodes, gpus = 1, 1 if stage.kind in GPU_KINDS and gpus_per_node else 0
    params: Dict[str, Any] = {
        "job_name": f"rpc.{stage.name}", "nodes": nodes, "ntasks_per_node": max(gpus, 1),
        "cpus_per_task": options.cpus_per_task, "signal_delay_s": SIGNAL_DELAY_S, "stderr_to_stdout": True,
        "additional_parameters": {"kill-on-invalid-dep": "yes"},
    }
    if gpus:
        params["gpus_per_node"] = gpus
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(options, name):
            params[name] = getattr(options, name)
    if options.time_min:
        params["time"] = int(options.time_min)
    deps = [f"afterok:{':'.join(sorted(needs.values()))}"] if needs else []
    deps += [f"afterany:{':'.join(sorted(after.values()))}"] if after else []
    if deps:
        params["dependency"] = ",".join(deps)
    return params


# ------------------------------------------------------------------------------- scheduler queries
def _command(argv: Sequence[str], timeout: float = 60) -> Tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of a SLURM command; 127 when it is not installed, 124 when it hangs."""
    if shutil.which(argv[0]) is None:
        return 127, "", f"{argv[0]} is not on this machine's PATH"
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer in {timeout:.0f} s"
    return res.returncode, res.stdout, res.stderr


def queue_states(job_ids: Sequence[str]) -> Optional[Dict[str, Tuple[str, str]]]:
    """``{job id: (state, reason)}`` of the jobs among ``job_ids`` still in SLURM's queue (``squeue``:
    PENDING, RUNNING, COMPLETING, ...); a job that is not there has ended. None when squeue fails."""
    ids = sorted({str(j) for j in job_ids if j})
    if not ids:
        return {}
    code, out, err = _command(["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(ids)])
    if code != 0:
        # every id unknown to the controller (ended long ago) is an error for squeue, not an empty list
        return {} if "Invalid job id" in err else None
    states = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] in ids:
            states[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return states


def final_state(job_id: str) -> Optional[str]:
    """SLURM's record of how job ``job_id`` ended (``sacct``), None without accounting."""
    code, out, _ = _command(["sacct", "-n", "-X", "-P", "-o", "State", "-j", str(job_id)], timeout=20)
    lines = [x.strip() for x in out.splitlines() if x.strip()] if code == 0 else []
    return lines[-1] if lines else None


def _gres_gpus(gres: str) -> int:
    """GPUs in a node's generic resources as sinfo prints them (``gpu:8``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def nodes(partition: Optional[str] = None) -> Optional[List[dict]]:
    """The nodes of ``partition`` (else of the default partition) from ``sinfo``: name, CPUs, GPUs,
    state; None when sinfo fails."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%c|%G|%P|%T"] + (["-p", partition] if partition else [])
    code, out, _ = _command(argv, timeout=30)
    if code != 0:
        return None
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[1].isdigit():
            continue
        default = parts[3].endswith("*")
        if partition is None and not default:
            continue
        rows.append({"name": parts[0], "cpus": int(parts[1]), "gpus": _gres_gpus(parts[2]),
                     "partition": parts[3].rstrip("*"), "state": parts[4]})
    return rows


def check_resources(stages: Sequence[Stage], options) -> Tuple[List[str], List[str]]:
    """Compare what each stage's job asks for with the nodes of its partition (``sinfo``). Returns
    ``(errors, warnings)``: an error when no node (or not enough nodes) can ever run a job, with the
    largest node and the options to change; a warning when sinfo does not answer (nothing checked)."""
    found = nodes(options.partition)
    where = f"partition {options.partition}" if options.partition else "the default partition"
    if found is None:
        return [], [f"sinfo did not answer: the jobs' resources are not checked against the nodes of {where}"]
    up = [n for n in found if not any(s in n["state"].lower() for s in ("down", "drain", "fail", "inval"))]
    if not found:
        return [f"sinfo lists no node in {where}: choose a partition with --partition (sinfo lists them)"], []
    errors, seen = [], set()
    for s in stages:
        p = slurm_parameters(s, options)
        need = (p["nodes"], p["ntasks_per_node"] * p["cpus_per_task"], p.get("gpus_per_node", 0))
        if need in seen:
            continue
        seen.add(need)
        fit = [n for n in up or found if n["cpus"] >= need[1] and n["gpus"] >= need[2]]
        if len(fit) >= need[0]:
            continue
        big = max(found, key=lambda n: (n["gpus"], n["cpus"]))
        errors.append(
            f"{s.kind} jobs ({s.name}, ...) ask for {need[0]} node(s) with {need[1]} CPUs and {need[2]} GPUs each, "
            f"and {len(fit)} node(s) of {where} have that (the largest: {big['name']}, {big['cpus']} CPUs, "
            f"{big['gpus']} GPUs; sinfo): they would wait for ever. Lower --cpus-per-task, --gpus-per-node or "
            f"--nodes, or choose another --partition")
    return errors, []


class _SubmititJob:
    """A submitted stage job, followed through :class:`_Queue` (squeue)."""

    def __init__(self, job_id: str, log: str, queue: _Queue) -> None:
        self.job_id, self.log, self.queue = str(job_id), str(log), queue
        queue.follow(self.job_id)

    def poll(self) -> Optional[str]:
        return self.queue.ended(self.job_id)

    def cancel(self) -> None:
        _command(["scancel", self.job_id], timeout=30)


class _Queue:
    """The launcher's view of its SLURM jobs: one ``squeue`` call for all of them at most every
    :data:`QUEUE_INTERVAL_S` seconds. A job is running until it has left the queue; squeue failing
    for :data:`UNREACHABLE_S` without a break is an error (the launcher stops instead of waiting for ever)."""

    def __init__(self) -> None:
        self.ids: List[str] = []
        self.states: Dict[str, Tuple[str, str]] = {}
        self.checked = 0.0
        self.failing_since: Optional[float] = None

    def follow(self, job_id: str) -> None:
        self.ids.append(job_id)
        self.states[job_id] = ("PENDING", "submitted")
        self.checked = 0.0  # the next poll asks again

    def refresh(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.checked < QUEUE_INTERVAL_S:
            return
        states = queue_states(self.ids)
        self.checked = now
        if states is None:
            self.failing_since = self.failing_since or now
            if now - self.failing_since > UNREACHABLE_S:
                from .studies import StudyError

                raise StudyError(f"squeue has failed for {UNREACHABLE_S / 60:.0f} minutes: SLURM's controller does "
                                 f"not answer, so the jobs cannot be followed. They may still run: check with "
                                 f"`squeue -j {','.join(self.ids)}`, and rerun this command when the controller answers")
            return
        self.failing_since = None
        self.states = states
        self.ids = [j for j in self.ids if j in states]

    def ended(self, job_id: str) -> Optional[str]:
        self.refresh()
        if job_id in self.states:  # in the queue (or squeue failing: as far as we know)
            return None
        state = final_state(job_id)
        return f"state {state}" if state else "left the queue"

    def wait_gone(self, job_ids: Sequence[str], wait_s: float) -> List[str]:
        """Wait until the jobs ``job_ids`` have left the queue, at most ``wait_s``; returns those still there."""
        deadline = time.time() + wait_s
        left = [str(j) for j in job_ids]
        while left:
            states = queue_states(left)
            left = left if states is None else [j for j in left if j in states]
            if not left or time.time() > deadline:
                break
            time.sleep(1.0)
        return left


class _LocalJob:
    """A job of submitit's local executor (a process on this machine)."""

    def __init__(self, job) -> None:
        self.job = job
        self.job_id = str(job.job_id)
        self.log = str(job.paths.stdout)

    def poll(self) -> Optional[str]:
        if not self.job.done():
            return None
        return f"state {self.job.state}"

    def cancel(self) -> None:
        self.job.cancel(check=False)


class SubmitError(RuntimeError):
    """sbatch refused a job: the message is sbatch's."""


class SubmititExecutor:
    """Submits stages through submitit: ``cluster=True`` to SLURM, else to submitit's local executor
    (one process per job on this machine; it has no dependencies, so the launcher submits a stage
    once the stages it needs have finished)."""

    def __init__(self, out_dir: Path, options, cluster: bool) -> None:
        self.folder = Path(out_dir) / "logs" / "submitit"
        self.options = options
        self.cluster = cluster
        self.name = "slurm" if cluster else "submitit-local"
        self.handles_dependencies = cluster
        self.queue = _Queue()
        self.cancelled: List[str] = []

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)

    def adopt(self, job_id: str, log: str) -> _SubmititJob:
        """Follow a job an earlier launcher submitted for this study (still in the queue)."""
        return _SubmititJob(job_id, log, self.queue)

    def cancel(self, jobs) -> None:
        for job in jobs:
            job.cancel()
        if self.cluster:
            self.cancelled += [j.job_id for j in jobs]

    def close(self) -> List[str]:
        """After cancelling: wait until the cancelled jobs have left the queue (so no job of this run
        writes in the study directory once the command returns); returns the ids still there."""
        if not self.cancelled:
            return []
        left = self.queue.wait_gone(self.cancelled, CANCEL_WAIT_S)
        self.cancelled = []
        return left

    def _local_parameters(self, stage: Stage) -> Dict[str, Any]:
        import torch

        return {"timeout_min": 60 * 24 * 30, "tasks_per_node": 1, "signal_delay_s": SIGNAL_DELAY_S, "stderr_to_stdout": True,
                "gpus_per_node": torch.cuda.device_count() if stage.kind != "report" else 0}

    def submit(self, stage: Stage, job: StageJob, needs, after):
        # a new executor per job: submitit's parameters accumulate, and a job must not inherit the
        # dependencies or GPUs of the one before
        if not self.cluster:
            executor = submitit.LocalExecutor(folder=self.folder, max_num_timeout=MAX_REQUEUES)
            executor.update_parameters(**self._local_parameters(stage))
            return _LocalJob(executor.submit(SubmititStage(), replace(job, launcher=self.name)))
        executor = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(**slurm_parameters(stage, self.options, {k: j.job_id for k, j in needs.items()},
                                                      {k: j.job_id for k, j in after.items()}))
        self.folder.mkdir(parents=True, exist_ok=True)
        before = set(self.folder.iterdir())
        try:
            submitted = executor.submit(SubmititStage(), replace(job, launcher=self.name))
        except (submitit.core.utils.FailedJobError, subprocess.SubprocessError, OSError) as exc:
            for path in set(self.folder.iterdir()) - before:  # the pickle and sbatch file of the refused job
                if path.is_file():
                    path.unlink()
            message = str(exc).strip().splitlines()
            raise SubmitError(" ".join(line.strip() for line in message if "sbatch" in line or "error" in line.lower())
                              or str(exc)) from None
        return _SubmititJob(str(submitted.job_id), str(submitted.paths.stdout), self.queue)

