"""A training run directory: its layout, the files in it, and every read and write of them.

The trainer writes, everything else reads, always through :class:`RunDir`::

    DIR/config.yaml            the resolved config the run trains with
    DIR/metrics.jsonl          one JSON object a line: {"step", "epoch", "split": train|val|test|jproj, ...};
                               the final evaluation's record has "final": true
    DIR/checkpoints/step_N/    resumable checkpoints (rpc_attention.train.checkpoint)
    DIR/model.safetensors      the final weights (model_ema.safetensors: the EMA weights, when enabled);
                               with train.keep_best the best validation epoch's, and the last step's
                               go to model_last.safetensors (model_best.safetensors: the best so far)
    DIR/final_metrics.json     step, split, elapsed_s and the final evaluation's metrics
    DIR/tb/                    TensorBoard scalars

``metrics.jsonl`` is appended to while the run trains; a process killed in the middle of a write
leaves a torn last line, which :meth:`RunDir.read_metrics` passes over (and a resume cuts away). Any
other line that is not a JSON object is corruption and an error naming the file and line.

:func:`load_run` / :func:`run_loader` rebuild a run's model from its config and weights.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..files import atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
WEIGHTS = "model.safetensors"
EMA_WEIGHTS = "model_ema.safetensors"
BEST_WEIGHTS = "model_best.safetensors"  # train.keep_best: the best validation epoch's weights so far
LAST_WEIGHTS = "model_last.safetensors"  # train.keep_best: the last step's weights (model.safetensors: the best)
FINAL_METRICS = "final_metrics.json"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tb"
RUN_FILES = (CONFIG, METRICS, WEIGHTS, EMA_WEIGHTS, BEST_WEIGHTS, LAST_WEIGHTS, FINAL_METRICS, CHECKPOINTS,
             TENSORBOARD)


class RunExistsError(FileExistsError):
    """``out_dir`` already holds a run and neither ``resume`` nor ``force`` was given."""


class RunDir:
    """The files of the training run in ``path`` (which need not exist yet)."""

    def __init__(self, path: os.PathLike) -> None:
        self.path = Path(path)
        self.config = self.path / CONFIG
        self.metrics = self.path / METRICS
        self.checkpoints = self.path / CHECKPOINTS
        self.final_metrics = self.path / FINAL_METRICS
        self.tensorboard = self.path / TENSORBOARD

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def weights(self, ema: bool = False) -> Path:
        """The final weights (``ema=True``: the EMA weights)."""
        return self.path / (EMA_WEIGHTS if ema else WEIGHTS)

    def best_weights(self, last: bool = False) -> Path:
        """``train.keep_best``'s files: the best weights so far (``last=True``: the last step's weights)."""
        return self.path / (LAST_WEIGHTS if last else BEST_WEIGHTS)

    def discard_failed_start(self) -> None:
        """Delete what a fresh run wrote before it failed, so that the same directory takes the next try;
        only while it holds no checkpoint and no final weights (nothing that cost training time)."""
        if any(self.checkpoints.glob("step_*")) or self.weights().exists():
            return
        self._remove_run_files()

    def _remove_run_files(self) -> None:
        """Delete the run's own files and folders (RUN_FILES); anything else in the directory stays."""
        for name in RUN_FILES:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()

    # ------------------------------------------------------------------------------------ state
    def is_run(self) -> bool:
        """True when the directory holds a run's config (a run that started, finished or not)."""
        return self.config.is_file()

    def holds_files(self) -> bool:
        """True when any of the files a run writes is there (a run, or the remains of one)."""
        return any((self.path / name).exists() for name in RUN_FILES)

    def require_run(self, doing: str = "read") -> None:
        """Raise ``FileNotFoundError`` naming the missing config unless this is a run."""
        if not self.is_run():
            raise FileNotFoundError(f"cannot {doing} {self.path}: it holds no training run (expected {self.config})")

    # ------------------------------------------------------------------------------------ reads
    def read_config(self) -> Dict[str, Any]:
        """The run's resolved config (``FileNotFoundError`` / ``ValueError`` with one-line messages)."""
        from .config import load_config_file

        self.require_run()
        return load_config_file(self.config)

    def read_metrics(self, split: Optional[str] = None, missing_ok: bool = False) -> List[Dict[str, Any]]:
        """The records of ``metrics.jsonl`` in file order (only ``split``'s when given).

        A torn last line (a process killed while writing it) is passed over; any other line that is
        not a JSON object raises ``ValueError`` naming the file and line. A missing file raises
        ``FileNotFoundError`` unless ``missing_ok`` (then: no records).
        """
        if not self.metrics.is_file():
            if missing_ok:
                return []
            raise FileNotFoundError(f"{self.path}: no {METRICS} (is it a training run directory?)")
        text = self.metrics.read_text()
        lines = text.split("\n")
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # no newline after it: the write was cut short
                    continue
                rec = None
            if not isinstance(rec, dict):
                raise ValueError(f"{self.metrics}:{number}: not a JSON object; the file is corrupt "
                                 f"(delete that line, or the file, and the records it held are gone)")
            if split is None or rec.get("split") == split:
                records.append(rec)
        return records

    def read_final_metrics(self) -> Dict[str, Any]:
        """``final_metrics.json`` (written when the run finished)."""
        if not self.final_metrics.is_file():
            raise FileNotFoundError(f"{self.path}: no {FINAL_METRICS} (the run has not finished)")
        try:
            return json.loads(self.final_metrics.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.final_metrics} is not valid JSON: {exc}") from None

    # ----------------------------------------------------------------------------------- writes
    def prepare(self, force: bool = False) -> None:
        """Make the directory ready for a fresh run: it must hold none (``force``: delete the old run's
        files first; other files stay). A resume needs no preparing, only :meth:`require_run`."""
        if self.path.exists() and self.holds_files():
            if not force:
                raise RunExistsError(f"{self.path} already holds a run; use --resume {self.path} to continue it "
                                     f"or --force to start over")
            self._remove_run_files()
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, text: str) -> None:
        atomic_write_text(self.config, text)

    def write_final_metrics(self, summary: Dict[str, Any]) -> None:
        atomic_write_text(self.final_metrics, json.dumps(summary, indent=1) + "\n")

    def truncate_metrics_after(self, step: int) -> None:
        """Drop the records logged after ``step`` and any torn last line (what a run killed after its
        last checkpoint left behind), so a resumed run does not log them twice."""
        if not self.metrics.is_file():
            return
        keep = [json.dumps(r) for r in self.read_metrics() if r.get("step", 0) <= step]
        atomic_write_bytes(self.metrics, ("\n".join(keep) + ("\n" if keep else "")).encode())


