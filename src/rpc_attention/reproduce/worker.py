"""Stages in processes of their own: what a launcher's workers run (``reproduce --jobs N`` on this
machine, or one submitit job per stage on a SLURM cluster).

A worker rebuilds the study's pipeline from a picklable *factory* (``StudyFactory``: the study's name
and settings), pins the process settings that change float results (:func:`configure_process`: torch
threads, denormal flushing) and runs a stage with :meth:`Pipeline.run_stage`, which writes the
stage's markers in the study directory exactly as a serial run does. The study directory on the shared
filesystem is the only state: a worker needs nothing from the process that launched it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .pipeline import Pipeline

# Outcomes of Pipeline.run_stage after which a job exits 0 (the stages that need it may start).
FINISHED_OK = ("done", "cached", "skipped")


@dataclass(frozen=True)
class StageJob:
    """What a worker needs to run one stage (pickled to the worker process).

    ``factory(out_dir, log)`` returns the study's :class:`Pipeline`; ``threads`` is the torch thread
    count of the stage (it enters the stage's fingerprint); ``trainer_threads`` is ``--threads`` when
    given (the trainer's ``train.threads``, else the preset's own); ``force`` reruns a finished stage."""

    factory: Callable[..., Pipeline]
    out_dir: str
    stage: str
    threads: int
    trainer_threads: Optional[int] = None
    force: bool = False
    launcher: str = "local"


def configure_process(threads: int) -> None:
    """Pin what changes a stage's float results in this process: torch's intra-op thread count and
    flushing denormals (what the command line sets at start-up, which a stage run in-process inherits).
    Also switches matplotlib to its file backend. Called before every stage, in-process or not, so a
    stage does not inherit a thread count an earlier stage (a trainer preset) set."""
    import torch

    os.environ.setdefault("MPLBACKEND", "Agg")
    torch.set_num_threads(int(threads))
    torch.set_flush_denormal(True)


def _print(msg: str) -> None:
    print(msg, flush=True)


def run_stage_job(job: StageJob, job_id: str, log: str) -> str:
    """Run ``job``'s stage in this process; returns :meth:`Pipeline.run_stage`'s outcome."""
    configure_process(job.threads)
    pkg = logging.getLogger("rpc_attention")
    if not pkg.handlers:  # the library logs to the job's log file (stderr), as the command line does
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        pkg.addHandler(handler)
        pkg.setLevel(logging.INFO)
    pipe = job.factory(Path(job.out_dir), log=_print)
    pipe.threads = job.trainer_threads  # type: ignore[attr-defined]  (train stages pass it to the trainer)
    pipe.runtime = {"threads": int(job.threads)}
    pipe.prepare = lambda: configure_process(job.threads)
    pipe.job = {"launcher": job.launcher, "job_id": str(job_id), "log": str(log)}
    _print(f"$ {job.launcher} job {job_id}: stage {job.stage} in {job.out_dir} ({job.threads} threads, "
           f"pid {os.getpid()})")
    return pipe.run_stage(job.stage, force=job.force)


def _append_output_to(log: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to the end of ``log``."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def pool_worker_main(conn) -> None:
    """A ``--jobs N`` worker process: runs the stages it receives on ``conn`` (``(job, job_id, log)``),
    one at a time, each with its output appended to its log, and answers each with the outcome of
    :meth:`Pipeline.run_stage`; stops on ``None``. Every stage starts with the process settings pinned
    again (:func:`configure_process`), as in a serial run."""
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the launcher is gone
            return
        if message is None:
            return
        job, job_id, log = message
        _append_output_to(log)
        try:
            outcome = run_stage_job(job, job_id, log)
        except Exception:  # the pipeline could not even be built: the log has why
            traceback.print_exc()
            outcome = "failed"
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(outcome)
