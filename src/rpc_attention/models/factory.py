"""``create_model``: :func:`timm.create_model` whose misspelt keyword is one clear line, not a traceback.

A model keyword no constructor takes (``--set model.kwargs.n_iters=2``) surfaces in timm as a
``TypeError`` deep inside the factory. :func:`create_model` turns it into a ``ValueError`` naming the
setting (``model.kwargs.n_iters``), the model and the closest keywords the model's constructors
accept (every ``__init__`` along the class hierarchy of the model being built), so every command
that builds a timm model from user settings (train, eval-external, analyze) reports it the same way.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any, List, Optional

from torch import nn

__all__ = ["create_model", "keyword_error"]

_UNEXPECTED = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


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
    names = set()
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


def keyword_error(exc: TypeError, model: str, prefix: str = "model.kwargs.") -> Optional[ValueError]:
    """The one-line error for ``exc`` if it is an unexpected-keyword ``TypeError`` of a model constructor."""
    m = _UNEXPECTED.search(str(exc))
    if not m:
        return None
    owner, key = m.groups()
    classes = [c for c in _model_classes(exc.__traceback__) if any(k.__name__ == owner for k in c.__mro__)]
    known = _init_keywords(classes[0]) if classes else []
    close = difflib.get_close_matches(key, known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else (f"; it takes {', '.join(known)}" if known else "")
    return ValueError(f"{prefix}{key}: {model} takes no keyword argument {key!r}{hint}")


def create_model(name: str, prefix: str = "model.kwargs.", **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; a keyword no constructor takes is a ValueError naming ``prefix + key``."""
    import timm

    try:
        return timm.create_model(name, **kwargs)
    except TypeError as exc:
        err = keyword_error(exc, name, prefix)
        if err is None:
            raise
        raise err from None
