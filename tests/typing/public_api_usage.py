"""The public API as a user writes it, for the type checker (``make typecheck``; pyproject's ``[tool.mypy]``).

Never collected by pytest and never run by it: mypy reads it, and each annotated assignment states the type a
user may rely on. A line ending in ``# type: ignore[...]`` must be an error (``warn_unused_ignores`` holds
this file to that), so the overloads cannot quietly widen back to a union.
"""

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

import rpc_attention
import rpc_attention.functional as RF
from rpc_attention import RPCAttention, SymmetricAttention, pap_attention
from rpc_attention.extras import EXTRAS, MissingExtraError, import_optional, install_command, require


def kernels() -> List[Tensor]:
    k = torch.randn(2, 3, 17, 8)
    v = torch.randn(2, 3, 17, 8)
    out: Tensor = pap_attention(k, v, n_iter=6, lambd=4.0)
    out_state: Tuple[Tensor, RF.PAPState] = pap_attention(k, v, n_iter=6, return_state=True)
    out2, state = RF.pap_attention(k, v, return_state=True, tol=1e-4)
    sparse: Tensor = state.sparse
    flag: bool = bool(torch.rand(()) > 0.5)
    either = pap_attention(k, v, return_state=flag)   # a plain bool: the caller narrows it
    plain = either if isinstance(either, Tensor) else either[0]
    wrong: Tensor = pap_attention(k, v, return_state=True)  # type: ignore[assignment]
    activity: Dict[str, float] = RF.sparse_activity(state, k)
    decomposed: RF.PAPState = RF.pap_decompose(k, v, n_iter=3)
    sym: Tensor = RF.symmetric_attention(k, v, is_causal=True)
    asym: Tensor = RF.attention(torch.randn(2, 3, 17, 8), k, v)
    level: float = RF.check_key_control("clip")
    no_level: None = RF.check_key_control(None)
    clipped: Tensor = RF.controlled_symmetric_attention(k, v, "clip", level)
    mask: Optional[Tensor] = RF.as_bool_mask(torch.zeros(17, 17))
    prefill_out, prefill_state, cache = RF.pap_prefill(k, v, n_iter=3)
    cache_bytes: int = cache.nbytes()
    del activity, cache_bytes, no_level, mask, prefill_state, wrong
    assert prefill_out is not None
    return [out, out_state[0], out2, sparse, plain, decomposed.sparse, sym, asym, clipped, prefill_out,
            rpc_attention.symmetric_attention(k, v)]


def layers() -> Tensor:
    x = torch.randn(2, 17, 24)
    rpc = RPCAttention(dim=24, num_heads=3, qkv_bias=True, n_iter=4, lambd=4.0)
    sym = SymmetricAttention(24, 3)
    scaled = rpc_attention.ScaledAttention(24, 3, mode="alpha")
    module: nn.Module = rpc
    y: Tensor = rpc(x) + sym(x) + scaled(x) + rpc_attention.nn.Attention(24, 3)(x)
    del module
    return y


def models() -> nn.Module:
    require("my tool", "timm")  # MissingExtraError (a ModuleNotFoundError) naming `pip install rpc-attention[timm]`
    import rpc_attention.models as models
    from rpc_attention.models.factory import create_model

    names: List[str] = list(models.MODEL_NAMES)
    model: nn.Module = create_model("rpc_symvit_tiny_patch16_224", num_classes=10, img_size=28, patch_size=7,
                                    in_chans=1, rpc_layers=[0], n_iter=6)
    vit = models.SymViT(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=24, depth=1, num_heads=3)
    sym: nn.Module = vit
    del names, sym
    return model


def extras() -> str:
    try:
        timm = import_optional("timm", "my tool")
    except MissingExtraError as err:
        return str(err)
    command: str = install_command("timm")
    known: bool = "timm" in EXTRAS
    del known
    return f"{timm.__name__}: {command}"
