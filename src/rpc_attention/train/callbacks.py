"""Epoch-end callbacks of a training run.

A callback is ``fn(model, cfg, epoch, run_dir, logger)``: ``model`` is the unwrapped model (eval mode
during the call), ``epoch`` counts from 1, ``logger`` is a :class:`rpc_attention.train.rundir.MetricsLogger`
(``logger.log({...})`` appends to metrics.jsonl and TensorBoard). Callbacks run on rank 0 only. A callback
may return a dict: the last dict it returned is written into ``final_metrics.json`` under its name.

A run's callbacks are, in this order and each name once:

1. the ``(name, fn)`` pairs given to ``run_training(..., callbacks=...)``; by default
   :func:`default_callbacks`, which is the ``sparsity`` record (S activity of every PAP block,
   :mod:`rpc_attention.train.sparsity`; it skips models without PAP layers). ``callbacks=[]`` runs none;
2. the names ``cfg["train"]["callbacks"]`` lists, looked up in the registry.

The registry holds the built-in ``sparsity`` callback (filled on first lookup, as the task registry is)
and what :func:`register_callback` added. The analysis toolkit's ``jproj`` callback sits a floor above
the trainer: :func:`rpc_attention.kpca.register_callbacks` registers it (the ``train`` and ``reproduce``
commands call it).

``config_keys`` declares the dotted config keys a callback reads (``train.jproj_examples``): the config
accepts them, and only in a run that runs the callback (:func:`callback_config_keys`).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

Callback = Callable[..., Optional[dict]]

_CALLBACKS: Dict[str, Callback] = {}
_CONFIG_KEYS: Dict[str, Tuple[str, ...]] = {}
_BUILTINS_REGISTERED = False
_OWNED_BY_KPCA = ("jproj",)


def register_callback(name: str, fn: Callback, overwrite: bool = False, config_keys: Iterable[str] = ()) -> Callback:
    """Register ``fn`` as callback ``name`` (a run names it in ``train.callbacks``); ``config_keys``: what it reads."""
    if not callable(fn):
        raise TypeError(f"callback {name!r} must be callable")
    _register_builtin_callbacks()
    if name in _CALLBACKS and not overwrite and _CALLBACKS[name] is not fn:
        raise ValueError(f"callback {name!r} is already registered")
    _CALLBACKS[name] = fn
    _CONFIG_KEYS[name] = tuple(config_keys)
    return fn


def _register_builtin_callbacks() -> None:
    """Register the built-in callbacks; the flag is set only once they are all in."""
    global _BUILTINS_REGISTERED
    if _BUILTINS_REGISTERED:
        return
    from .sparsity import sparsity_callback

    if "sparsity" not in _CALLBACKS:
        _CALLBACKS["sparsity"] = sparsity_callback
        _CONFIG_KEYS["sparsity"] = ("train.sparsity_examples",)
    _BUILTINS_REGISTERED = True


def get_callback(name: str) -> Callback:
    _register_builtin_callbacks()
    if name not in _CALLBACKS:
        hint = " (rpc_attention.kpca.register_callbacks() registers it)" if name in _OWNED_BY_KPCA else ""
        raise ValueError(f"unknown callback {name!r}{hint}; registered: {', '.join(sorted(_CALLBACKS))}; "
                         "register your own with rpc_attention.train.register_callback(name, fn)")
    return _CALLBACKS[name]


def list_callbacks() -> List[str]:
    _register_builtin_callbacks()
    return sorted(_CALLBACKS)


def default_callbacks() -> List[Tuple[str, Callback]]:
    """The callbacks of a run when ``run_training`` is given none: the ``sparsity`` record."""
    return [("sparsity", get_callback("sparsity"))]


def resolve_callbacks(names: Optional[Iterable[str]],
                      given: Optional[Sequence[Tuple[str, Callback]]] = None) -> List[Tuple[str, Callback]]:
    """``given`` (default :func:`default_callbacks`), then the registered callbacks ``names`` lists that
    ``given`` does not already hold, each once."""
    out = list(default_callbacks() if given is None else given)
    for name, fn in out:
        if not callable(fn):
            raise TypeError(f"callback {name!r} must be callable")
    for name in names or []:
        if name not in [n for n, _ in out]:
            out.append((name, get_callback(name)))
    return out


def callback_config_keys() -> Dict[str, str]:
    """``{dotted config key: name of the registered callback that reads it}``."""
    _register_builtin_callbacks()
    return {key: name for name, keys in _CONFIG_KEYS.items() for key in keys}
