"""Task registry: what the trainer trains.

A task is any object with

* ``build_model(cfg) -> nn.Module``
* ``build_datasets(cfg) -> {"train": ds, "val": ds, ...}`` (``"test"`` optional; used for the final
  evaluation when ``cfg["eval"]["final_split"] == "test"``). Train items may be indexed with a tuple
  ``(index, epoch, position)`` when the data set is an
  :class:`rpc_attention.data.images.SeededTransformDataset`; plain data sets get plain ints.
* ``collate_fn(cfg)`` -> a DataLoader collate function, or ``None`` for the default
* ``loss(model, batch, cfg) -> (loss_tensor, {stat: float or 0-d tensor})`` (the batch is already
  on the training device; ``model`` may be DDP/compile-wrapped)
* ``evaluate(model, loader, cfg) -> {metric: float}`` (model in eval mode, under ``torch.no_grad``)
* ``throughput_unit``: ``"images"`` or ``"tokens"``

and optionally

* ``count(batch) -> int``: units (images/tokens) in a batch, for the throughput (default ``len(batch[0])``)
* ``default_config() -> dict``: task defaults merged below the preset; with ``optional_keys`` (dotted
  keys read without a default) they declare every key the task reads: any other key in a config is
  an error (:func:`rpc_attention.train.config.check_known_keys`)
* ``ignored_keys``: dotted keys of the shared sections the task does not read (an error unless at
  their defaults)
* ``derived_keys``: ``{source dotted key: derived dotted key}``, values ``finalize_config`` derives
  (``model.kwargs.num_classes`` from ``data.num_classes``); overriding the source drops the saved
  derived value so it is derived again (on a resume too)
* ``finalize_config(cfg) -> cfg``: fill derived values (e.g. ``data.mean``) after overrides
* ``setup(cfg, device)``: called once per run before training (e.g. to build Mixup)
* ``primary_metric``: name of the metric shown in the progress bar / summary (default
  :data:`DEFAULT_PRIMARY_METRIC`, ``"acc1"``; read it with :func:`primary_metric`)
* ``primary_mode``: ``"max"`` (default) or ``"min"`` (perplexity): which way the primary metric
  improves (``train.keep_best`` selects by it; read it with :func:`better`)

Register with :func:`register_task`. The built-in tasks (``classification``, ``lm``, ``segmentation``)
are listed in :func:`_register_builtin_tasks` and imported on first lookup (their modules import models
and data sets, which ``import rpc_attention.train`` should not pay for). A new built-in task is a module
``task_<name>.py`` that defines ``TASK`` plus one line in that list; a task of your own is a
``register_task`` call before training.
"""

from __future__ import annotations

from typing import Any, Dict, List

DEFAULT_PRIMARY_METRIC = "acc1"  # top-1 accuracy, what the classification task's evaluate reports

_TASKS: Dict[str, Any] = {}
_BUILTINS_REGISTERED = False

_REQUIRED = ("build_model", "build_datasets", "loss", "evaluate")


def register_task(name: str, task: Any, overwrite: bool = False) -> Any:
    """Register ``task`` under ``name`` (returns the task, so it can decorate a class instance)."""
    missing = [a for a in _REQUIRED if not callable(getattr(task, a, None))]
    if missing:
        raise TypeError(f"task {name!r} lacks {', '.join(missing)}")
    if getattr(task, "throughput_unit", "images") not in ("images", "tokens"):
        raise ValueError(f"task {name!r}: throughput_unit must be 'images' or 'tokens'")
    if name in _TASKS and not overwrite and _TASKS[name] is not task:
        raise ValueError(f"task {name!r} is already registered")
    _TASKS[name] = task
    return task


def _register_builtin_tasks() -> None:
    """Import the built-in task modules and register the ``TASK`` each defines; idempotent. The imports come
    first and the flag last, so a failing import registers nothing and the next lookup tries again."""
    global _BUILTINS_REGISTERED
    if _BUILTINS_REGISTERED:
        return
    from . import task_classification, task_lm, task_segmentation

    builtins = {"classification": task_classification.TASK, "lm": task_lm.TASK,
                "segmentation": task_segmentation.TASK}
    for name, task in builtins.items():
        register_task(name, task)
    _BUILTINS_REGISTERED = True


def get_task(name: str) -> Any:
    _register_builtin_tasks()
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(_TASKS)) or '(none)'}")
    return _TASKS[name]


def list_tasks() -> List[str]:
    _register_builtin_tasks()
    return sorted(_TASKS)


def primary_metric(task: Any) -> str:
    """The metric ``task`` is judged by: its ``primary_metric``, else :data:`DEFAULT_PRIMARY_METRIC`."""
    return str(getattr(task, "primary_metric", DEFAULT_PRIMARY_METRIC))


def better(task: Any, value: float, best: float) -> bool:
    """Whether ``value`` of the task's primary metric improves on ``best`` (its ``primary_mode``)."""
    return value < best if str(getattr(task, "primary_mode", "max")) == "min" else value > best
