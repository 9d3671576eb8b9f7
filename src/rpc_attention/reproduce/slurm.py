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
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Optional

import submitit

from .pipeline import Stage
from .worker import FINISHED_OK, StageJob, run_stage_job

SIGNAL_DELAY_S = 120  # seconds between SLURM's warning signal and the job's end: time to requeue
# Requeues after a time-out (preemptions do not count): a 300-epoch training with a 24 h limit needs several.
MAX_REQUEUES = 20
GPU_KINDS = ("eval", "analyze")  # one GPU each; train: nodes x gpus_per_node; others: none


class StageJobFailed(RuntimeError):
    """The stage failed (its failed marker says why): the job exits non-zero, so SLURM does not start
    the stages that need it."""


class SubmititStage(submitit.helpers.Checkpointable):
    """The callable a submitit job runs: one stage (:func:`run_stage_job`). Requeued on preemption or
    time-out with ``force`` off, so the requeued job resumes the stage instead of starting it over."""

    def __call__(self, job: StageJob) -> str:
        env = submitit.JobEnvironment()
        if env.num_tasks > 1:
            # torch.distributed's env:// variables; the trainer picks cuda:LOCAL_RANK itself
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        outcome = run_stage_job(job, env.job_id, str(env.paths.stdout))
        if outcome not in FINISHED_OK:
            raise StageJobFailed(f"stage {job.stage}: {outcome} (see {job.out_dir}/stages/{job.stage}.failed.json)")
        return outcome

    def checkpoint(self, job: StageJob) -> submitit.helpers.DelayedSubmission:
        return submitit.helpers.DelayedSubmission(self, replace(job, force=False))


def slurm_parameters(stage: Stage, options, needs: Optional[Dict[str, str]] = None,
                     after: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters of ``stage``'s job (``options``: a ``SlurmOptions``;
    ``needs`` / ``after``: job ids of the stages it waits for, by stage name)."""
    if stage.kind == "train":
        nodes, gpus = options.nodes, options.gpus_per_node
    else:
        nodes, gpus = 1, 1 if stage.kind in GPU_KINDS else 0
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


class _SubmititJob:
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

    def wait(self, timeout: float) -> None:
        time.sleep(timeout)  # submitit polls its jobs' state (on SLURM through sacct, rate-limited)

    def close(self) -> None:
        """Nothing to release: each job is a process (or a SLURM job) of its own."""

    def _local_parameters(self, stage: Stage) -> Dict[str, Any]:
        import torch

        return {"timeout_min": 60 * 24 * 30, "tasks_per_node": 1, "signal_delay_s": SIGNAL_DELAY_S, "stderr_to_stdout": True,
                "gpus_per_node": torch.cuda.device_count() if stage.kind != "report" else 0}

    def submit(self, stage: Stage, job: StageJob, needs, after) -> _SubmititJob:
        # a new executor per job: submitit's parameters accumulate, and a job must not inherit the
        # dependencies or GPUs of the one before
        if self.cluster:
            executor = submitit.SlurmExecutor(folder=self.folder, max_num_timeout=MAX_REQUEUES)
            executor.update_parameters(**slurm_parameters(stage, self.options, {k: j.job_id for k, j in needs.items()},
                                                          {k: j.job_id for k, j in after.items()}))
        else:
            executor = submitit.LocalExecutor(folder=self.folder, max_num_timeout=MAX_REQUEUES)
            executor.update_parameters(**self._local_parameters(stage))
        return _SubmititJob(executor.submit(SubmititStage(), replace(job, launcher=self.name)))
