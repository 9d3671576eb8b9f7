"""Optional dependencies: which extra of ``pip install 'rpc-attention[...]'`` provides each, and the one
error a user sees when one is missing.

The core (``rpc_attention``, ``rpc_attention.functional``, ``rpc_attention.nn``) needs torch and numpy
only. Everything else is grouped into extras, declared in ``pyproject.toml`` and mirrored by
:data:`EXTRAS` (``tests/test_packaging.py`` holds the two together)::

    pip install 'rpc-attention[timm]'    # the models in timm's registry
    pip install 'rpc-attention[all]'     # everything the command line and the studies use

A package that needs an extra checks for it when it is imported (:func:`require`, a ``find_spec``
lookup: nothing is imported) and a function that imports an optional module late does so through
:func:`import_optional`; both raise :class:`MissingExtraError`, a :class:`ModuleNotFoundError` whose
message is one line with the install command.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Dict, List, Sequence, Tuple

__all__ = ["EXTRAS", "PROVIDERS", "MissingExtraError", "require", "import_optional", "install_command", "modules_of",
           "missing_extra"]

#: import name -> (distribution, the extra that declares it); the requirements' pins live in pyproject.toml
PROVIDERS: Dict[str, Tuple[str, str]] = {
    "timm": ("timm", "timm"),
    "safetensors": ("safetensors", "timm"),
    "torchvision": ("torchvision", "timm"),
    "transformers": ("transformers", "hf"),
    "yaml": ("pyyaml", "train"),
    "tqdm": ("tqdm", "train"),
    "PIL": ("Pillow", "train"),
    "sklearn": ("scikit-learn", "train"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "scipy": ("scipy", "eval"),
    "skimage": ("scikit-image", "eval"),
    "torchattacks": ("torchattacks", "eval"),
    "imagecorruptions": ("imagecorruptions", "eval"),
    "matplotlib": ("matplotlib", "report"),
    "markdown": ("markdown", "report"),
    "submitit": ("submitit", "cluster"),
}

#: extra -> (the extras it includes, the import names it adds); ``all`` is every extra
EXTRAS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "timm": ((), ("timm", "safetensors", "torchvision")),
    "hf": ((), ("transformers", "safetensors")),
    "train": (("timm",), ("yaml", "tqdm", "PIL", "sklearn")),
    "tensorboard": ((), ("tensorboard",)),
    "eval": (("train",), ("scipy", "skimage", "torchattacks", "imagecorruptions")),
    "report": ((), ("matplotlib", "markdown", "scipy")),
    "cluster": ((), ("submitit",)),
    "all": (("timm", "hf", "train", "tensorboard", "eval", "report", "cluster"), ()),
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names it and the ``pip install`` command.
    ``modules`` holds the missing import names."""

    def __init__(self, message: str, modules: Sequence[str]) -> None:
        super().__init__(message, name=modules[0])
        self.modules = list(modules)


def install_command(extra: str) -> str:
    return f"pip install 'rpc-attention[{extra}]'"


def modules_of(extra: str) -> List[str]:
    """Every import name the extra provides, its included extras' first."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: one of {', '.join(EXTRAS)}")
    included, own = EXTRAS[extra]
    names: List[str] = []
    for e in included:
        names += [n for n in modules_of(e) if n not in names]
    return names + [n for n in own if n not in names]


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken spec
        return False


def _message(feature: str, missing: Sequence[str], extra: str) -> str:
    dists = ", ".join(PROVIDERS[m][0] if m in PROVIDERS else m for m in missing)
    verb = "is" if len(missing) == 1 else "are"
    return f"{feature} needs {dists}, which {verb} not installed: {install_command(extra)}"


def require(feature: str, extra: str, modules: Sequence[str] = ()) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` (or only ``modules``, when given)
    can be imported; ``feature`` names what needs them in the message (``"rpc_attention.models"``)."""
    missing = [m for m in (modules or modules_of(extra)) if not _present(m)]
    if missing:
        raise MissingExtraError(_message(feature, missing, extra), missing)


def import_optional(module: str, feature: str = "") -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingExtraError` naming the extra that provides
    it (from :data:`PROVIDERS`) when its top-level package is not installed."""
    top = module.split(".")[0]
    if top not in PROVIDERS:
        raise ValueError(f"import_optional imports the optional packages of PROVIDERS only, not {module!r}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != top:  # the package is there but lacks something
            raise
        raise MissingExtraError(_message(feature or module, [top], PROVIDERS[top][1]), [top]) from None


def missing_extra(exc: ModuleNotFoundError, extra: str, feature: str) -> MissingExtraError | None:
    """The one-line error for ``exc`` when it is an optional dependency going missing (a module of
    :data:`PROVIDERS`), naming ``extra`` as the fix; ``None`` for any other missing module (a bug)."""
    if isinstance(exc, MissingExtraError):
        return MissingExtraError(_message(feature, exc.modules, extra), exc.modules)
    top = (exc.name or "").split(".")[0]
    if top not in PROVIDERS:
        return None
    return MissingExtraError(_message(feature, [top], extra), [top])
