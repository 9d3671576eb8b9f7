"""Stage functions of a study: train, eval, analyze, compare, report.

Each calls the owning component's public API (or its CLI ``main([...])`` in process); none
re-implements training, evaluation or analysis. A component that is not installed (module or preset
missing, data not found) makes the stage raise :class:`StageSkipped` with the reason, which the report
shows as skipped.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

from .pipeline import StageContext, StageSkipped, read_json

__all__ = ["train_stage", "eval_stage", "analyze_stage", "compare_stage", "report_stage", "run_cli",
           "require_module", "run_dir_of"]


def require_module(name: str, what: str) -> None:
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise StageSkipped(f"{what} is not installed (module {name} missing)")


def run_dir_of(out_dir: Path, run: str) -> Path:
    return Path(out_dir) / "runs" / run


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            with contextlib.suppress(Exception):
                st.flush()


def run_cli(argv: Sequence[str], log_path: Optional[Path] = None) -> str:
    """Run ``rpc-attention ARGV`` in this process; returns its stderr; raises on a non-zero exit.

    Its stdout and stderr go to ``log_path`` (appended) when given, else to the console. A
    sub-command that is not installed raises :class:`StageSkipped`."""
    from ..cli import _commands, main

    name = argv[0]
    if name not in {n for n, _ in _commands()}:
        raise StageSkipped(f"the `rpc-attention {name}` command is not installed")
    err = io.StringIO()
    log = None
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")
        log.write("$ rpc-attention " + " ".join(argv) + "\n")
    try:
        out_stream = log if log is not None else sys.stdout
        err_stream = _Tee(log, err) if log is not None else _Tee(sys.stderr, err)
        with contextlib.redirect_stdout(out_stream), contextlib.redirect_stderr(err_stream):
            try:
                rc = main(list(argv))
            except SystemExit as exc:  # argparse errors
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        if log is not None:
            log.close()
    if rc:
        last = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        where = f" (log: {log_path})" if log_path else ""
        raise RuntimeError(f"rpc-attention {' '.join(argv)} exited {rc}: {last[-1] if last else ''}{where}")
    return err.getvalue()


def _log_path(ctx: StageContext) -> Path:
    return ctx.out_dir / "logs" / f"{ctx.stage.name}.log"


# ------------------------------------------------------------------------------------------- train
def train_stage(ctx: StageContext) -> dict:
    """params: run, preset, overrides (list of "a.b=v"), seed, task (vision/lm/seg), label."""
    p = ctx.params
    require_module("rpc_attention.train", "the trainer (rpc_attention.train)")
    train = importlib.import_module("rpc_attention.train")
    if not hasattr(train, "run_training"):
        raise StageSkipped("rpc_attention.train.run_training is not available yet")
    from ..train.config import list_presets, resolve_config

    if p["preset"] not in {n for n, _ in list_presets()}:
        raise StageSkipped(f"trainer preset {p['preset']!r} is not installed")
    overrides = list(p.get("overrides", [])) + [f"train.seed={int(p['seed'])}"]
    cfg = resolve_config(p["preset"], overrides)
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    # A stage whose parameters changed (or --force) trains from scratch; an interrupted one resumes
    # from the trainer's last checkpoint.
    ctx.log(f"preset {p['preset']} {' '.join(overrides)} -> {run_dir}"
            + (" (resuming from the last checkpoint)" if (run_dir / "config.yaml").is_file() and not ctx.fresh else ""))
    callbacks = list(p.get("callbacks") or [])
    if callbacks:
        from ..train.callbacks import list_callbacks

        have = set(list_callbacks())
        missing = [c for c in callbacks if c not in have]
        if missing:
            ctx.log(f"callbacks {missing} are not installed; training without them")
        cfg["train"]["callbacks"] = list(cfg["train"].get("callbacks") or []) + [c for c in callbacks if c in have]
    # --threads applies at run time; it is not a parameter of the stage (changing it retrains nothing)
    threads = getattr(ctx.pipeline, "threads", None)
    runtime = [f"train.threads={int(threads)}"] if threads else []
    has_run = (run_dir / "config.yaml").is_file()
    if ctx.fresh or not has_run:
        # fresh: parameters changed or --force -> start over; no run yet -> plain start
        train.run_training(cfg, str(run_dir), resume=False, force=bool(ctx.fresh or run_dir.exists()),
                           overrides=runtime)
    else:
        # an earlier attempt was interrupted (or finished without its marker): continue from the
        # trainer's newest checkpoint, with the config saved in the run
        train.run_training(None, str(run_dir), resume=True, overrides=runtime)
    weights = run_dir / "model.safetensors"
    if not weights.is_file():
        raise RuntimeError(f"training finished but {weights} is missing")
    final = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    final.update({k: v for k, v in rec.items() if isinstance(v, (int, float))})
    return {"outputs": {"run_dir": str(run_dir), "weights": str(weights)},
            "result": {"last_metrics": final}}


# -------------------------------------------------------------------------------------------- eval
def eval_stage(ctx: StageContext) -> dict:
    """params: run, suite, sets (list of "k=v"), limit, device."""
    p = ctx.params
    require_module("rpc_attention.evaluate", "the evaluation suites (rpc_attention.evaluate)")
    from ..evaluate import suites as S

    try:
        S.get_suite(p["suite"])
    except ValueError:
        raise StageSkipped(f"evaluation suite {p['suite']!r} is not installed") from None
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    out = run_dir / "eval" / f"{p['suite']}.json"
    if ctx.fresh and out.exists():
        out.unlink()
    argv = ["eval", "--run", str(run_dir), "--suite", p["suite"]]
    if p.get("limit"):
        argv += ["--limit", str(int(p["limit"]))]
    for kv in p.get("sets", []):
        argv += ["--set", kv.replace("{out}", str(ctx.out_dir))]
    ctx.log(" ".join(argv[1:]))
    run_cli(argv, _log_path(ctx))
    rec = read_json(out)
    if rec is None:
        raise RuntimeError(f"rpc-attention eval finished but {out} is missing or unreadable")
    shown = [(k, v) for k, v in (rec.get("metrics") or {}).items() if isinstance(v, (int, float))][:5]
    ctx.log(", ".join(f"{k}={v:.4g}" for k, v in shown) + f"  (full output: logs/{ctx.stage.name}.log)")
    return {"outputs": {"json": str(out)}, "result": {"metrics": rec.get("metrics", {})}}


# ----------------------------------------------------------------------------------------- analyze
def analyze_stage(ctx: StageContext) -> dict:
    """params: run, args (extra CLI args), out (relative output folder)."""
    p = ctx.params
    require_module("rpc_attention.kpca", "the KPCA analysis (rpc_attention.kpca)")
    run_dir = run_dir_of(ctx.out_dir, p["run"])
    out = ctx.out_dir / p["out"]
    if ctx.fresh and out.exists():
        shutil.rmtree(out)
    argv = ["analyze", "--run", str(run_dir), "--out", str(out)] + list(p.get("args", []))
    ctx.log(" ".join(argv[1:]))
    run_cli(argv, _log_path(ctx))
    return {"outputs": {"dir": str(out)}, "result": {}}


def compare_stage(ctx: StageContext) -> dict:
    """params: runs (list), args, out."""
    p = ctx.params
    require_module("rpc_attention.kpca", "the KPCA analysis (rpc_attention.kpca)")
    out = ctx.out_dir / p["out"]
    if ctx.fresh and out.exists():
        shutil.rmtree(out)
    argv = ["compare"] + [str(run_dir_of(ctx.out_dir, r)) for r in p["runs"]] + ["--out", str(out)] \
        + list(p.get("args", []))
    ctx.log(" ".join(argv[1:]))
    run_cli(argv, _log_path(ctx))
    return {"outputs": {"dir": str(out)}, "result": {}}


# ------------------------------------------------------------------------------------------ report
def report_stage(ctx: StageContext) -> dict:
    from ..report import build_report

    study = ctx.pipeline.study  # set by rpc_attention.reproduce.run_study
    paths = build_report(ctx.out_dir, study, ctx.pipeline)
    return {"outputs": {k: str(v) for k, v in paths.items()}, "result": {}}
