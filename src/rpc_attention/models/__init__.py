"""Model families: vision (SymViT / RPC-SymViT / Scaled ViT), FAN (FAN / SymFAN / RPC-FAN), lm, segmentation.

Importing this package registers the vision and FAN models in timm's registry (the way timm extensions
do), so that ``timm.create_model("rpc_symvit_tiny_patch16_224", ...)`` or
``timm.create_model("rpc_fan_tiny_12_p16_224", ...)`` works after ``import rpc_attention.models``;
``import rpc_attention`` alone registers nothing and does not import timm.
Other families (``models.lm``, ``models.segmentation``) are imported on demand.
"""

from . import fan, vision  # importing them registers their timm entry points
from .fan import FAN, FAN_MODEL_NAMES, load_fan_checkpoint
from .vision import MODEL_NAMES, SymViT, load_official_checkpoint

__all__ = ["vision", "fan", "SymViT", "MODEL_NAMES", "load_official_checkpoint", "FAN", "FAN_MODEL_NAMES",
           "load_fan_checkpoint"]
