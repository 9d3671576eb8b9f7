"""How a run's random state starts: the global RNGs seeded from ``train.seed``, and the initial model.

:func:`initial_model` is the one place the trainer builds its model, so anything that needs a run's
step-0 weights (the ``kpca`` suite's J_proj at initialisation) rebuilds them from the run's saved
``config.yaml`` with the same call instead of repeating the trainer's seeding.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Optional

import numpy as np
import torch

from .checkpoint import rng_state, set_rng_state
from .config import TrainConfig
from .tasks import get_task


def seed_all(seed: int) -> None:
    """Seed torch's, numpy's and Python's global RNGs with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    random.seed(seed)


def initial_model(cfg: Dict[str, Any], task: Any = None, seed: Optional[int] = None,
                  keep_rng: bool = False) -> torch.nn.Module:
    """The model a fresh run of ``cfg`` starts from, exactly: the global RNGs seeded with ``seed`` (default:
    the config's ``train.seed``), then ``task.build_model(cfg)`` on the CPU (the trainer moves it to its
    device afterwards). ``task``: default the config's own task.

    ``keep_rng=True`` restores the caller's RNG states afterwards; the trainer leaves them seeded, as a
    fresh run continues from there.
    """
    if task is None:
        task = get_task(cfg.get("task", "classification"))
    if seed is None:
        seed = TrainConfig.from_dict(cfg).train.seed
    saved = rng_state() if keep_rng else None
    try:
        seed_all(int(seed))
        return task.build_model(cfg)
    finally:
        if saved is not None:
            set_rng_state(saved)
