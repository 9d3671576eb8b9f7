"""Data sets: images (Fashion-MNIST, MNIST-5k, ImageFolder), text and segmentation (see submodules).

Submodules are imported on demand (``from rpc_attention.data import images``) to keep
``import rpc_attention`` fast.
"""

from ..extras import require

require('rpc_attention.data', 'train')  # one line naming the missing extra, before any import that needs it

__all__ = []  # the data sets live in the submodules (from rpc_attention.data import images)
