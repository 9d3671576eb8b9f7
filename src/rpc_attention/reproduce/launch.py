"""Launchers: a study's stages as a graph run by separate processes or cluster jobs.

- ``local`` with ``jobs=1`` (the default) is the serial, in-process :meth:`Pipeline.run`.
- ``local`` with ``jobs=N``: up to N stages at once on this machine, each in a fresh worker process
  (:func:`rpc_attention.reproduce.worker.local_worker_main`; a killed worker costs only its stage).
- ``slurm``: each stage one SLURM job through submitit, with the resources its kind declares
  (:mod:`rpc_attention.reproduce.slurm`); ``submitit-local`` is the same path through submitit's local
  executor (real processes on this machine, for testing and measuring that path).

The launching process holds the study directory's lock, submits a stage once the stages it needs
have finished (on SLURM: once they are submitted, with ``afterok`` dependencies), polls its jobs and
reads their outcome from the stage markers the workers write. It records each submission in
``stages/<stage>.job.json`` (launcher, job id, log), which ``reproduce --status`` reads. A job that
ends without a marker (killed, out of memory, node lost) is recorded as failed with its log; the next
run retries it, and a training stage resumes from its last checkpoint.

Stopped by Ctrl-C, SIGTERM or SIGHUP, the launcher marks its jobs' records cancelled, cancels them and
waits until they have left the queue, so no job of a stopped run writes in the directory afterwards.
Killed outright (SIGKILL), it leaves its SLURM jobs queued: the next run finds them through their
records and follows them (adopts them) instead of submitting their stages a second time.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Sequence

from .pipeline import Pipeline, PlanEntry, Stage, StageSelectionError, atomic_write_json, read_json
from .studies import StudyError
from .worker import FINISHED_OK, StageJob

LAUNCHERS = ("local", "slurm", "submitit-local")


@dataclass(frozen=True)
class SlurmOptions:
    """Options of the SLURM jobs (``reproduce --launcher slurm``). Training stages take ``nodes`` x
    ``gpus_per_node`` GPUs (one task per GPU, DDP); evaluation and analysis one GPU; compare and report
    none. ``gpus_per_node`` None is 8 on a GPU device and 0 with ``--device cpu`` (then no job asks
    for a GPU, and a training job is one task per node). ``time_min`` is every job's time limit
    (required: a job that reaches it is requeued and resumes, up to ``slurm.MAX_REQUEUES`` times)."""

    partition: Optional[str] = None
    time_min: Optional[int] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    nodes: int = 1
    gpus_per_node: Optional[int] = None
    cpus_per_task: int = 10


@dataclass(frozen=True)
class LaunchOptions:
    """How a study's stages run: ``launcher`` (:data:`LAUNCHERS`), at most ``jobs`` at once (0: no
    limit, the default on SLURM), ``slurm`` options (only with the ``slurm`` launcher). ``device`` is
    the study's device (``run_study`` fills it in): on ``cpu`` no SLURM job asks for a GPU."""

    launcher: str = "local"
    jobs: Optional[int] = None
    slurm: Optional[SlurmOptions] = None
    poll_s: float = 0.5
    given: Sequence[str] = field(default=())  # names of the SLURM options given on the command line
    device: Optional[str] = None

    @property
    def max_jobs(self) -> int:
        if self.jobs is not None:
            return int(self.jobs)
        return 0 if self.launcher == "slurm" else 1

    @property
    def serial(self) -> bool:
        """Today's behaviour: one stage at a time in this process."""
        return self.launcher == "local" and self.max_jobs == 1

    def check(self) -> None:
        """One clear message for a bad combination (a ValueError)."""
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"--launcher {self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        if self.jobs is not None and (self.jobs < 0 or (self.jobs == 0 and self.launcher == "local")):
            raise ValueError(f"--jobs {self.jobs}: give a number >= 1 (0, no limit, only with --launcher slurm "
                             "or submitit-local)")
        if self.given and self.launcher != "slurm":
            raise ValueError(f"{', '.join(self.given)} set(s) SLURM job options: add --launcher slurm "
                             f"(the {self.launcher} launcher submits no SLURM jobs)")
        s = self.slurm or SlurmOptions()
        for name in ("nodes", "cpus_per_task"):
            if getattr(s, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if s.gpus_per_node is not None:
            if s.gpus_per_node < 0:
                raise ValueError("--gpus-per-node must be >= 0 (0: no GPU, with --device cpu)")
            if self.on_cpu and s.gpus_per_node > 0:
                raise ValueError(f"--gpus-per-node {s.gpus_per_node} with --device cpu: the jobs would hold GPUs "
                                 "they do not use; drop --gpus-per-node (or give 0), or run on --device cuda")
            if not self.on_cpu and s.gpus_per_node == 0:
                raise ValueError(f"--gpus-per-node 0 with --device {self.device}: the jobs would have no GPU; "
                                 "give --device cpu for a CPU-only partition")
        if self.launcher == "slurm" and s.time_min is None:
            raise ValueError("--launcher slurm needs --time MINUTES: every job's time limit (submitit's default "
                             "is 5 minutes); a job that reaches it is requeued and resumes")
        from .slurm import SIGNAL_DELAY_S

        if s.time_min is not None and s.time_min * 60 <= SIGNAL_DELAY_S:
            raise ValueError(f"--time {s.time_min}: give at least {SIGNAL_DELAY_S // 60 + 1} minutes; SLURM warns a "
                             f"job {SIGNAL_DELAY_S} s before its limit so that it can be requeued, and a shorter job "
                             "would be warned before it starts working")

    @property
    def on_cpu(self) -> bool:
        """The stages run on the CPU (``--device cpu``; no device given counts as a GPU study)."""
        return bool(self.device) and str(self.device).split(":")[0] == "cpu"

    def resolved_slurm(self) -> SlurmOptions:
        """The SLURM options with ``gpus_per_node`` filled in from the device (0 on cpu, else 8)."""
        from dataclasses import replace

        s = self.slurm or SlurmOptions()
        if s.gpus_per_node is None:
            s = replace(s, gpus_per_node=0 if self.on_cpu else 8)
        return s


def resolve_threads(options: LaunchOptions, threads: Optional[int]) -> int:
    """Torch threads of every stage: ``--threads``, else the SLURM jobs' CPUs per task, else this
    process's torch default (what a serial run has always used). The same for every launcher, so a
    stage's numbers do not depend on how it was launched."""
    if threads:
        return int(threads)
    if options.launcher == "slurm":
        return options.resolved_slurm().cpus_per_task
    import torch

    return int(torch.get_num_threads())


# ------------------------------------------------------------------------------------------- jobs
class Job(Protocol):
    job_id: str
    log: str

    def poll(self) -> Optional[str]:
        """None while queued or running; else how it ended (``"exit 0"``, ``"killed by signal 9"``)."""

    def cancel(self) -> None:
        """Stop it (the stage's running marker stays: the next run resumes it)."""


class Executor(Protocol):
    name: str
    handles_dependencies: bool  # the cluster starts a job only after its dependencies (SLURM afterok)

    def submit(self, stage: Stage, job: StageJob, needs: Dict[str, Job], after: Dict[str, Job]) -> Job:
        """Start (or queue) ``job``; ``needs`` / ``after`` are the submitted jobs it must wait for."""

    def wait(self, timeout: float) -> None:
        """Return when one of its jobs may have ended, at the latest after ``timeout`` seconds."""

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Stop ``jobs`` (the run was interrupted)."""

    def close(self) -> List[str]:
        """Release what the executor holds (worker processes) once no job is left; after a cancel, wait
        for the cancelled jobs to stop. Returns the ids of jobs that are still running."""


class _Worker:
    """A ``--jobs N`` worker process and the end of its pipe."""

    def __init__(self, context) -> None:
        from .worker import pool_worker_main

        self.conn, child = context.Pipe()
        # not a daemon: a stage may start processes of its own (data loader workers)
        self.process = context.Process(target=pool_worker_main, args=(child,), name="rpc-attention stage worker")
        self.process.start()
        child.close()
        self.busy = False


class _WorkerJob:
    def __init__(self, worker: _Worker, job_id: str, log: str) -> None:
        self.worker, self.job_id, self.log = worker, job_id, log

    def poll(self) -> Optional[str]:
        w = self.worker
        try:
            if w.conn.poll():
                outcome = w.conn.recv()
                w.busy = False
                return f"exit {0 if outcome in FINISHED_OK else 1} ({outcome})"
        except (EOFError, OSError):
            pass  # the worker died: its exit code says how
        code = w.process.exitcode
        if code is None:
            return None
        w.busy = False
        return f"killed by signal {-code}" if code < 0 else f"exit {code}"

    def cancel(self) -> None:
        self.worker.process.terminate()
        self.worker.process.join(10)


class LocalProcesses:
    """``--jobs N`` on this machine: N worker processes (spawned, so nothing of this process leaks into
    them; started as needed, replaced when one dies), each running one stage at a time with its output
    appended to ``logs/<stage>.log``. A worker is reused for the next stage, which starts with the
    process settings pinned again, as in a serial run; it saves importing torch and the stage's
    libraries for every stage (seconds of CPU each)."""

    name = "local"
    handles_dependencies = False

    def __init__(self, out_dir: Path) -> None:
        import multiprocessing

        self.context = multiprocessing.get_context("spawn")
        self.out_dir = Path(out_dir)
        self.workers: List[_Worker] = []
        self.count = 0

    def submit(self, stage: Stage, job: StageJob, needs: Dict[str, Job], after: Dict[str, Job]) -> Job:
        self.workers = [w for w in self.workers if w.busy or w.process.is_alive()]
        worker = next((w for w in self.workers if not w.busy), None)
        if worker is None:
            worker = _Worker(self.context)
            self.workers.append(worker)
        worker.busy = True
        self.count += 1
        job_id = f"local-{worker.process.pid}-{self.count}"
        log = str(self.out_dir / "logs" / f"{stage.name}.log")
        worker.conn.send((job, job_id, log))
        return _WorkerJob(worker, job_id, log)

    def wait(self, timeout: float) -> None:
        """Until a busy worker answers or dies (no polling delay between short stages)."""
        from multiprocessing.connection import wait

        busy = [w for w in self.workers if w.busy]
        wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout)

    def cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            job.cancel()

    def close(self) -> List[str]:
        for w in self.workers:
            if w.process.is_alive():
                with contextlib.suppress(OSError):
                    w.conn.send(None)
        for w in self.workers:
            w.process.join(30)
            if w.process.is_alive():
                w.process.terminate()
        return []


def make_executor(options: LaunchOptions, out_dir: Path) -> Executor:
    if options.launcher == "local":
        return LocalProcesses(out_dir)
    if options.launcher == "slurm" and shutil.which("sbatch") is None:
        raise StudyError("--launcher slurm: sbatch is not on this machine's PATH; run the command on a SLURM "
                         "login node (--launcher submitit-local runs the same path on this machine)")
    from .slurm import SubmititExecutor

    return SubmititExecutor(out_dir, options.resolved_slurm(), cluster=options.launcher == "slurm")


# ------------------------------------------------------------------------------------------ graph
@dataclass
class _Run:
    """The state of one launched run."""

    pipe: Pipeline
    executor: Executor
    make_job: Callable[[Stage], StageJob]
    keep_going: bool
    pending: List[Stage]
    inflight: Dict[str, Job] = field(default_factory=dict)
    submitted: Dict[str, float] = field(default_factory=dict)
    failed_here: Dict[str, str] = field(default_factory=dict)
    summary: Dict[str, List[str]] = field(
        default_factory=lambda: {k: [] for k in ("ok", "cached", "skipped", "failed", "blocked")})
    stop: bool = False


def job_record_path(pipe: Pipeline, name: str) -> Path:
    return pipe.marker_dir / f"{name}.job.json"


def _submit_ready(run: _Run, max_jobs: int) -> None:
    pipe = run.pipe
    for s in list(run.pending):
        if max_jobs and len(run.inflight) >= max_jobs:
            return
        upstream = list(s.deps) + list(s.after)
        if any(d in {p.name for p in run.pending} for d in upstream):
            continue
        waiting = [d for d in upstream if d in run.inflight]
        if waiting and not run.executor.handles_dependencies:
            continue
        if any(d in run.inflight for d in s.after):
            # a stage that runs after others whatever their outcome (the report) reads their markers;
            # a job that ended without writing one is recorded as lost by this launcher only once it
            # has seen the job leave the queue, so such a stage waits for that here, not in SLURM
            continue
        finished_bad = [d for d in s.deps if d not in run.inflight
                        and (d in run.failed_here or pipe.status(d) != "done")]
        run.pending.remove(s)
        if finished_bad:
            run.summary[pipe.unmet(s, run.failed_here) or "blocked"].append(s.name)
            continue
        needs = {d: run.inflight[d] for d in s.deps if d in run.inflight}
        after = {d: run.inflight[d] for d in s.after if d in run.inflight}
        try:
            job = run.executor.submit(s, run.make_job(s), needs, after)
        except Exception as exc:  # sbatch refused it: stop (the finally of run_graph cancels what was submitted)
            from .slurm import SubmitError

            if not isinstance(exc, SubmitError):
                raise
            raise StudyError(f"submitting stage {s.name} failed: {exc}") from None
        run.inflight[s.name] = job
        run.submitted[s.name] = time.time()
        if pipe.is_writer:
            atomic_write_json(job_record_path(pipe, s.name), {
                "name": s.name, "launcher": run.executor.name, "job_id": job.job_id, "log": job.log,
                "submitted": run.submitted[s.name], "needs": sorted(needs), "after": sorted(after)})
        pipe.log(f"> {s.name}: submitted as {run.executor.name} job {job.job_id} (log: {job.log})")


def _outcome(pipe: Pipeline, name: str, job_id: str) -> Optional[str]:
    """The stage's marker that job ``job_id`` wrote (or a done marker that is current: the worker found
    nothing to do); None when it wrote none."""
    for st in ("done", "failed", "skipped"):
        marker = pipe.marker(name, st)
        if marker is not None and (str(marker.get("job_id")) == job_id
                                   or (st == "done" and pipe.is_current(pipe.by_name[name]))):
            return st
    return None


def _collect(run: _Run) -> None:
    pipe = run.pipe
    for name, job in list(run.inflight.items()):
        ended = job.poll()
        if ended is None:
            continue
        del run.inflight[name]
        st = _outcome(pipe, name, job.job_id)
        s = pipe.by_name[name]
        if st is None and any(d in run.failed_here for d in s.deps):
            run.failed_here[name] = "is blocked (a stage it needs failed)"
            run.summary["blocked"].append(name)
            pipe.log(f"! {name}: blocked (job {job.job_id} {ended}: a stage it needs failed)")
            continue
        if st is None:
            pipe.record_lost(name, f"the {run.executor.name} job {job.job_id} ended without finishing the "
                                   f"stage ({ended}); its log: {job.log}")
            st = "failed"
        if st == "failed":
            error = (pipe.marker(name, "failed") or {}).get("error", "")
            run.failed_here[name] = f"failed ({error})"
            run.stop = run.stop or not run.keep_going
            pipe.log(f"! {name}: failed in job {job.job_id} (log: {job.log})")
        else:
            pipe.log(f"{'+' if st == 'done' else '-'} {name}: {st} (job {job.job_id})")
        run.summary["ok" if st == "done" else st].append(name)


def mark_cancelled(pipe: Pipeline, name: str, job: Job) -> None:
    """Note in the stage's job record that the launcher cancels ``job``: the job, told by SIGTERM,
    stops its stage at once and writes no marker after that (:func:`slurm.is_cancelled`)."""
    path = job_record_path(pipe, name)
    record = read_json(path) or {}
    if pipe.is_writer and str(record.get("job_id")) == str(job.job_id):
        atomic_write_json(path, {**record, "cancelled": time.time()})


def run_graph(pipe: Pipeline, entries: Sequence[PlanEntry], executor: Executor,
              make_job: Callable[[Stage], StageJob], max_jobs: int, keep_going: bool = True,
              poll_s: float = 0.5, adopted: Optional[Dict[str, Job]] = None) -> Dict[str, List[str]]:
    """Run the stages of ``entries`` that need running through ``executor`` (at most ``max_jobs`` at
    once; 0: no limit), dependencies first. ``adopted``: jobs an earlier launcher submitted that are
    still queued or running, by stage; they are followed, not submitted again. Returns the summary of
    :meth:`Pipeline.run`. Interrupted (Ctrl-C, SIGTERM, SIGHUP), it cancels its jobs and waits for them
    to stop; their stages resume on the next run."""
    adopted = dict(adopted or {})
    run = _Run(pipe, executor, make_job, keep_going,
               pending=[e.stage for e in entries if e.will_run and e.stage.name not in adopted])
    run.summary["cached"] = [e.stage.name for e in entries if not e.will_run and e.stage.name not in adopted]
    run.inflight.update(adopted)
    for name, job in adopted.items():
        pipe.log(f"> {name}: following {executor.name} job {job.job_id}, submitted by an earlier run (log: {job.log})")
    pipe.marker_dir.mkdir(parents=True, exist_ok=True)
    try:
        while run.pending or run.inflight:
            if run.stop:
                run.summary["blocked"] += [s.name for s in run.pending]
                run.pending.clear()
            _submit_ready(run, max_jobs)
            if run.pending and not run.inflight:
                # nothing runs and nothing can start (cannot happen with stages in dependency order)
                raise StageSelectionError(f"cannot start {run.pending[0].name}: its dependencies did not run")
            executor.wait(poll_s)
            _collect(run)
    finally:
        for name, job in run.inflight.items():
            mark_cancelled(pipe, name, job)
        if run.inflight:
            pipe.log(f"cancelling {len(run.inflight)} {executor.name} job(s): {' '.join(j.job_id for j in run.inflight.values())}")
        executor.cancel(list(run.inflight.values()))
        left = executor.close()
        if left:
            pipe.log(f"! {len(left)} cancelled job(s) are still in the queue: check `squeue -j {','.join(left)}` "
                     "before running the study again")
    return run.summary


@contextlib.contextmanager
def interrupted_by_signals():
    """SIGTERM and SIGHUP (a closed terminal, ``kill``, a login node's session limit) stop the run as
    Ctrl-C does: a KeyboardInterrupt, so the launcher cancels its jobs and the CLI prints how to
    resume. Only in the main thread (signal handlers can be set nowhere else)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------------------- status
def _final_marker(pipe: Pipeline, name: str) -> tuple:
    for st in ("done", "failed", "skipped"):
        marker = pipe.marker(name, st)
        if marker is not None:
            return st, marker
    return None, {}


SCHEDULER_STATES = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
                    "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
                    "SUSPENDED": "suspended", "STOPPED": "suspended", "RESIZING": "running", "SIGNALING": "running"}


