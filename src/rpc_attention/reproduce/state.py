"""A study directory's state without its weights, to carry a long run from one machine (or session) to the next.

``save_state(out_dir, dest)`` copies what a resumed run needs and what the report reads (``study.json``, the
stage markers, every run's config, metrics and evaluation records, the logs) and leaves out model weights,
checkpoints and event files. A trained model whose evaluations are not all finished cannot be resumed without
its weights, so its training marker and run directory are left out too: the resumed run trains it again, and
its evaluations then all come from that one training. ``load_state(src, out_dir)`` puts a saved state back as a
study directory; ``reproduce`` on it resumes with the remaining stages.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List, Set

from .specs import StudyError

# what a run directory holds that a resumed study does not need (and that is large)
SKIPPED_IN_RUNS = ("model.safetensors", "checkpoints", "tb", "best", "ema.safetensors")
MARKERS = ("done", "failed", "skipped")


def _check_unlocked(out: Path) -> None:
    """StudyError while a ``reproduce`` holds the directory's lock (its stages are still being written)."""
    import fcntl

    lock = out / ".reproduce.lock"
    if not lock.exists():
        return
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StudyError(f"another rpc-attention reproduce is running on {out}: stop it first") from None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _stages(out: Path) -> List[Dict[str, Any]]:
    info = json.loads((out / "study.json").read_text(encoding="utf-8")) if (out / "study.json").is_file() else None
    if not info or not info.get("stages"):
        raise StudyError(f"{out} holds no study (no study.json with its stages)")
    return info["stages"]


def _unfinished_trainings(out: Path, stages: List[Dict[str, Any]]) -> Set[str]:
    """The finished training stages that a stage still to run (other than the report) depends on."""
    done = {s["name"] for s in stages if (out / "stages" / f"{s['name']}.done.json").is_file()}
    needed: Set[str] = set()
    for s in stages:
        if s["name"] in done or s.get("kind") == "report":
            continue
        needed |= {d for d in s.get("deps") or [] if d.startswith("train.") and d in done}
    return needed


def save_state(out_dir, dest) -> Dict[str, Any]:
    """Write the state of the study in ``out_dir`` to ``dest`` (replaced whole, written beside it first):
    ``{"stages": finished stages kept, "retrain": trainings left out, "bytes"}``. Refused while a run holds the
    directory (its lock file)."""
    out, dest = Path(out_dir), Path(dest)
    stages = _stages(out)
    _check_unlocked(out)
    retrain = _unfinished_trainings(out, stages)
    dropped_runs = {name.split(".", 1)[1] for name in retrain}
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "stages").mkdir(parents=True)
    shutil.copy2(out / "study.json", tmp / "study.json")
    if (out / "results.json").is_file():
        shutil.copy2(out / "results.json", tmp / "results.json")
    kept = 0
    for s in stages:
        if s["name"] in retrain:
            continue
        for kind in MARKERS:
            marker = out / "stages" / f"{s['name']}.{kind}.json"
            if marker.is_file():
                shutil.copy2(marker, tmp / "stages" / marker.name)
                kept += kind == "done"
    runs = out / "runs"
    for run in sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []:
        if run.name in dropped_runs or not (out / "stages" / f"train.{run.name}.done.json").is_file():
            continue
        shutil.copytree(run, tmp / "runs" / run.name, ignore=shutil.ignore_patterns(*SKIPPED_IN_RUNS))
    if (out / "logs").is_dir():
        shutil.copytree(out / "logs", tmp / "logs", ignore=shutil.ignore_patterns("submitit"))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    return {"stages": kept, "retrain": sorted(retrain), "bytes": size}


def load_state(src, out_dir) -> Dict[str, Any]:
    """Put the state saved in ``src`` back as the study directory ``out_dir``, which must not exist or be empty
    (a study there is never overwritten): ``{"stages": finished stages}``."""
    src, out = Path(src), Path(out_dir)
    _stages(src)
    if out.exists() and any(out.iterdir()):
        raise StudyError(f"{out} exists and is not empty: give an empty or new --out (nothing there is replaced)")
    shutil.copytree(src, out, dirs_exist_ok=True)
    return {"stages": len(list((out / "stages").glob("*.done.json")))}
