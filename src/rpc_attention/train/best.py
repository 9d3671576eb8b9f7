"""``train.keep_best``: end a run with the weights of its best validation epoch.

:class:`BestWeights` follows the validation records of a run (the task's primary metric, which way
it improves from :func:`rpc_attention.train.tasks.better`), writes the weights of each new best to
``model_best.safetensors`` and, at the end, keeps the last step's weights in
``model_last.safetensors`` and loads the best into the model, which the trainer then saves as
``model.safetensors`` and evaluates. A resume re-reads the best so far from ``metrics.jsonl``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

import torch

from .checkpoint import save_safetensors_atomic
from .rundir import RunDir
from .tasks import better, primary_metric

_log = logging.getLogger(__name__)


class BestWeights:
    """The best validation record of ``run`` so far (``best``: its step, epoch and metric, or None)."""

    def __init__(self, run: RunDir, task: Any, enabled: bool) -> None:
        self.run, self.task, self.enabled = run, task, bool(enabled)
        self.key = primary_metric(task)
        self.best: Optional[Dict[str, Any]] = None

    def _beats(self, record: Dict[str, Any]) -> bool:
        value = record.get(self.key)
        if not isinstance(value, (int, float)):
            return False
        return self.best is None or better(self.task, float(value), float(self.best[self.key]))

    def observe(self, model: torch.nn.Module, record: Dict[str, Any]) -> None:
        """A validation record (``step``, ``epoch``, metrics): a new best writes the model's weights."""
        if self.enabled and self._beats(record):
            self.best = {"step": record["step"], "epoch": record["epoch"], self.key: float(record[self.key])}
            save_safetensors_atomic(model.state_dict(), self.run.best_weights())

    def reread(self, step: int) -> None:
        """After a resume: the best of the validation records logged up to ``step``."""
        if not self.enabled:
            return
        self.best = None
        for rec in self.run.read_metrics("val", missing_ok=True):
            if rec.get("step", 0) <= step and not rec.get("final") and self._beats(rec):
                self.best = {"step": rec["step"], "epoch": rec["epoch"], self.key: float(rec[self.key])}

    def select(self, model: torch.nn.Module, device: torch.device) -> None:
        """At the end: save the last step's weights to ``model_last.safetensors`` and load the best."""
        if not self.enabled:
            return
        save_safetensors_atomic(model.state_dict(), self.run.best_weights(last=True))
        if self.best is None or not self.run.best_weights().is_file():
            _log.warning("train.keep_best: no validation ran, so the final weights are the last step's")
            return
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(self.run.best_weights()), device=str(device)))
        _log.info("train.keep_best: the final weights are epoch %s's (step %s)", self.best["epoch"], self.best["step"])
