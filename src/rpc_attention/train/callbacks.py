"""Epoch-end callbacks: ``cfg["train"]["callbacks"]`` lists registered names.

``register_callback(name, fn)`` with ``fn(model, cfg, epoch, run_dir, logger)``; ``model`` is the
unwrapped model (eval mode during the call), ``epoch`` counts from 1, ``logger`` is a
:class:`rpc_attention.train.rundir.MetricsLogger` (``logger.log({...})`` appends to metrics.jsonl and
TensorBoard). Callbacks run on rank 0 only.

The registry holds what was registered, nothing else: a callback registers when the module that owns it
is imported. The package's own ``jproj`` callback belongs to the analysis toolkit, a floor above the
trainer, so ``import rpc_attention.kpca`` registers it (the ``train`` and ``reproduce`` commands do).
"""

from __future__ import annotations

from typing import Callable, Dict, List

__all__ = ["register_callback", "get_callback", "list_callbacks"]

_CALLBACKS: Dict[str, Callable] = {}


def register_callback(name: str, fn: Callable, overwrite: bool = False) -> Callable:
    if not callable(fn):
        raise TypeError(f"callback {name!r} must be callable")
    if name in _CALLBACKS and not overwrite and _CALLBACKS[name] is not fn:
        raise ValueError(f"callback {name!r} is already registered")
    _CALLBACKS[name] = fn
    return fn


def get_callback(name: str) -> Callable:
    if name not in _CALLBACKS:
        hint = " (import rpc_attention.kpca to register it)" if name == "jproj" else ""
        raise ValueError(f"unknown callback {name!r}{hint}; registered: {', '.join(sorted(_CALLBACKS)) or '(none)'}; "
                         "register your own with rpc_attention.train.register_callback(name, fn)")
    return _CALLBACKS[name]


def list_callbacks() -> List[str]:
    return sorted(_CALLBACKS)
