"""Epoch-end callbacks: ``cfg["train"]["callbacks"]`` lists registered names.

``register_callback(name, fn)`` with ``fn(model, cfg, epoch, run_dir, logger)``; ``model`` is the
unwrapped model (eval mode during the call), ``epoch`` counts from 1, ``logger`` is a
:class:`rpc_attention.train.trainer.MetricsLogger` (``logger.log({...})`` appends to metrics.jsonl and
TensorBoard). Callbacks run on rank 0 only. Modules ``rpc_attention.train.callback_*`` are imported on
first lookup (same discovery as tasks).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Dict, List

__all__ = ["register_callback", "get_callback", "list_callbacks"]

_CALLBACKS: Dict[str, Callable] = {}
_DISCOVERED = False


def register_callback(name: str, fn: Callable, overwrite: bool = False) -> Callable:
    if not callable(fn):
        raise TypeError(f"callback {name!r} must be callable")
    if name in _CALLBACKS and not overwrite and _CALLBACKS[name] is not fn:
        raise ValueError(f"callback {name!r} is already registered")
    _CALLBACKS[name] = fn
    return fn


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    from . import __path__ as pkg_path

    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg_path)):
        if mod.startswith("callback_"):
            importlib.import_module(f"{__package__}.{mod}")


def get_callback(name: str) -> Callable:
    _discover()
    if name not in _CALLBACKS:
        raise ValueError(f"unknown callback {name!r}; registered: {', '.join(sorted(_CALLBACKS)) or '(none)'}")
    return _CALLBACKS[name]


def list_callbacks() -> List[str]:
    _discover()
    return sorted(_CALLBACKS)
