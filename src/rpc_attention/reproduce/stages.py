"""Stage functions of a study: train, eval, analyze, compare, report.

Each calls the owning package's library function (the same one its command calls): the trainer's
``run_training``, ``evaluate.runner.evaluate_model``, ``kpca.options.analyze_run``,
``report.compare.compare_runs`` and ``report.build_report``; none re-implements training, evaluation or
analysis, and none goes through the command line. What a stage prints or logs goes to ``logs/<stage>.log``. Presets,
suites and callbacks are this package's own: an unknown name is an error of the owning registry
(with its "did you mean"), not a skipped stage.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Iterator, Optional

from .pipeline import StageContext, read_json

logger = logging.getLogger(__name__)

__all__ = ["train_stage", "eval_stage", "analyze_stage", "compare_stage", "report_stage", "run_dir_of",
           "output_to_log"]


def run_dir_of(out_dir: Path, run: str) -> Path:
    return Path(out_dir) / "runs" / run


@contextlib.contextmanager
def output_to_log(log_path: Optional[Path], title: str) -> Iterator[None]:
    """Send what is printed or logged inside the block to ``log_path`` (appended, after a ``$ title``
    line), or leave it on the console when ``log_path`` is None. Log records reach the file because the
    command line's handler writes to whatever ``sys.stderr`` is when a record is emitted."""
    if log_path is None:
        yield
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {title}\n")
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield


def _log_path(ctx: StageContext) -> Path:
    return ctx.out_dir / "logs" / f"{ctx.stage.name}.log"


# ------------------------------------------------------------------------------------------- train
def train_stage(ctx: StageContext) -> dict:
    """params: run, preset, overrides (list of "a.b=v"), seed, task (vision/lm/seg), label."""
    from .. import train
    from ..kpca import register_callbacks
    from ..train.config import resolve_config
    from ..train.rundir import RunDir

    register_callbacks()
    p = ctx.params
    overrides = list(p.get("overrides", [])) + [f"train.seed={int(p['seed'])}"]
    cfg = resolve_config(p["preset"], overrides)
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    # A stage whose parameters changed (or --force) trains from scratch; an interrupted one resumes
    # from the trainer's last checkpoint.
    ctx.log(f"preset {p['preset']} {' '.join(overrides)} -> {run_dir}"
            + (" (resuming from the last checkpoint)" if RunDir(run_dir).is_run() and not ctx.fresh else ""))
    callbacks = list(p.get("callbacks") or [])
    if callbacks:
        cfg["train"]["callbacks"] = list(cfg["train"].get("callbacks") or []) + callbacks
    # --threads applies at run time; it is not a parameter of the stage (changing it retrains nothing)
    threads = getattr(ctx.pipeline, "threads", None)
    runtime = [f"train.threads={int(threads)}"] if threads else []
    has_run = RunDir(run_dir).is_run()
    if ctx.fresh or not has_run:
        # fresh: parameters changed or --force -> start over; no run yet -> plain start
        train.run_training(cfg, str(run_dir), resume=False, force=bool(ctx.fresh or run_dir.exists()),
                           overrides=runtime)
    else:
        # an earlier attempt was interrupted (or finished without its marker): continue from the
        # trainer's newest checkpoint, with the config saved in the run
        train.run_training(None, str(run_dir), resume=True, overrides=runtime)
    weights = RunDir(run_dir).weights()
    if not weights.is_file():
        raise RuntimeError(f"training finished but {weights} is missing")
    final = {}  # each numeric key's last logged value
    for rec in RunDir(run_dir).read_metrics(missing_ok=True):
        final.update({k: v for k, v in rec.items() if isinstance(v, (int, float))})
    return {"outputs": {"run_dir": str(run_dir), "weights": str(weights)},
            "result": {"last_metrics": final}}


# -------------------------------------------------------------------------------------------- eval
def _suite_options(items, out_dir: Path) -> dict:
    """``["pgd.eps=1:6/255", "corruptions.baseline={out}/runs/x"]`` -> dict, ``{out}`` = the study folder."""
    from ..evaluate.suites import parse_sets

    return parse_sets([str(item).replace("{out}", str(out_dir)) for item in items])