def recorded_jobs(pipe: Pipeline, launcher: str = "slurm") -> Dict[str, dict]:
    """The job records (``stages/<stage>.job.json``) of ``launcher``'s jobs, by stage."""
    out = {}
    for s in pipe.stages:
        record = read_json(job_record_path(pipe, s.name)) or {}
        if record.get("launcher") == launcher and record.get("job_id"):
            out[s.name] = record
    return out


def status_rows(pipe: Pipeline, queue: Optional[Dict[str, tuple]] = None) -> List[dict]:
    """One row per stage of the study in ``pipe.out_dir``: name, kind, status (queued / running /
    done / failed / skipped / interrupted / not run), job id, log, seconds and reason. Reads the study
    directory, so it works while a launcher runs the study and after it finished; ``queue`` (SLURM's
    ``{job id: (state, reason)}``, from squeue) says what the scheduler does with each recorded job,
    which the markers only follow with a delay (a job starts before its stage writes its running
    marker; a requeued job waits in the queue with its running marker in place)."""
    active = pipe.is_locked()
    rows = []
    for s in pipe.stages:
        record = read_json(job_record_path(pipe, s.name)) or {}
        running = pipe.marker(s.name, "running")
        st, marker = _final_marker(pipe, s.name)
        in_queue = (queue or {}).get(str(record.get("job_id"))) if record else None
        reason = None
        if in_queue is not None:
            status = SCHEDULER_STATES.get(in_queue[0], in_queue[0].lower())
            marker = running or marker
            reason = f"SLURM: {in_queue[0]} ({in_queue[1]})" if in_queue[1] not in ("", "None") else f"SLURM: {in_queue[0]}"
            if not active:
                reason += "; no launcher follows it: rerun the command to adopt it"
        elif running is not None:
            status, marker = ("running" if active else "interrupted"), running
        elif record and active and str(marker.get("job_id")) != str(record.get("job_id")):
            status = "queued"
        else:
            status = st or "not run"
        job = record.get("job_id") or marker.get("job_id") or (marker.get("job") or {}).get("job_id")
        if status in ("failed", "skipped"):
            reason = marker.get("error") or marker.get("reason")
        rows.append({"name": s.name, "kind": s.kind, "status": status, "job_id": job,
                     "log": record.get("log") and pipe.log_of(s.name, record) or pipe.log_of(s.name, marker),
                     "seconds": marker.get("seconds") if status in ("done", "failed") else None,
                     "reason": reason})
    return rows


