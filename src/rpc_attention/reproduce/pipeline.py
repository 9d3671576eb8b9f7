"""A small resumable pipeline of named stages.

A study is an ordered list of :class:`Stage` objects (topological order: every stage comes after the
stages it depends on). :class:`Pipeline` runs them in a study directory ``DIR``:

- a stage that finishes writes ``DIR/stages/<name>.done.json`` atomically (timing, outputs, a small
  result dict and a *fingerprint* of its parameters and of the stages it depends on); rerunning skips it
  as long as the fingerprint matches;
- a stage that raises :class:`StageSkipped` (a component is missing, data is not installed) writes
  ``<name>.skipped.json`` with the reason; it is tried again on the next run;
- a stage that fails writes ``<name>.failed.json`` (error and traceback); stages that need it are
  blocked, independent stages still run (``keep_going``), and the run exits non-zero;
- a stage that was interrupted (killed) leaves ``<name>.running.json``; the next run starts it again
  with ``ctx.resuming = True`` (training stages then resume from the trainer's last checkpoint).

:meth:`Pipeline.run` runs the stages one after another in this process; a launcher
(:mod:`rpc_attention.reproduce.launch`) runs each with :meth:`Pipeline.run_stage` in a worker process
or cluster job instead, with the same markers. ``Pipeline.runtime`` (the torch thread count) enters
every fingerprint.

Stage functions receive a :class:`StageContext` and return a dict ``{"outputs": {...}, "result": {...}}``
(both optional, JSON-able). Files they write should be written atomically (:func:`atomic_write_text`,
:func:`atomic_write_json`) so a kill never leaves a half-written output behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from ..files import atomic_write_bytes, atomic_write_json, atomic_write_text, json_default  # re-exported for stages
from ..markdown import format_seconds

logger = logging.getLogger(__name__)

__all__ = [
    "Stage", "StageContext", "StageSkipped", "Pipeline", "PlanEntry", "atomic_write_text",
    "atomic_write_json", "atomic_write_bytes", "select_stages", "format_seconds",
]

MARKER_SUFFIXES = ("done", "skipped", "failed", "running")


class StageSkipped(Exception):
    """Raised by a stage whose component or data is missing: recorded as skipped with this reason."""


class StageSelectionError(ValueError):
    """``--stages`` names nothing, or a selected stage needs a stage that has not finished."""


def read_json(path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def note_stopped(running_marker: Path, job_id: str) -> None:
    """Record in a stage's running marker when job ``job_id``, which runs it, was stopped (SIGTERM), so
    the attempt's seconds count when the stage is resumed or recorded as lost."""
    running = read_json(running_marker)
    if running and str((running.get("job") or {}).get("job_id")) == str(job_id) and not running.get("stopped"):
        atomic_write_json(running_marker, {**running, "stopped": time.time()})


# ---------------------------------------------------------------------------------------------- stages
@dataclass
class Stage:
    """One unit of work. ``deps`` must have finished successfully; ``after`` only orders (the report
    runs after everything, whatever happened to it). ``params`` (JSON-able) enter the fingerprint."""

    name: str
    kind: str
    fn: Callable[[StageContext], Optional[dict]]
    deps: Sequence[str] = ()
    after: Sequence[str] = ()
    params: Dict[str, Any] = field(default_factory=dict)
    estimate_s: float = 0.0
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\ *?[]"):
            raise ValueError(f"invalid stage name {self.name!r} (no slashes, spaces or glob characters)")


@dataclass
class StageContext:
    out_dir: Path
    stage: Stage
    pipeline: Pipeline
    resuming: bool = False   # an earlier run of this stage was interrupted
    fresh: bool = False      # parameters changed or --force: discard earlier outputs of this stage

    @property
    def params(self) -> Dict[str, Any]:
        return self.stage.params

    def log(self, msg: str) -> None:
        self.pipeline.log(f"  [{self.stage.name}] {msg}")