def eval_stage(ctx: StageContext) -> dict:
    """params: run, suite, sets (list of "k=v"; ``{out}`` is the study folder), limit; for a model that is
    not trained, source_run (the trained run loaded) and model_kwargs (set on top of its model keywords):
    the results go to ``runs/<run>/eval`` all the same."""
    from ..evaluate import suites as S
    from ..evaluate.runner import evaluate_model
    from ..train import run_loader
    from .studies import register_study_suites

    p = ctx.params
    register_study_suites()  # a stage runs in a process of its own: the suites above evaluate register here
    S.get_suite(p["suite"])  # an unknown suite fails here, before any work, with the registry's message
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    out = run_dir / "eval" / f"{p['suite']}.json"
    if ctx.fresh and out.exists():
        out.unlink()
    sets = _suite_options(p.get("sets", []), ctx.out_dir)
    limit = int(p["limit"]) if p.get("limit") else None
    source = run_dir_of(ctx.out_dir, p["source_run"]) if p.get("source_run") else run_dir
    keywords = "".join(f" --model-set {k}={v}" for k, v in (p.get("model_kwargs") or {}).items())
    ctx.log(f"--run {source}{keywords} --suite {p['suite']}" + (f" --limit {limit}" if limit else "")
            + "".join(f" --set {k}={v}" for k, v in sets.items()) + (f" --out {out.parent}" if keywords else ""))
    with output_to_log(_log_path(ctx), f"eval {p['suite']} on {run_dir}"):
        evaluate_model([p["suite"]], run_loader(source, model_kwargs=p.get("model_kwargs") or None), sets, limit,
                       str(run_dir / "eval"),
                       log=logger.info, on_result=lambda record, path: logger.info(S.render_markdown(record)),
                       replace=True)  # the pipeline's fingerprints decide when a result is stale
    rec = read_json(out)
    if rec is None:
        raise RuntimeError(f"the evaluation finished but {out} is missing or unreadable")
    shown = [(k, v) for k, v in (rec.get("metrics") or {}).items() if isinstance(v, (int, float))][:5]
    ctx.log(", ".join(f"{k}={v:.4g}" for k, v in shown) + f"  (full output: logs/{ctx.stage.name}.log)")
    return {"outputs": {"json": str(out)}, "result": {"metrics": rec.get("metrics", {})}}


# ----------------------------------------------------------------------------------------- analyze
def analyze_stage(ctx: StageContext) -> dict:
    """params: run, sets (analysis settings, e.g. ``["limit=8"]``), out (relative folder)."""
    from ..kpca.options import analyze_run, options_from_settings

    p = ctx.params
    options = options_from_settings(p.get("sets", []))
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    out = ctx.out_dir / p["out"]
    if ctx.fresh and out.exists():
        shutil.rmtree(out)
    ctx.log(" ".join(["--run", str(run_dir), "--out", str(out)] + list(p.get("sets", []))))
    with output_to_log(_log_path(ctx), f"analyze {run_dir} -> {out}"):
        analyze_run(run_dir, out, options)
    return {"outputs": {"dir": str(out)}, "result": {}}


def compare_stage(ctx: StageContext) -> dict:
    """params: runs (list), out, metrics (optional list), split (default ``val``)."""
    from ..report.compare import compare_runs

    p = ctx.params
    out = ctx.out_dir / p["out"]
    if ctx.fresh and out.exists():
        shutil.rmtree(out)
    runs = [str(run_dir_of(ctx.out_dir, r)) for r in p["runs"]]
    ctx.log(" ".join(runs) + f" --out {out}")
    with output_to_log(_log_path(ctx), f"compare {' '.join(runs)} -> {out}"):
        compare_runs(runs, out, metrics=p.get("metrics") or None, split=p.get("split") or "val")
    return {"outputs": {"dir": str(out)}, "result": {}}


# ------------------------------------------------------------------------------------------ report
def report_stage(ctx: StageContext) -> dict:
    from ..report import build_report

    study = ctx.pipeline.study  # set by rpc_attention.reproduce.run_study
    paths = build_report(ctx.out_dir, study, ctx.pipeline)
    return {"outputs": {k: str(v) for k, v in paths.items()}, "result": {}}
