"""Test-time RPC attention for pretrained models from other libraries.

- :mod:`rpc_attention.integrations.transformers`: ``attn_implementation="rpc"`` for Hugging Face models.
- :mod:`rpc_attention.integrations.timm`: ``convert(model, rpc_layers=...)`` / ``revert(model)`` for timm ViTs.

Both use the asymmetric extension of PAP defined in :mod:`rpc_attention.integrations._core`
(:func:`asymmetric_rpc_attention`). Neither submodule is imported here (transformers is optional).
Test-time RPC for evaluation (loading external models, its command-line options) lives a floor above,
in :mod:`rpc_attention.evaluate.external`.
"""

from ._core import DEFAULT_OPTIONS, KEY_MODES, asymmetric_rpc_attention, check_options

__all__ = ["asymmetric_rpc_attention", "check_options", "DEFAULT_OPTIONS", "KEY_MODES"]