@dataclass
class PlanEntry:
    stage: Stage
    action: str          # "run", "resume", "rerun (changed)", "done", "retry (skipped before)", ...
    estimate_s: float

    @property
    def will_run(self) -> bool:
        return self.action != "done"


def select_stages(stages: Sequence[Stage], patterns: Optional[Iterable[str]]) -> List[Stage]:
    """Stages whose name matches any of the comma/space separated names or globs (all when None).

    A pattern also matches a stage whose *kind* equals it (``--stages train``) and every stage whose
    name starts with ``pattern + "."`` (``--stages eval`` selects ``eval.*``)."""
    if not patterns:
        return list(stages)
    pats: List[str] = []
    for p in patterns:
        pats.extend(x for x in str(p).replace(",", " ").split() if x)
    chosen, unmatched = [], []
    for p in pats:
        hit = [s for s in stages if fnmatch.fnmatchcase(s.name, p) or s.kind == p or s.name.startswith(p + ".")]
        if not hit:
            unmatched.append(p)
        chosen.extend(hit)
    if unmatched:
        raise StageSelectionError(
            f"--stages {', '.join(unmatched)} matches no stage; stages are: {', '.join(s.name for s in stages)}")
    names = {s.name for s in chosen}
    return [s for s in stages if s.name in names]


def _host_info() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0], **_machine()}


@functools.lru_cache(maxsize=1)
def _machine() -> dict:
    """What ran a stage, recorded in its marker: the CPU model, torch's CPU kernels, and the code: the git
    commit of the source tree the package was imported from and whether its tracked files differed from it
    (``commit`` None when the package is not in a git checkout, e.g. an installed wheel)."""
    import torch

    from ..report.collect import cpu_model

    info = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "commit": None,
            "commit_dirty": None}
    src = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=src,
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return info
    if head.returncode == 0 and head.stdout.strip():
        info["commit"] = head.stdout.strip()
        info["commit_dirty"] = dirty.returncode != 0 or bool(dirty.stdout.strip())
    return info


def _load() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover
        return None


