"""rpc-attention: the kernel-PCA view of self-attention and RPC-Attention (Principal Attention Pursuit).

Layout: ``functional`` (kernels) -> ``nn`` (modules) -> ``models`` (vision, lm, segmentation) ->
``data``, ``train``, ``evaluate`` -> ``kpca`` (analysis) -> ``report`` -> ``cli``.
Importing the package registers the vision models in timm's registry: at once when timm is already
imported, otherwise the moment timm is (importing timm costs 2.5 s of ``torch._dynamo`` through
torchvision, which a user of the kernels alone should not pay).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from . import functional, nn
from .functional import pap_attention, symmetric_attention, scaled_attention_alpha, scaled_attention_s
from .nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention

__version__ = "0.1.0"

__all__ = [
    "functional", "nn", "pap_attention", "symmetric_attention", "scaled_attention_s",
    "scaled_attention_alpha", "Attention", "SymmetricAttention", "RPCAttention", "ScaledAttention",
]


class _RegisterWhenTimmLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands back timm's own spec with its loader wrapped so that our models
    are registered right after timm's ``__init__`` has run; then it leaves ``sys.meta_path``.
    (A mere ``find_spec("timm")``, as availability checks do, loads nothing and keeps it in place.)"""

    _looking = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "timm" or self._looking:
            return None
        self._looking = True
        try:
            spec = importlib.util.find_spec("timm")
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        exec_timm = spec.loader.exec_module

        def exec_and_register(module) -> None:
            exec_timm(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            importlib.import_module(__name__ + ".models")

        spec.loader.exec_module = exec_and_register
        return spec


def _register_models() -> None:
    if importlib.util.find_spec(__name__ + ".models") is None:
        return
    if "timm" in sys.modules:
        importlib.import_module(__name__ + ".models")
    elif not any(isinstance(f, _RegisterWhenTimmLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenTimmLoads())


_register_models()
