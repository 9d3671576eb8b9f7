"""Model families: vision (SymViT / RPC-SymViT / Scaled ViT), FAN (FAN / SymFAN / RPC-FAN), lm, segmentation.

Importing this package registers the vision and FAN models in timm's registry (the way timm extensions
do), so that ``timm.create_model("rpc_symvit_tiny_patch16_224", ...)`` or
``timm.create_model("rpc_fan_tiny_12_p16_224", ...)`` works after ``import rpc_attention.models``;
``import rpc_attention`` alone registers nothing and does not import timm.
Other families (``models.lm``, ``models.segmentation``) are imported on demand.

A new family builds its models with :func:`build_timm_model` (timm's factory, local weights,
``features_only``), reads checkpoints with :func:`read_checkpoint` / :func:`unwrap_state_dict`, and calls
the attention kernels through :mod:`rpc_attention.nn` (``Attention``, ``SymmetricAttention``,
``RPCAttention``, ``softmax_attention``); :mod:`rpc_attention.models.fan` is built that way.
"""

from ..extras import require

require('rpc_attention.models', 'timm')  # one line naming the missing extra, before any import that needs it

from . import fan, vision  # importing them registers their timm entry points
from .factory import build_timm_model, feature_take_indices
from .fan import FAN, FAN_MODEL_NAMES, load_fan_checkpoint
from .vision import MODEL_NAMES, SymViT, load_official_checkpoint, read_checkpoint, unwrap_state_dict

__all__ = ["vision", "fan", "SymViT", "MODEL_NAMES", "load_official_checkpoint", "FAN", "FAN_MODEL_NAMES",
           "load_fan_checkpoint", "build_timm_model", "feature_take_indices", "read_checkpoint", "unwrap_state_dict"]