def scheduler_queue(pipe: Pipeline) -> Optional[Dict[str, tuple]]:
    """SLURM's view of the study's recorded SLURM jobs (squeue), {} when there are none, None when
    squeue does not answer."""
    records = recorded_jobs(pipe)
    if not records:
        return {}
    from .slurm import queue_states

    return queue_states([r["job_id"] for r in records.values()])


def live_jobs(pipe: Pipeline) -> Dict[str, dict]:
    """The study's SLURM jobs that are still queued or running (submitted by an earlier launcher that
    was killed), by stage; {} when there are none or squeue is not there to ask."""
    records = recorded_jobs(pipe)
    if not records or shutil.which("squeue") is None:
        return {}
    queue = scheduler_queue(pipe)
    if queue is None:
        raise StudyError("squeue does not answer: cannot tell whether this study's SLURM jobs "
                         f"({' '.join(r['job_id'] for r in records.values())}) are still queued; try again later")
    return {name: r for name, r in records.items() if str(r["job_id"]) in queue}


def _adopt_or_refuse(pipe: Pipeline, launch: LaunchOptions, executor: Executor, force: bool) -> Dict[str, Job]:
    """Jobs of this study still in SLURM's queue: followed by this run when it is a SLURM run without
    --force; otherwise the run is refused with the command that cancels them (their stages would be
    run twice, by two writers)."""
    live = live_jobs(pipe)
    if not live:
        return {}
    ids = " ".join(str(r["job_id"]) for r in live.values())
    if launch.launcher != "slurm" or force:
        why = "with --force" if force else f"with --launcher {launch.launcher}"
        raise StudyError(f"{len(live)} SLURM job(s) of this study are still queued or running ({', '.join(live)}), "
                         f"submitted by an earlier run that was stopped without cancelling them; running the study "
                         f"{why} would run their stages a second time. Cancel them first: scancel {ids}  (or rerun "
                         "the command with --launcher slurm and without --force, which follows them)")
    return {name: executor.adopt(str(r["job_id"]), str(r.get("log", ""))) for name, r in live.items()}


