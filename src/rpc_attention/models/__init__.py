"""Model families: vision (SymViT / RPC-SymViT / Scaled ViT, registered in timm), lm, segmentation.

Importing this package registers the vision models in timm's registry (the way timm extensions do),
so that ``timm.create_model("rpc_symvit_tiny_patch16_224", ...)`` works after ``import rpc_attention.models``;
``import rpc_attention`` alone registers nothing and does not import timm.
Other families (``models.lm``, ``models.segmentation``) are imported on demand.
"""

from . import vision  # noqa: F401  (registers timm entry points)
from .vision import MODEL_NAMES, SymViT, load_official_checkpoint

__all__ = ["vision", "SymViT", "MODEL_NAMES", "load_official_checkpoint"]
