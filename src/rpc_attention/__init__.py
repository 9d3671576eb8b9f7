"""rpc-attention: the kernel-PCA view of self-attention and RPC-Attention (Principal Attention Pursuit).

Layout: ``functional`` (kernels) -> ``nn`` (modules) -> ``models`` (vision, lm, segmentation) ->
``data``, ``train``, ``evaluate`` -> ``kpca`` (analysis) -> ``report`` -> ``cli``.
Importing the package registers the vision models in timm's registry (when ``rpc_attention.models``
is present).
"""

from . import functional, nn
from .functional import pap_attention, symmetric_attention, scaled_attention_alpha, scaled_attention_s
from .nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention

__version__ = "0.1.0"

__all__ = [
    "functional", "nn", "pap_attention", "symmetric_attention", "scaled_attention_s",
    "scaled_attention_alpha", "Attention", "SymmetricAttention", "RPCAttention", "ScaledAttention",
]


def _register_models() -> None:
    import importlib.util

    if importlib.util.find_spec(__name__ + ".models") is not None:
        from . import models  # noqa: F401  (registers timm entry points)


_register_models()
