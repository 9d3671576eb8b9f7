"""The one place where this library's model families meet timm's model factory.

:func:`build_timm_model` wraps :func:`timm.models.build_model_with_cfg` so that a registered model
behaves like timm's own models without hub weights:

* ``features_only=True`` (with ``out_indices`` and ``feature_cls``: ``"getter"`` by default, also
  ``"fx"``, ``"hook"``, ...) wraps the model as timm does;
* ``pretrained_cfg_overlay`` fields (``mean``, ``std``, ``file``, ...) reach ``model.pretrained_cfg``
  and its alias ``model.default_cfg``;
* ``pretrained=True`` loads the weights the resolved config names (``file=`` a local ``.pth`` /
  ``.safetensors``, a ``url``, a ``state_dict``), adapting the classifier and the input channels as
  timm does; with no source at all it raises timm's ``RuntimeError``, saying how to load local weights;
* model attributes named in ``cfg_attrs`` (``rpc_cfg``) are recorded in ``pretrained_cfg`` /
  ``default_cfg`` of the model and, with ``features_only``, of the feature wrapper too.

A keyword the model's constructor does not take (``timm.create_model("rpc_symvit_tiny_patch16_224",
n_iters=2)``) is a :class:`ModelKeywordError` naming it, the model and the closest keywords the model takes
(constructor and timm factory keywords), raised by :func:`build_timm_model` itself, so every family built
through it reports it so, whether it is called through ``timm.create_model`` or this library. The error is a
``TypeError`` (what Python raises for an unexpected keyword) and a ``ValueError`` (what the commands report
as a settings error).

:func:`create_model` is :func:`timm.create_model` with that line for any timm model, timm's own included: a
model keyword no constructor takes (``--set model.kwargs.n_iters=2``) surfaces in timm as a ``TypeError``
deep inside the factory, and :func:`create_model` turns it into a :class:`ModelKeywordError` naming the
setting (``model.kwargs.n_iters``), so every command that builds a timm model from user settings (train,
eval-external, analyze) reports it the same way.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Type

from timm.models import build_model_with_cfg, resolve_pretrained_cfg
from timm.models._features import feature_take_indices
from torch import nn

# feature_take_indices (which blocks forward_intermediates returns, from timm's `indices` argument) is what
# timm's own models call; timm keeps it in a private module, so this is the one place that reaches for it.
__all__ = ["ModelKeywordError", "build_timm_model", "create_model", "feature_take_indices", "keyword_error"]

_WEIGHT_SOURCES = ("file", "url", "state_dict", "hf_hub_id")

# Keywords timm's factory reads before the model's constructor runs: a misspelling of one of them reaches
# the constructor, so they are among the suggestions too.
_FACTORY_KEYWORDS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir",
                     "features_only", "out_indices", "feature_cls")


class ModelKeywordError(TypeError, ValueError):
    """A keyword argument no constructor of ``model`` takes, with the closest ones it does (difflib).

    Both a ``TypeError`` (Python's error for an unexpected keyword, which callers of ``timm.create_model``
    catch) and a ``ValueError`` (a settings error, which the commands report in one line). ``prefix`` is the
    settings path the keyword came from (``"model.kwargs."``), empty for a Python call.
    """

    def __init__(self, model: str, key: str, known: Sequence[str], prefix: str = "") -> None:
        self.model, self.key, self.known, self.prefix = model, key, sorted(set(known)), prefix
        close = difflib.get_close_matches(key, self.known, n=3)
        if close:
            hint = f"; did you mean {', '.join(close)}?"
        else:
            hint = f"; it takes {', '.join(self.known)}" if self.known else ""
        head = f"{prefix}{key}: " if prefix else ""
        super().__init__(f"{head}{model} takes no keyword argument {key!r}{hint}")

    def __reduce__(self):  # picklable across worker processes (the default would pass the message as model)
        return type(self), (self.model, self.key, self.known, self.prefix)


def _check_weights_exist(variant: str, kwargs: Dict[str, Any]) -> None:
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg=kwargs.get("pretrained_cfg"),
                                 pretrained_cfg_overlay=kwargs.get("pretrained_cfg_overlay"))
    if not any(getattr(cfg, key, None) for key in _WEIGHT_SOURCES):
        raise RuntimeError(
            f"No pretrained weights exist for {variant}. Use pretrained=False for random init, or load local "
            f"weights with timm.create_model({variant!r}, pretrained=True, "
            f"pretrained_cfg_overlay=dict(file='path/to/checkpoint.pth'))")


def build_timm_model(
    model_cls: Type[nn.Module],
    variant: str,
    pretrained: bool = False,
    *,
    cfg_attrs: Sequence[str] = (),
    default_out_indices: Any = 3,
    default_feature_cls: str = "getter",
    pretrained_filter_fn: Optional[Callable[[Dict[str, Any], nn.Module], Dict[str, Any]]] = None,
    **kwargs: Any,
) -> nn.Module:
    """Build ``model_cls(**kwargs)`` as the registered ``variant`` through timm's factory.

    Args:
        model_cls: the model class (its ``__init__`` receives the remaining ``kwargs``).
        variant: the registered name whose ``default_cfgs`` entry is the pretrained config.
        pretrained: load the weights the resolved pretrained config points to.
        cfg_attrs: model attributes (plain data) copied into ``pretrained_cfg`` / ``default_cfg``.
        default_out_indices: feature levels for ``features_only`` when ``out_indices`` is not given.
        default_feature_cls: feature wrapper for ``features_only`` when ``feature_cls`` is not given.
        pretrained_filter_fn: ``fn(state_dict, model) -> state_dict`` run on loaded weights.
        **kwargs: model arguments plus timm's factory arguments (``features_only``, ``out_indices``,
            ``feature_cls``, ``pretrained_cfg``, ``pretrained_cfg_overlay``, ``cache_dir``).
    """
    if pretrained:
        _check_weights_exist(variant, kwargs)
    out_indices = kwargs.pop("out_indices", default_out_indices)
    built = []

    def construct(**model_kwargs: Any) -> nn.Module:
        try:
            model = model_cls(**model_kwargs)
        except TypeError as exc:
            # only a keyword the caller passed is theirs to fix; an unexpected keyword that the model's
            # own code passes to a submodule stays the bug it is
            m = _UNEXPECTED_KEY.search(str(exc))
            if m is None or m.group(1) not in model_kwargs:
                raise
            known = [*_init_keywords(model_cls), *_FACTORY_KEYWORDS]
            raise ModelKeywordError(variant, m.group(1), known) from None
        built.append(model)
        return model

    model = build_model_with_cfg(
        construct, variant, pretrained, pretrained_filter_fn=pretrained_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls=default_feature_cls), **kwargs)
    # A feature wrapper holds a deep copy of the inner model's config: record the extras in both.
    extras = {name: copy.deepcopy(getattr(built[0], name)) for name in cfg_attrs}
    for holder in (model, built[0]):
        for cfg_name in ("pretrained_cfg", "default_cfg"):
            cfg = getattr(holder, cfg_name, None)
            if isinstance(cfg, dict):
                cfg.update(copy.deepcopy(extras))
    return model


_UNEXPECTED = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
_UNEXPECTED_KEY = re.compile(r"got an unexpected keyword argument '(\w+)'")


def _model_classes(tb) -> List[type]:
    """The nn.Module classes being constructed in the frames of traceback ``tb`` (innermost first)."""
    found = []
    while tb is not None:
        for name, value in tb.tb_frame.f_locals.items():
            cls = type(value) if name == "self" and isinstance(value, nn.Module) else value
            if isinstance(cls, type) and issubclass(cls, nn.Module) and cls not in found:
                found.append(cls)
        tb = tb.tb_next
    return found[::-1]


def _init_keywords(cls: type) -> List[str]:
    """The named keyword parameters of every ``__init__`` in ``cls``'s hierarchy."""
    names: Set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass in (nn.Module, object):
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names.update(p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return sorted(names)


def keyword_error(exc: TypeError, model: str, prefix: str = "model.kwargs.") -> Optional[ModelKeywordError]:
    """The one-line error for ``exc`` if it is an unexpected-keyword ``TypeError`` of a model constructor
    (a :class:`ModelKeywordError` of :func:`build_timm_model`, or Python's own, timm's models' included),
    naming the keyword as the setting ``prefix + key``; None for any other ``TypeError``."""
    if isinstance(exc, ModelKeywordError):
        return ModelKeywordError(exc.model, exc.key, exc.known, prefix)
    m = _UNEXPECTED.search(str(exc))
    if not m:
        return None
    owner, key = m.groups()
    classes = [c for c in _model_classes(exc.__traceback__) if any(k.__name__ == owner for k in c.__mro__)]
    return ModelKeywordError(model, key, _init_keywords(classes[0]) if classes else [], prefix)


def create_model(name: str, prefix: str = "model.kwargs.", **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; a keyword no constructor takes is a :class:`ModelKeywordError`
    (a ValueError) naming ``prefix + key``."""
    import timm

    try:
        return timm.create_model(name, **kwargs)
    except TypeError as exc:
        err = keyword_error(exc, name, prefix)
        if err is None:
            raise
        raise err from None
