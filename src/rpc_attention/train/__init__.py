"""Task-generic trainer: presets, DDP, checkpoints, resume, run loading.

Public API::

    from rpc_attention.train import resolve_config, run_training, load_run
    cfg = resolve_config("fmnist-rpc-symvit", ["train.epochs=1"])
    run_dir = run_training(cfg, "runs/x")            # resume=True / force=True as on the CLI
    model, cfg = load_run(run_dir)                    # eval mode

Tasks plug in through :func:`rpc_attention.train.tasks.register_task`; epoch-end callbacks are given to
``run_training(..., callbacks=[(name, fn), ...])`` (default :func:`default_callbacks`: the S-activity
record of :mod:`rpc_attention.train.sparsity`) or registered by name with
:func:`rpc_attention.train.callbacks.register_callback` for ``train.callbacks`` to list.
"""

from ..extras import require

require('rpc_attention.train', 'train')  # one line naming the missing extra, before any import that needs it

from .callbacks import default_callbacks, register_callback
from .config import list_presets, load_preset, resolve_config
from .rundir import RunDir, RunExistsError, load_run, run_loader
from .tasks import get_task, list_tasks, register_task
from .trainer import TrainingDiverged, run_training

__all__ = [
    "resolve_config", "list_presets", "load_preset", "run_training", "RunDir", "load_run", "run_loader", "register_task", "get_task",
    "list_tasks", "register_callback", "default_callbacks", "RunExistsError", "TrainingDiverged",
]
