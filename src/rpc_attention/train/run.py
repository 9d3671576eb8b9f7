"""Load a finished (or interrupted) run: ``load_run(run_dir) -> (model, cfg)``; ``run_loader(run_dir)``
gives the model loader that :func:`rpc_attention.evaluate.runner.evaluate_model` takes."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

__all__ = ["load_run", "run_loader"]


def load_run(run_dir: os.PathLike, device: Any = "cpu", ema: bool = False) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """Rebuild a run's model from ``DIR/config.yaml`` and load its weights; returns ``(model, cfg)`` in eval mode.

    Weights: ``DIR/model.safetensors`` (``DIR/model_ema.safetensors`` with ``ema=True``); a run that
    has not finished falls back to its newest good checkpoint (with a note on stderr).
    Raises ``FileNotFoundError`` (no run / no weights) or ``ValueError`` (weights do not fit the config).
    """
    from safetensors.torch import load_file

    from .checkpoint import latest_checkpoint
    from .config import load_config_file
    from .tasks import get_task

    run = Path(run_dir)
    cfg_path = run / "config.yaml"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run} is not a training run (expected {cfg_path})")
    cfg = load_config_file(cfg_path)
    task = get_task(cfg.get("task", "classification"))
    name = "model_ema.safetensors" if ema else "model.safetensors"
    path = run / name
    if not path.is_file():
        ckpt = latest_checkpoint(run / "checkpoints", warn=None)
        if ckpt is None or not (ckpt / name).is_file():
            what = "EMA weights (train.ema.enabled was off?)" if ema else "weights"
            raise FileNotFoundError(f"{run} has no {what}: expected {path} or a checkpoint under {run / 'checkpoints'}")
        logger.warning("%s is unfinished; loading %s", run, ckpt.name)
        path = ckpt / name
    model = task.build_model(cfg)
    try:
        sd = load_file(str(path))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path} does not match the model in {cfg_path}: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), cfg


RunModel = Tuple[torch.nn.Module, Dict[str, Any], Optional[str], Dict[str, Any]]


def run_loader(run_dir: os.PathLike, ema: bool = False) -> Callable[[Any], RunModel]:
    """``load(device) -> (model, cfg, run_dir, source)`` for the run in ``run_dir``, loaded when called
    (errors as :func:`load_run`'s); ``source`` records the run and the weights used."""

    def load(device: Any = "cpu") -> RunModel:
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
        model, cfg = load_run(run_dir, device=device, ema=ema)
        return model, cfg, str(run_dir), {"kind": "run", "run_dir": os.path.abspath(run_dir), "ema": bool(ema)}

    return load