class Pipeline:
    """Runs ``stages`` (in the given order) with markers under ``out_dir / "stages"``."""

    def __init__(self, stages: Sequence[Stage], out_dir, log: Optional[Callable[[str], None]] = None,
                 is_writer: bool = True) -> None:
        self.stages = list(stages)
        #: where the stages' ``estimate_s`` came from, as the dry-run plan names it
        self.estimate_source = "calibrated constants per stage kind"
        self.by_name = {s.name: s for s in self.stages}
        if len(self.by_name) != len(self.stages):
            raise ValueError("duplicate stage names")
        seen = set()
        for s in self.stages:
            for d in list(s.deps) + list(s.after):
                if d not in self.by_name:
                    raise ValueError(f"stage {s.name} depends on unknown stage {d}")
                if d not in seen:
                    raise ValueError(f"stage {s.name} is listed before its dependency {d}")
            seen.add(s.name)
        self.out_dir = Path(out_dir)
        self.marker_dir = self.out_dir / "stages"
        self._log = log or logger.info
        # Under torchrun every rank runs the stage function; only rank 0 writes markers.
        self.is_writer = is_writer
        # Settings of the process that change float results (set by the launcher: {"threads": 2}).
        self.runtime: Dict[str, Any] = {}
        # The job running the stages, when a launcher started this process ({"job_id", "log", "launcher"}).
        self.job: Dict[str, Any] = {}
        # Called before every stage (pins those settings again: an earlier stage may have changed them).
        self.prepare: Optional[Callable[[], None]] = None

    # -------------------------------------------------------------------------------------- markers
    def log(self, msg: str) -> None:
        self._log(msg)

    def marker_path(self, name: str, status: str) -> Path:
        return self.marker_dir / f"{name}.{status}.json"

    def marker(self, name: str, status: str = "done") -> Optional[dict]:
        return read_json(self.marker_path(name, status))

    def status(self, name: str) -> Optional[str]:
        """``done``, ``running`` (interrupted), ``failed``, ``skipped`` or None (never ran)."""
        for st in ("done", "running", "failed", "skipped"):
            if self.marker_path(name, st).exists():
                return st
        return None

    def _clear_markers(self, name: str, keep: Sequence[str] = ()) -> None:
        if not self.is_writer:
            return
        for st in MARKER_SUFFIXES:
            if st not in keep:
                with contextlib.suppress(FileNotFoundError):
                    self.marker_path(name, st).unlink()

    def fingerprint(self, stage: Stage, predicted: Optional[Dict[str, str]] = None, runtime: bool = True) -> str:
        """Hash of the stage's kind and params, of what its upstream stages produced and of
        :attr:`runtime` (what changes float results but is not a parameter: torch threads, denormal
        flushing), so a finished stage is rerun rather than mixed when those change."""
        up = []
        for d in list(stage.deps) + list(stage.after):
            if predicted is not None and d in predicted:
                up.append([d, predicted[d]])
                continue
            m = self.marker(d) or {}
            sk = self.marker(d, "skipped") or {}
            up.append([d, m.get("fingerprint"), m.get("finished"), sk.get("reason") if not m else None])
        blob = {"kind": stage.kind, "params": stage.params, "upstream": up}
        if runtime and self.runtime:
            blob["runtime"] = self.runtime
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=json_default).encode()).hexdigest()[:16]

    def is_current(self, stage: Stage) -> bool:
        """``stage`` is done with the fingerprint it would have now. A marker written before the runtime
        entered fingerprints (no ``runtime`` field) is compared without it."""
        m = self.marker(stage.name) or {}
        if self.status(stage.name) != "done":
            return False
        return m.get("fingerprint") == self.fingerprint(stage, runtime="runtime" in m)

    # ----------------------------------------------------------------------------------------- plan
    def plan(self, selection: Optional[Iterable[str]] = None, force: bool = False) -> List[PlanEntry]:
        chosen = select_stages(self.stages, selection)
        chosen_names = {s.name for s in chosen}
        will_run: set = set()
        entries = []
        for s in self.stages:
            if s.name not in chosen_names:
                continue
            st = self.status(s.name)
            upstream_runs = any(d in will_run for d in list(s.deps) + list(s.after))
            if force:
                action = "run (forced)"
            elif st == "done":
                if upstream_runs:
                    action = "rerun (upstream changes)"
                elif not self.is_current(s):
                    action = "rerun (changed)"
                else:
                    action = "done"
            elif st == "running":
                action = "resume (interrupted)"
            elif st == "failed":
                action = "retry (failed before)"
            elif st == "skipped":
                action = "retry (skipped before)"
            else:
                action = "run"
            if action != "done" and not action.startswith("retry (skipped"):
                will_run.add(s.name)
            entries.append(PlanEntry(s, action, 0.0 if action == "done" else float(s.estimate_s)))
        return entries

    def format_plan(self, entries: Sequence[PlanEntry]) -> str:
        w = max([len(e.stage.name) for e in entries] + [5])
        lines = [f"{'stage'.ljust(w)}  {'kind':8s}  {'estimate':>8s}  action", "-" * (w + 40)]
        for e in entries:
            lines.append(f"{e.stage.name.ljust(w)}  {e.stage.kind:8s}  {format_seconds(e.stage.estimate_s):>8s}  {e.action}")
        total = sum(e.estimate_s for e in entries)
        n = sum(e.will_run for e in entries)
        lines.append("-" * (w + 40))
        lines.append(f"{n} of {len(entries)} stages to run, estimated {format_seconds(total)} on this machine "
                     f"(estimates: {self.estimate_source}; see docs/reproduce.md)")
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------------ run
    def checked_plan(self, selection: Optional[Iterable[str]] = None, force: bool = False) -> List[PlanEntry]:
        """:meth:`plan`, refusing a selected stage that needs an unselected stage that has not finished
        (:class:`StageSelectionError`)."""
        entries = self.plan(selection, force=force)
        selected = {e.stage.name for e in entries}
        for e in entries:
            if not e.will_run:
                continue
            for d in e.stage.deps:
                if d not in selected and self.status(d) != "done":
                    raise StageSelectionError(
                        f"stage {e.stage.name} needs stage {d}, which has not finished: run it first "
                        f"(add it to --stages) or run the whole study")
        return entries

    def unmet(self, s: Stage, failed_here: Dict[str, str]) -> Optional[str]:
        """None when every dependency of ``s`` is done; else records ``s`` as skipped (a dependency was
        skipped) and returns ``"skipped"``, or returns ``"blocked"`` (recorded in ``failed_here``)."""
        bad = [d for d in s.deps if d in failed_here or self.status(d) != "done"]
        if not bad:
            return None
        d = bad[0]
        why = failed_here.get(d)
        if why is None and self.status(d) == "skipped":
            why = "skipped: " + str((self.marker(d, "skipped") or {}).get("reason", "?"))
        reason = f"needs {d}, which {why or 'did not finish'}"
        if why and why.startswith("skipped"):
            self._record_skip(s, reason)
            self.log(f"- {s.name}: skipped ({reason})")
            return "skipped"
        failed_here[s.name] = f"is blocked ({reason})"
        self.log(f"! {s.name}: blocked ({reason})")
        return "blocked"

    def run(self, selection: Optional[Iterable[str]] = None, force: bool = False, keep_going: bool = True) -> dict:
        """Run the selected stages. Returns ``{"ok": [...], "skipped": [...], "failed": [...], "blocked":
        [...], "cached": [...]}`` (stage names). Raises :class:`StageSelectionError` when a selected stage
        needs an unselected stage that has not finished."""
        entries = self.checked_plan(selection, force=force)
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        summary: Dict[str, List[str]] = {k: [] for k in ("ok", "cached", "skipped", "failed", "blocked")}
        failed_here: Dict[str, str] = {}
        reran: set = set()
        stop = False
        for e in entries:
            s = e.stage
            if stop:
                summary["blocked"].append(s.name)
                continue
            upstream_reran = any(d in reran for d in list(s.deps) + list(s.after))
            if not force and not upstream_reran and self.is_current(s):
                summary["cached"].append(s.name)
                self.log(f"= {s.name}: done earlier, skipped")
                continue
            unmet = self.unmet(s, failed_here)
            if unmet:
                summary[unmet].append(s.name)
                continue
            status, info = self._run_one(s, force=force)
            if status == "done":
                reran.add(s.name)
                summary["ok"].append(s.name)
            elif status == "skipped":
                summary["skipped"].append(s.name)
            else:
                summary["failed"].append(s.name)
                failed_here[s.name] = f"failed ({info})"
                if not keep_going:
                    stop = True
        return summary

    def run_stage(self, name: str, force: bool = False) -> str:
        """Run one stage in this process (a launcher's worker): ``"cached"`` when it is done and current
        (unless ``force``), ``"skipped"`` / ``"blocked"`` when a dependency is not done, else the
        outcome of running it (``"done"``, ``"skipped"``, ``"failed"``)."""
        s = self.by_name[name]
        if not force and self.is_current(s):
            self.log(f"= {s.name}: done earlier, skipped")
            return "cached"
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        return self.unmet(s, {}) or self._run_one(s, force=force)[0]

    def record_lost(self, name: str, why: str) -> None:
        """The process running stage ``name`` ended without a marker (killed, out of memory, node
        lost): record it as failed with ``why``; the next run retries it (training resumes from its
        checkpoint)."""
        s = self.by_name[name]
        running = self.marker(name, "running") or {}
        self._clear_markers(name)
        atomic_write_json(self.marker_path(name, "failed"), {
            "name": name, "kind": s.kind, "status": "failed", "error": why, "traceback": "",
            "started": running.get("started"), "attempts": running.get("attempts", 1),
            "seconds": (running.get("stopped") or time.time()) - running["started"] if running.get("started") else None,
            "earlier_s": running.get("earlier_s", 0.0),
            "fingerprint": running.get("fingerprint"), **{**running.get("job", {}), **self.job}})
        self.log(f"! {name}: FAILED: {why}")

    def owns(self, name: str) -> bool:
        """Whether this process may still write stage ``name``'s final marker. A process started by a
        launcher (:attr:`job` set) owns the stage while the running marker names its job and its
        launcher has not cancelled that job (``stages/<name>.job.json``); a cancelled job, or one whose
        stage another job has taken over, writes nothing, so a stage never has two writers."""
        job_id = str(self.job.get("job_id") or "")
        if not job_id:
            return True
        record = read_json(self.marker_dir / f"{name}.job.json") or {}
        if str(record.get("job_id")) == job_id and record.get("cancelled"):
            return False
        running = self.marker(name, "running") or {}
        return str((running.get("job") or {}).get("job_id")) == job_id

    def _disowned(self, s: Stage) -> bool:
        if self.is_writer and not self.owns(s.name):
            self.log(f"! {s.name}: not recorded: job {self.job.get('job_id')} was cancelled or another job runs "
                     "this stage now")
            return True
        return False

    def _record_skip(self, s: Stage, reason: str) -> None:
        if not self.is_writer:
            return
        self._clear_markers(s.name)
        atomic_write_json(self.marker_path(s.name, "skipped"), {
            "name": s.name, "kind": s.kind, "status": "skipped", "reason": reason,
            "fingerprint": self.fingerprint(s), "time": time.time(), "params": s.params, **self.job})

    def _earlier_attempt(self, s: Stage, prev: Optional[str], fp: str, force: bool) -> tuple:
        """``(resuming, earlier_s, attempts)``: an earlier attempt with these parameters that did not
        finish (interrupted, or failed: a lost job, an error) is continued (a training resumes from its
        checkpoint), and its seconds (with those it continued) count in this attempt's."""
        before = (self.marker(s.name, "running") if prev == "running" else
                  self.marker(s.name, "failed") if prev == "failed" else None) or {}
        resuming = prev == "running" or (prev == "failed" and not force and before.get("fingerprint") == fp)
        last_s = before.get("seconds") if prev == "failed" else (
            before["stopped"] - before["started"] if before.get("stopped") and before.get("started") else 0.0)
        earlier_s = float(before.get("earlier_s") or 0.0) + float(last_s or 0.0)
        return resuming, earlier_s if resuming else 0.0, int(before.get("attempts", 0))

    def _run_one(self, s: Stage, force: bool):
        prev = self.status(s.name)
        load_start = _load()
        cpu0 = time.process_time()
        old = self.marker(s.name) or {}
        fp = self.fingerprint(s)
        resuming, earlier_s, attempts = self._earlier_attempt(s, prev, fp, force)
        fresh = force or (prev == "done" and old.get("fingerprint") != fp)
        started = time.time()
        if self.is_writer:
            self._clear_markers(s.name, keep=("running",))
            atomic_write_json(self.marker_path(s.name, "running"), {
                "name": s.name, "kind": s.kind, "status": "running", "started": started,
                "attempts": attempts + 1, "fingerprint": fp,
                "runtime": self.runtime, "earlier_s": earlier_s, "job": self.job, **_host_info()})
        verb = "resuming" if resuming else ("rerunning" if prev else "running")
        self.log(f"> {s.name}: {verb} ({s.kind}, estimate {format_seconds(s.estimate_s)})")
        ctx = StageContext(self.out_dir, s, self, resuming=resuming, fresh=fresh)
        if self.prepare is not None:
            self.prepare()
        try:
            out = s.fn(ctx) or {}
        except StageSkipped as exc:
            if self._disowned(s):
                return "cancelled", None
            self._record_skip(s, str(exc))
            self.log(f"- {s.name}: skipped ({exc})")
            return "skipped", str(exc)
        except KeyboardInterrupt:
            raise  # leave the running marker: the next run resumes this stage
        except Exception as exc:  # recorded and reported; the study goes on
            tb = traceback.format_exc()
            if self._disowned(s):
                return "cancelled", None
            if self.is_writer:
                self._clear_markers(s.name)
                atomic_write_json(self.marker_path(s.name, "failed"), {
                    "name": s.name, "kind": s.kind, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": tb, "started": started, "seconds": time.time() - started, "earlier_s": earlier_s,
                    "attempts": attempts + 1, "fingerprint": fp,
                    **self.job})
            self.log(f"! {s.name}: FAILED after {format_seconds(time.time() - started)}: {type(exc).__name__}: {exc}")
            return "failed", f"{type(exc).__name__}: {exc}"
        finished = time.time()
        if self._disowned(s):
            return "cancelled", None
        if self.is_writer:
            atomic_write_json(self.marker_path(s.name, "done"), {
                "name": s.name, "kind": s.kind, "status": "done", "fingerprint": fp, "params": s.params,
                # seconds: every attempt of this stage that this one continued; attempt_s: this one alone
                "started": started, "finished": finished, "seconds": finished - started + earlier_s,
                "attempt_s": finished - started, "attempts": attempts + 1,
                "cpu_s": time.process_time() - cpu0,
                "estimate_s": s.estimate_s, "resumed": resuming, "load_start": load_start, "load_end": _load(),
                "runtime": self.runtime, **self.job,
                "outputs": out.get("outputs", {}),
                "result": out.get("result", {}), **_host_info()})
            self._clear_markers(s.name, keep=("done",))
        self.log(f"+ {s.name}: done in {format_seconds(finished - started)}")
        return "done", None

    # ------------------------------------------------------------------------------------ summaries
    def stage_table(self) -> List[dict]:
        """One row per stage: name, kind, status, seconds, estimate, reason/error."""
        rows = []
        for s in self.stages:
            st = self.status(s.name)
            m = self.marker(s.name, st) if st else None
            m = m or {}
            reason = m.get("reason") or m.get("error")
            log = self.log_of(s.name, m)
            if st == "failed" and log:
                reason = f"{reason} (log: {log})"
            rows.append({"name": s.name, "kind": s.kind, "status": st or "not run",
                         "seconds": m.get("seconds"), "cpu_s": m.get("cpu_s"), "estimate_s": s.estimate_s,
                         "resumed": m.get("resumed", False), "load": [m.get("load_start"), m.get("load_end")],
                         "reason": reason, "description": s.description,
                         **{k: m.get(k) for k in ("started", "finished", "commit", "commit_dirty", "cpu")
                            if m.get(k) is not None}})
        return rows

    def log_of(self, name: str, marker: Optional[dict] = None) -> Optional[str]:
        """The log of stage ``name``'s last job (its launcher's), else ``logs/<name>.log`` when it
        exists, relative to the study directory; None when neither exists."""
        log = (marker or {}).get("log") or (marker or {}).get("job", {}).get("log")
        if not log and (self.out_dir / "logs" / f"{name}.log").is_file():
            log = str(self.out_dir / "logs" / f"{name}.log")
        if log and Path(log).is_relative_to(self.out_dir):
            return Path(log).relative_to(self.out_dir).as_posix()
        return log

    def is_locked(self) -> bool:
        """Whether a ``reproduce`` run holds this study directory's lock now."""
        import fcntl

        path = self.out_dir / ".reproduce.lock"
        if not path.exists():
            return False
        with open(path, "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False

    @contextlib.contextmanager
    def lock(self):
        """Exclusive lock on the study directory (two reproduce runs on one DIR would race)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not self.is_writer:
            yield
            return
        import fcntl

        path = self.out_dir / ".reproduce.lock"
        f = open(path, "a+")
        try:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise StageSelectionError(f"another rpc-attention reproduce is running on {self.out_dir}") from None
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()