class MetricsLogger:
    """Appends JSON lines to ``DIR/metrics.jsonl`` and scalars to TensorBoard (``DIR/tb``), rank 0 only."""

    def __init__(self, run_dir: Optional[os.PathLike], enabled: bool = True, tensorboard: bool = True) -> None:
        self.run = RunDir(run_dir) if run_dir is not None else None
        self.enabled = enabled and self.run is not None
        self._tb = None
        self._tb_wanted = tensorboard
        # the training step that records logged without a "step" of their own (an epoch-end callback's)
        # are stamped with; set by the trainer around the callbacks. A resumed run drops every record
        # after its checkpoint's step, so a callback record of an epoch the killed run finished past its
        # last checkpoint must carry that epoch's step, or the resumed run would log it twice.
        self.step: Optional[int] = None

    @property
    def path(self) -> Optional[Path]:
        return self.run.metrics if self.run is not None else None

    def _writer(self):
        if self._tb is None and self._tb_wanted:
            try:
                from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy
                self._tb = SummaryWriter(log_dir=str(self.run.tensorboard))
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] != "tensorboard":
                    raise
                # an extra of its own: metrics.jsonl holds every record either way
                logger.info("no TensorBoard logs (tb/): pip install 'rpc-attention[tensorboard]' to write them")
                self._tb_wanted = False
            except Exception as exc:
                logger.warning("TensorBoard logging disabled (%s)", exc)
                self._tb_wanted = False
        return self._tb

    def log(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        rec = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        if "step" not in rec and self.step is not None:
            rec = {"step": self.step, **rec}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        tb = self._writer()
        if tb is not None and "step" in rec:
            split = rec.get("split", "train")
            for k, v in rec.items():
                if k not in ("step", "split") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    tb.add_scalar(f"{split}/{k}", v, rec["step"])

    def truncate_after(self, step: int) -> None:
        """:meth:`RunDir.truncate_metrics_after` on this logger's run (a no-op when disabled)."""
        if self.enabled:
            self.run.truncate_metrics_after(step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ------------------------------------------------------------------------------------ loading
def load_run(run_dir: os.PathLike, device: Any = "cpu", ema: bool = False,
             model_kwargs: Optional[Dict[str, Any]] = None) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """Rebuild a run's model from ``DIR/config.yaml`` and load its weights; returns ``(model, cfg)`` in eval mode.

    Weights: ``DIR/model.safetensors`` (``DIR/model_ema.safetensors`` with ``ema=True``); a run that
    has not finished falls back to its newest good checkpoint (with a note on stderr).
    ``model_kwargs``: model keywords set on top of the run's ``model.kwargs`` (options without weights,
    such as a SymViT's ``key_control``); the returned ``cfg`` records them.
    Raises ``FileNotFoundError`` (no run / no weights) or ``ValueError`` (weights do not fit the config,
    a model keyword the model does not take or refuses).
    """
    from safetensors.torch import load_file

    from .checkpoint import latest_checkpoint
    from .tasks import get_task

    run = RunDir(run_dir)
    if not run.is_run():
        raise FileNotFoundError(f"{run.path} is not a training run (expected {run.config})")
    cfg = run.read_config()
    task = get_task(cfg.get("task", "classification"))
    path = run.weights(ema)
    if not path.is_file():
        ckpt = latest_checkpoint(run.checkpoints, warn=None)
        if ckpt is None or not (ckpt / path.name).is_file():
            what = "EMA weights (train.ema.enabled was off?)" if ema else "weights"
            raise FileNotFoundError(f"{run.path} has no {what}: expected {path} or a checkpoint under {run.checkpoints}")
        logger.warning("%s is unfinished; loading %s", run.path, ckpt.name)
        path = ckpt / path.name
    if model_kwargs:
        model_cfg = dict(cfg.get("model") or {})
        cfg = dict(cfg, model=dict(model_cfg, kwargs={**(model_cfg.get("kwargs") or {}), **model_kwargs}))
    try:
        model = task.build_model(cfg)
    except TypeError as exc:
        if not model_kwargs:
            raise
        raise ValueError(f"model keywords {sorted(model_kwargs)} on {run.path}: {exc}") from None
    try:
        sd = load_file(str(path))
    except Exception as exc:
        raise ValueError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path} does not match the model in {run.config}: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), cfg


RunModel = Tuple[torch.nn.Module, Dict[str, Any], Optional[str], Dict[str, Any]]


def run_loader(run_dir: os.PathLike, ema: bool = False,
               model_kwargs: Optional[Dict[str, Any]] = None) -> Callable[[Any], RunModel]:
    """``load(device) -> (model, cfg, run_dir, source)`` for the run in ``run_dir``, loaded when called
    (errors as :func:`load_run`'s); ``source`` records the run, the weights used and the model keywords
    set on top of the run's (``model_kwargs``, only when given)."""

    def load(device: Any = "cpu") -> RunModel:
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
        model, cfg = load_run(run_dir, device=device, ema=ema, model_kwargs=model_kwargs)
        source = {"kind": "run", "run_dir": os.path.abspath(run_dir), "ema": bool(ema)}
        if model_kwargs:
            source["model_kwargs"] = dict(model_kwargs)
        return model, cfg, str(run_dir), source

    return load
