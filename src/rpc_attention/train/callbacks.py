"""Epoch-end callbacks: ``cfg["train"]["callbacks"]`` lists registered names.

``register_callback(name, fn)`` with ``fn(model, cfg, epoch, run_dir, logger)``; ``model`` is the
unwrapped model (eval mode during the call), ``epoch`` counts from 1, ``logger`` is a
:class:`rpc_attention.train.rundir.MetricsLogger` (``logger.log({...})`` appends to metrics.jsonl and
TensorBoard). Callbacks run on rank 0 only. A callback may return a dict: the last dict it returned
is written into ``final_metrics.json`` under the callback's name.

A callback registered with ``always=True`` runs in every run, listed or not (it decides itself
whether the model concerns it); :func:`resolve_callbacks` gives the trainer the callbacks of a run.
``config_keys`` declares the dotted config keys a callback reads (``train.jproj_examples``): the config
accepts them, and only in a run that runs the callback (:func:`callback_config_keys`).

The registry holds what was registered, nothing else: a callback registers when the module that owns it
is imported. The package's own ``jproj`` and ``sparsity`` callbacks belong to the analysis toolkit, a
floor above the trainer, so ``import rpc_attention.kpca`` registers them (the ``train`` and
``reproduce`` commands do).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Tuple

__all__ = ["register_callback", "get_callback", "list_callbacks", "resolve_callbacks", "callback_config_keys"]

_CALLBACKS: Dict[str, Callable] = {}
_CONFIG_KEYS: Dict[str, Tuple[str, ...]] = {}
_ALWAYS: List[str] = []
_OWNED_BY_KPCA = ("jproj", "sparsity")


def register_callback(name: str, fn: Callable, overwrite: bool = False, always: bool = False,
                      config_keys: Iterable[str] = ()) -> Callable:
    """Register ``fn`` as callback ``name``; ``always=True`` runs it in every run; ``config_keys``: what it reads."""
    if not callable(fn):
        raise TypeError(f"callback {name!r} must be callable")
    if name in _CALLBACKS and not overwrite and _CALLBACKS[name] is not fn:
        raise ValueError(f"callback {name!r} is already registered")
    _CALLBACKS[name] = fn
    _CONFIG_KEYS[name] = tuple(config_keys)
    if always and name not in _ALWAYS:
        _ALWAYS.append(name)
    elif not always and name in _ALWAYS:
        _ALWAYS.remove(name)
    return fn


def get_callback(name: str) -> Callable:
    if name not in _CALLBACKS:
        hint = " (import rpc_attention.kpca to register it)" if name in _OWNED_BY_KPCA else ""
        raise ValueError(f"unknown callback {name!r}{hint}; registered: {', '.join(sorted(_CALLBACKS)) or '(none)'}; "
                         "register your own with rpc_attention.train.register_callback(name, fn)")
    return _CALLBACKS[name]


def list_callbacks() -> List[str]:
    return sorted(_CALLBACKS)


def resolve_callbacks(names: Optional[Iterable[str]]) -> List[Tuple[str, Callable]]:
    """``(name, fn)`` for the always-on callbacks, then the ``names`` a run lists (each once)."""
    order = list(_ALWAYS) + [n for n in (names or []) if n not in _ALWAYS]
    seen: List[str] = []
    for n in order:
        if n not in seen:
            seen.append(n)
    return [(n, get_callback(n)) for n in seen]


def callback_config_keys() -> Dict[str, str]:
    """``{dotted config key: name of the registered callback that reads it}``."""
    return {key: name for name, keys in _CONFIG_KEYS.items() for key in keys}