def launch_stages(pipe: Pipeline, factory: Callable[..., Pipeline], launch: LaunchOptions,
                  selection=None, force: bool = False, keep_going: bool = True,
                  trainer_threads: Optional[int] = None) -> Dict[str, List[str]]:
    """Run ``pipe``'s selected stages through ``launch``'s launcher; each worker rebuilds the pipeline
    with ``factory(out_dir, log)`` and runs its stage with ``pipe.runtime["threads"]`` torch threads.
    The caller holds the study directory's lock."""
    entries = pipe.checked_plan(selection, force=force)
    executor = make_executor(launch, pipe.out_dir)
    adopted = _adopt_or_refuse(pipe, launch, executor, force)
    if launch.launcher == "slurm":
        from .slurm import check_resources

        errors, warnings = check_resources([e.stage for e in entries if e.will_run], launch.resolved_slurm())
        if errors:
            raise StudyError("; ".join(errors))
        for w in warnings:
            pipe.log(f"warning: {w}")

    def make_job(stage: Stage) -> StageJob:
        return StageJob(factory, str(pipe.out_dir), stage.name, threads=int(pipe.runtime["threads"]),
                        trainer_threads=trainer_threads, force=force, launcher=launch.launcher)

    return run_graph(pipe, entries, executor, make_job, launch.max_jobs, keep_going=keep_going,
                     poll_s=launch.poll_s, adopted=adopted)
