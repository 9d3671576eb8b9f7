"""Reproduction studies as resumable pipelines (``rpc-attention reproduce``).

>>> from rpc_attention.reproduce import run_study
>>> run_study("smoke", "runs/smoke")            # train, evaluate, analyse, report; resumable

Layout of a study directory::

    DIR/study.json                 the study: preset, settings, stages (rewritten on every run)
    DIR/stages/<stage>.done.json   one per finished stage: timing, outputs, fingerprint
    DIR/runs/<model>-s<seed>/      trainer run directories (config, weights, checkpoints, eval/*.json)
    DIR/analysis/<run>/            KPCA analysis outputs
    DIR/report.md, report.html, results.json, figures/*.png

A directory holds one study with one set of settings: running another study (or the same study with
other settings) in it is refused with a :class:`StudyError`, since its stages would retrain runs
and replace the report in place. ``force=True`` accepts it: another study's outputs are removed
first (the directory restarts cleanly), and the selected stages rerun.
"""

from __future__ import annotations

from ..extras import require

require('rpc_attention.reproduce', 'all')  # one line naming the missing extra, before any import that needs it

import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..files import json_default
from .launch import (
    LAUNCHERS,
    LaunchOptions,
    SlurmOptions,
    interrupted_by_signals,
    launch_stages,
    resolve_threads,
    scheduler_queue,
    status_rows,
)
from .pipeline import Pipeline, Stage, StageContext, StageSelectionError, StageSkipped, atomic_write_json, read_json
from .studies import STUDIES, Study, StudyError, build_stages, get_study
from .worker import configure_process

__all__ = ["run_study", "make_pipeline", "Pipeline", "Stage", "StageContext", "StageSkipped", "Study",
           "StudyError", "StageSelectionError", "STUDIES", "get_study", "build_stages", "LaunchOptions",
           "SlurmOptions", "LAUNCHERS", "StudyFactory", "study_status"]


def _rank() -> int:
    for k in ("RANK", "SLURM_PROCID"):
        if os.environ.get(k, "").isdigit():
            return int(os.environ[k])
    return 0


def make_pipeline(study: Study, out_dir, device: Optional[str] = None, stages: Optional[List[Stage]] = None,
                  log: Optional[Callable[[str], None]] = None) -> Pipeline:
    stages = stages if stages is not None else build_stages(study, device=device)
    pipe = Pipeline(stages, out_dir, log=log, is_writer=_rank() == 0)
    pipe.study = study  # type: ignore[attr-defined]  (the report stage reads it)
    if study.cost_model is not None:
        pipe.estimate_source = "the plan's cost model, measured on its pilot"
    return pipe


@dataclass(frozen=True)
class StudyFactory:
    """Rebuilds a study's pipeline in a worker process from what pickles cheaply: the study's name,
    its ``--set`` settings and the device."""

    study: str
    settings: Tuple[str, ...] = ()
    device: Optional[str] = None

    def __call__(self, out_dir, log: Optional[Callable[[str], None]] = None) -> Pipeline:
        return make_pipeline(get_study(self.study, list(self.settings)), out_dir, device=self.device, log=log)


def study_status(out_dir) -> List[dict]:
    """``reproduce --status DIR``: one row per stage of the study in ``out_dir`` (its ``study.json``),
    with status, job id and log (:func:`rpc_attention.reproduce.launch.status_rows`)."""
    info = read_json(Path(out_dir) / "study.json")
    if not info or not info.get("stages"):
        raise StudyError(f"{out_dir} holds no study (no study.json with stages): give the --out of a study")
    stages = [Stage(s["name"], s.get("kind", "?"), fn=lambda ctx: None) for s in info["stages"]]
    pipe = Pipeline(stages, out_dir, log=lambda msg: None)
    return status_rows(pipe, queue=scheduler_queue(pipe))


def _write_study_file(pipe: Pipeline, study: Study) -> None:
    if not pipe.is_writer:
        return
    atomic_write_json(pipe.out_dir / "study.json", {
        "study": study.name, "description": study.description, "settings": study.settings,
        "device": study.device, "updated": time.time(),
        "models": [m.__dict__ for m in study.models],
        "stages": [{"name": s.name, "kind": s.kind, "deps": list(s.deps), "params": s.params,
                    "estimate_s": s.estimate_s} for s in pipe.stages]})


# What a study writes in its directory (the layout above); --force on another study removes these.
STUDY_OUTPUTS = ("study.json", "stages", "runs", "analysis", "logs", "figures", "report.md", "report.html",
                 "results.json")


def _plain(value):
    return json.loads(json.dumps(value, default=json_default))


def _defaults(name: str) -> Dict[str, Any]:
    from .specs import settings_dict
    from .studies import STUDIES

    d = STUDIES.get(name)
    return settings_dict(d.defaults) if d is not None else {}


