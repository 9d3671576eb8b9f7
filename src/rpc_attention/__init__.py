"""rpc-attention: the kernel-PCA view of self-attention and RPC-Attention (Principal Attention Pursuit).

Importing the package loads the kernels (``functional``) and the attention modules (``nn``) only, so it
stays cheap and does not import timm. The vision models join timm's registry when ``rpc_attention.models``
is imported, as with any timm extension; after ``import rpc_attention`` alone, timm answers
``RuntimeError: Unknown model (rpc_symvit_tiny_patch16_224)``::

    import timm
    import rpc_attention.models  # needed: registers symvit_*, rpc_symvit_*, scaled_*, fan_*
    model = timm.create_model("rpc_symvit_tiny_patch16_224", num_classes=10)

The floors of the package and what each owns are described in ``docs/architecture.md``.
"""

import importlib.metadata as _metadata

from . import functional, nn
from .functional import pap_attention, scaled_attention_alpha, scaled_attention_s, symmetric_attention
from .nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention

try:  # one version source: the package metadata (pyproject.toml's version)
    __version__ = _metadata.version("rpc-attention")
except _metadata.PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

__all__ = [
    "functional", "nn", "pap_attention", "symmetric_attention", "scaled_attention_s",
    "scaled_attention_alpha", "Attention", "SymmetricAttention", "RPCAttention", "ScaledAttention", "__version__",
]