def directory_conflict(study: Study, out_dir) -> Optional[str]:
    """Why ``out_dir`` cannot take ``study`` without --force (it holds another study, or other settings); else None."""
    old = read_json(Path(out_dir) / "study.json")
    if not old:
        return None
    if old.get("study") != study.name:
        return (f"{out_dir} holds the study {old.get('study')!r}; running {study.name!r} there would retrain its "
                f"runs and replace its report: choose another --out, or add --force to remove that study from "
                f"{out_dir} and start {study.name!r} there from scratch")
    before, now = _plain(old.get("settings") or {}), _plain(study.settings)
    defaults = _plain(_defaults(study.name))
    # a setting the directory's study predates counts as its default (a study written before it existed ran so)
    changed = [k for k in sorted(set(before) | set(now))
               if before.get(k, defaults.get(k)) != now.get(k, defaults.get(k))]
    if before.get("plan_sha256") and before.get("plan_sha256") != now.get("plan_sha256"):
        return None  # plan_conflict refuses it, whatever --force says
    if not changed:
        return None
    diff = "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    return (f"{out_dir} holds the study {study.name!r} with other settings ({diff}{more}); running it with these "
            f"would replace finished results: give the settings in {Path(out_dir) / 'study.json'}, another --out, "
            f"or add --force to rerun the selected stages with the new settings")


def plan_conflict(study: Study, out_dir) -> Optional[str]:
    """Why ``out_dir`` cannot run ``study``'s plan: its run started from a plan with other bytes. A plan edited
    after its run started is a new plan (its own hash), so it runs in a new ``--out``; --force does not
    override this, since the finished stages would mix two plans. None when the plans agree."""
    old = (read_json(Path(out_dir) / "study.json") or {}).get("settings") or {}
    before, now = old.get("plan_sha256"), (study.settings or {}).get("plan_sha256")
    if not before or before == now:
        return None
    return (f"{out_dir} holds a run of the plan with sha256 {before[:12]}; {study.settings.get('plan')} now has sha256 "
            f"{str(now)[:12]}: a plan edited after its run started is a new plan, so it runs in a new --out "
            f"(restore the plan's committed bytes, e.g. `git checkout -- {study.settings.get('plan')}`, to resume "
            f"this run)")


def _remove_other_study(out_dir, log: Callable[[str], None]) -> None:
    """Delete the outputs of the study in ``out_dir`` (only the names a study writes)."""
    old = (read_json(Path(out_dir) / "study.json") or {}).get("study")
    for name in STUDY_OUTPUTS:
        path = Path(out_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    log(f"--force: removed the study {old!r} from {out_dir}")


def run_study(preset: str, out_dir, settings: Optional[Sequence[str]] = None, selection: Optional[Iterable[str]] = None,
              force: bool = False, dry_run: bool = False, keep_going: bool = True, device: Optional[str] = None,
              log: Optional[Callable[[str], None]] = None, threads: Optional[int] = None,
              launch: Optional[LaunchOptions] = None) -> dict:
    """Build study ``preset`` with ``settings`` (``["seeds=0,1"]``) and run it in ``out_dir``.

    ``launch`` chooses how the stages run (default: one at a time in this process; see
    :class:`LaunchOptions`). Every stage runs with the same torch thread count whatever the launcher
    (``threads``, else :func:`resolve_threads`'s default), and that count enters its fingerprint.
    Returns the pipeline summary (``ok``, ``cached``, ``skipped``, ``failed``, ``blocked`` stage lists,
    plus ``plan`` text for a dry run)."""
    launch = launch or LaunchOptions()
    study = get_study(preset, settings)
    launch = replace(launch, device=device or study.device)
    try:
        launch.check()
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    refused = plan_conflict(study, out_dir)
    if refused:
        raise StudyError(refused)
    conflict = directory_conflict(study, out_dir)
    if conflict and not force:
        raise StudyError(conflict)
    pipe = make_pipeline(study, out_dir, device=device, log=log)
    pipe.threads = threads  # type: ignore[attr-defined]  (train stages pass it to the trainer)
    stage_threads = resolve_threads(launch, threads)
    pipe.runtime = {"threads": stage_threads}
    _refuse_under_torchrun(pipe, selection, launch, dry_run)
    if dry_run:
        return {"plan": pipe.format_plan(pipe.plan(selection, force=force)), "device": device or study.device}
    with pipe.lock(), interrupted_by_signals():
        old = (read_json(Path(out_dir) / "study.json") or {}).get("study")
        if conflict and pipe.is_writer and old not in (None, study.name):
            _remove_other_study(out_dir, pipe.log)
        _write_study_file(pipe, study)
        if launch.serial:
            pipe.prepare = lambda: configure_process(stage_threads)
            return pipe.run(selection, force=force, keep_going=keep_going)
        factory = StudyFactory(preset, tuple(settings or ()), device)
        return launch_stages(pipe, factory, launch, selection, force, keep_going, threads)


def _refuse_under_torchrun(pipe: Pipeline, selection, launch: LaunchOptions, dry_run: bool) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or dry_run:
        return
    if not launch.serial:
        raise StudyError(f"under torchrun (WORLD_SIZE={world}) stages run in this process: drop --launcher / --jobs")
    from .pipeline import select_stages

    chosen = select_stages(pipe.stages, selection) if selection else pipe.stages
    other = [s.name for s in chosen if s.kind != "train"]
    if other:
        raise StudyError(f"under torchrun (WORLD_SIZE={world}) select training stages only (--stages 'train.*'); "
                         f"run {other[0]} and the other stages in one process afterwards")
