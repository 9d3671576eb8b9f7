"""FAN, SymFAN and RPC-FAN: Fully Attentional Networks as timm models.

FAN (Zhou et al., ICML 2022, "Understanding the Robustness in Vision Transformers") is a ViT built
for robustness to corruptions. Each block mixes tokens with self-attention and then mixes channels
with *channel attention* in place of the ViT MLP; a convolutional stem embeds the patches, a Fourier
feature map gives the positions, and two CaiT-style class-attention blocks pool into a class token.

=====================================  ==========================================================
``fan_{tiny,small}_12_p16_224``        asymmetric token mixing (:class:`~rpc_attention.nn.Attention`)
``symfan_{tiny,small}_12_p16_224``     symmetric token mixing (:class:`~rpc_attention.nn.SymmetricAttention`)
``rpc_fan_{tiny,small}_12_p16_224``    PAP (:class:`~rpc_attention.nn.RPCAttention`) in block 0,
                                       4 softmax evaluations, lambda 4 (the RPC paper's "4iter/layer1")
=====================================  ==========================================================

Sizes: tiny 192 wide / 12 blocks / 4 heads, small 384 / 12 / 8; patch 16 (a stack of stride-2 3x3
conv + BatchNorm layers: four for patch 16, three for 8, two for 4), 224x224, LayerNorm eps 1e-6,
qkv bias, layer scale initialised to 1, two class-attention blocks. Every option can be overridden
through ``timm.create_model(name, **kwargs)`` (``num_classes, img_size, patch_size, in_chans,
embed_dim, depth, num_heads, drop_path_rate, ...``); the symmetric and RPC models also take
``rpc_layers`` and the PAP options ``n_iter, lambd, threshold, mu_mode, model_dim, tol, lowrank, shrink,
dual_step``.

The symmetric models follow the RPC authors' FAN code: the token mixing has one ``kv`` projection
(keys serve as queries) and the class attention uses the projected class-token *key* as its query.

State dicts use the authors' parameter names and shapes (``blocks.i.attn.q`` / ``attn.kv`` for the
token mixing, ``blocks.i.mlp.*`` for the channel attention, ``cls_attn_blocks.*``,
``pos_embed.token_projection``, ...), so their checkpoints load with one call to
:func:`load_fan_checkpoint`. Internally the token mixing is our own attention module with a fused
``qkv`` projection; state-dict hooks on :class:`FANBlock` translate between the two layouts.
"""

import math
from functools import partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from timm.layers import DropPath, Mlp, to_2tuple, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .. import functional as RF
from .. import nn as rnn
from ..nn import Attention, RPCAttention, SymmetricAttention, parse_layers
from .factory import build_timm_model, feature_take_indices
from .vision import read_checkpoint, unwrap_state_dict

__all__ = ["FAN", "FANBlock", "ChannelAttention", "ClassAttention", "SymmetricClassAttention",
           "ClassAttentionBlock", "FAN_MODEL_NAMES",
           "TOKEN_MIXING_TYPES", "load_fan_checkpoint", "checkpoint_filter_fn"]

TOKEN_MIXING_TYPES = ("attn", "sym")

FAN_MODEL_NAMES = (
    "fan_tiny_12_p16_224", "fan_small_12_p16_224",
    "symfan_tiny_12_p16_224", "symfan_small_12_p16_224",
    "rpc_fan_tiny_12_p16_224", "rpc_fan_small_12_p16_224",
)


# ------------------------------------------------------------------------------------------ stem
class ConvPatchEmbed(nn.Module):
    """Patch embedding by stride-2 3x3 conv + BatchNorm layers with GELU between them.

    ``log2(patch_size)`` layers (patch 16: widths C/8, C/4, C/2, C; patch 8: C/4, C/2, C; patch 4:
    C/4, C). ``proj`` is a Sequential ``[conv-bn, act, conv-bn, act, ..., conv-bn]`` as in the
    authors' layout (``proj.0.0.weight`` is the first conv, ``proj.0.1`` its BatchNorm).
    """

    _WIDTHS = {16: (8, 4, 2, 1), 8: (4, 2, 1), 4: (4, 1)}

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, patch_size: int = 16, in_chans: int = 3,
                 embed_dim: int = 768, act_layer: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        if patch_size not in self._WIDTHS:
            raise ValueError(f"FAN's convolutional patch embedding supports patch_size 4, 8 or 16, got {patch_size}")
        divisors = self._WIDTHS[patch_size]
        if embed_dim % divisors[0]:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by {divisors[0]} for patch_size {patch_size}")
        self.img_size = to_2tuple(img_size)
        self.patch_size = patch_size
        self.grid_size = tuple(math.ceil(s / patch_size) for s in self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        layers: List[nn.Module] = []
        in_ch = in_chans
        for i, div in enumerate(divisors):
            out_ch = embed_dim // div
            if i:
                layers.append(act_layer())
            layers.append(nn.Sequential(nn.Conv2d(in_ch, out_ch, 3, stride=2, padding=1, bias=False),
                                        nn.BatchNorm2d(out_ch)))
            in_ch = out_ch
        self.proj = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tuple[Tensor, int, int]:
        x = self.proj(x)
        height, width = x.shape[2], x.shape[3]
        return x.flatten(2).transpose(1, 2), height, width


class FourierPositionalEncoding(nn.Module):
    """Sine/cosine features of the normalised (row, column) position, projected to the model width.

    Each coordinate runs over ``1..H`` (``1..W``), is scaled to ``(0, 2 pi]`` and expanded into
    ``hidden_dim`` frequencies ``temperature^(2 floor(i/2) / hidden_dim)`` (sin on even, cos on odd
    channels); the 2 x hidden_dim features go through a 1x1 conv (``token_projection``). Works at
    any grid size (no learned table).
    """

    def __init__(self, hidden_dim: int = 32, dim: int = 768, temperature: float = 10000.0) -> None:
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.hidden_dim = hidden_dim
        self.temperature = temperature
        self.eps = 1e-6

    def _features(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(n, hidden_dim) features of positions 1..n."""
        pos = torch.arange(1, n + 1, dtype=dtype, device=device)
        pos = pos / (pos[-1:] + self.eps) * (2 * math.pi)
        i = torch.arange(self.hidden_dim, dtype=dtype, device=device)
        freq = self.temperature ** (2 * torch.div(i, 2, rounding_mode="floor") / self.hidden_dim)
        angle = pos[:, None] / freq
        # interleave sin(even channels) and cos(odd channels): [sin0, cos1, sin2, cos3, ...]
        return torch.stack([angle[:, 0::2].sin(), angle[:, 1::2].cos()], dim=-1).flatten(1)

    def forward(self, height: int, width: int) -> Tensor:
        """Positions of an ``height x width`` grid as ``(1, height * width, dim)`` tokens."""
        weight = self.token_projection.weight
        dtype = torch.promote_types(weight.dtype, torch.float32)
        rows = self._features(height, dtype, weight.device)   # (H, hidden)
        cols = self._features(width, dtype, weight.device)    # (W, hidden)
        feats = torch.cat([rows[:, None, :].expand(-1, width, -1), cols[None, :, :].expand(height, -1, -1)], -1)
        feats = feats.permute(2, 0, 1).unsqueeze(0).to(weight.dtype)  # (1, 2 hidden, H, W)
        return self.token_projection(feats).flatten(2).transpose(1, 2)


# ------------------------------------------------------------------------------ channel attention
class DepthwiseConvMixer(nn.Module):
    """Two depthwise 3x3 convs (GELU and BatchNorm between) on the token grid; ``(B, N, C)`` in and out."""

    def __init__(self, dim: int, act_layer: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.act = act_layer()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        b, n, c = x.shape
        x = x.transpose(1, 2).reshape(b, c, height, width)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(b, c, n).transpose(1, 2)


class ConvMlp(nn.Module):
    """FAN's value MLP: ``fc2(h + gamma * dwconv(h))`` with ``h = fc1(x)``.

    As in the authors' code there is no activation besides the GELU inside the depthwise mixer.
    """

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.dwconv = DepthwiseConvMixer(hidden_features)
        self.gamma = nn.Parameter(torch.ones(hidden_features))
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        x = self.fc1(x)
        x = self.drop(self.gamma * self.dwconv(x, height, width)) + x
        return self.drop(self.fc2(x))


class ChannelAttention(nn.Module):
    """FAN's channel processing (the block's MLP): per-channel sigmoid gates times an MLP of the tokens.

    Per head (``d = C / heads`` channels): ``q = softmax_N(W_q x)`` and ``k = softmax_N(x)`` are
    token distributions per channel; the gate of channel ``c`` is ``sigmoid(sum_n q[n, c] mean_c' k[n, c'])``
    times a learnable per-head ``temperature``. The output is ``LayerNorm(ConvMlp(x))`` scaled
    channel-wise by the gates. ``norm_v`` is a default ``nn.LayerNorm`` (eps 1e-5) as in the authors' code.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 mlp_hidden_dim: Optional[int] = None, drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim = dim
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.mlp_v = ConvMlp(dim, mlp_hidden_dim or dim, drop=drop)
        self.norm_v = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        b, n, c = x.shape
        h = self.num_heads
        q = self.q(x).reshape(b, n, h, c // h).permute(0, 2, 3, 1).softmax(-1)      # (B, h, d, N)
        k = x.reshape(b, n, h, c // h).transpose(1, 2).softmax(-2).mean(-1, keepdim=True)  # (B, h, N, 1)
        gates = self.attn_drop(torch.sigmoid(q @ k) * self.temperature)              # (B, h, d, 1)
        v = self.norm_v(self.mlp_v(x, height, width)).reshape(b, n, h, c // h)
        return (v * gates.reshape(b, 1, h, c // h)).reshape(b, n, c)


# ------------------------------------------------------------------------------------ FAN block
class FANBlock(nn.Module):
    """Pre-LN block: ``x + gamma1 * attn(norm1(x))``, then ``x + gamma2 * mlp(norm2(x))`` (channel attention).

    ``attn`` is the given :mod:`rpc_attention.nn` module (its fused ``qkv``); the block's state-dict
    hooks expose it under the authors' names: ``attn.q`` + ``attn.kv`` (asymmetric, ``qkv`` split
    ``[C; 2C]``) or ``attn.kv`` (symmetric, ``qkv`` is already keys-then-values ``[2C, C]``).
    """

    def __init__(self, dim: int, num_heads: int, attn: nn.Module, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, eta: float = 1.0,
                 norm_layer: Callable[[int], nn.Module] = partial(nn.LayerNorm, eps=1e-6)) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = ChannelAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                    mlp_hidden_dim=int(dim * mlp_ratio), drop=drop)
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))
        self.register_state_dict_post_hook(_qkv_to_authors_names)
        self.register_load_state_dict_pre_hook(_authors_names_to_qkv)

    def forward(self, x: Tensor, height: int, width: int) -> Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x), height, width))


def _symmetric_mixing(block: nn.Module) -> bool:
    return getattr(block.attn, "n_proj", 3) == 2


def _qkv_to_authors_names(block: nn.Module, state_dict: Dict[str, Tensor], prefix: str, local_metadata) -> None:
    """state_dict() hook: ``attn.qkv.*`` -> ``attn.kv.*`` (symmetric) or ``attn.q.*`` + ``attn.kv.*``."""
    for kind in ("weight", "bias"):
        t = state_dict.pop(f"{prefix}attn.qkv.{kind}", None)
        if t is None:
            continue
        if _symmetric_mixing(block):
            state_dict[f"{prefix}attn.kv.{kind}"] = t
        else:  # slices are views, so in-place updates of the state dict (EMA) reach the parameter
            c = t.shape[0] // 3
            state_dict[f"{prefix}attn.q.{kind}"] = t[:c]
            state_dict[f"{prefix}attn.kv.{kind}"] = t[c:]


def _authors_names_to_qkv(block: nn.Module, state_dict: Dict[str, Tensor], prefix: str, local_metadata,
                          strict, missing_keys, unexpected_keys, error_msgs) -> None:
    """load_state_dict() pre-hook: the inverse of :func:`_qkv_to_authors_names` (``qkv`` keys pass through)."""
    symmetric = _symmetric_mixing(block)
    for kind in ("weight", "bias"):
        kv = state_dict.pop(f"{prefix}attn.kv.{kind}", None)
        q = state_dict.pop(f"{prefix}attn.q.{kind}", None)
        if kv is None and q is None:
            continue
        if symmetric and q is not None:
            error_msgs.append(
                f"{prefix}attn.q.{kind}: the checkpoint has query weights (asymmetric FAN) but this model's token "
                f"mixing is symmetric; load it into fan_* (token_mixing='attn') instead")
        elif not symmetric and (q is None or kv is None):
            error_msgs.append(
                f"{prefix}attn: the checkpoint has {'kv' if q is None else 'q'} but no "
                f"{'q' if q is None else 'kv'} {kind} (a symmetric FAN checkpoint?); load it into "
                f"symfan_* / rpc_fan_* (token_mixing='sym') instead")
        elif symmetric:
            assert kv is not None  # kv alone: neither is skipped above
            state_dict[f"{prefix}attn.qkv.{kind}"] = kv
        else:
            assert q is not None and kv is not None
            state_dict[f"{prefix}attn.qkv.{kind}"] = torch.cat([q, kv], 0)


# --------------------------------------------------------------------------- class attention
class ClassAttention(nn.Module):
    """Attention of the class token (token 0) over all tokens; returns the new class token ``(B, 1, C)``.

    Asymmetric (NVlabs FAN, CaiT): ``q`` projects the class token, ``k`` and ``v`` every token.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, fused_attn: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _query(self, cls: Tensor) -> Tensor:
        return self.q(cls)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q = self._query(x[:, :1]).reshape(b, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        dropout_p = self.attn_drop.p if self.training else 0.0
        out = rnn.softmax_attention(q, k, v, None, False, dropout_p, self.scale, self.fused_attn)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, 1, c)))


class SymmetricClassAttention(ClassAttention):
    """Class attention without a query projection (the RPC authors' FAN): the class token's key is its query."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, fused_attn: bool = True) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, fused_attn)
        del self.q

    def _query(self, cls: Tensor) -> Tensor:
        return self.k(cls)


class ClassAttentionBlock(nn.Module):
    """FAN's class-attention block (CaiT-style), exactly as the authors' forward computes it.

    With ``xn = norm1(x)``: ``x = x + gamma1 * [attn(xn); xn[1:]]`` (the patch tokens get their own
    normalised values added), then ``x = norm2(x)`` (all tokens when ``tokens_norm``, else only the
    class token), then ``x = x + [gamma2 * mlp(x[0]); x[1:]]`` (so the patch tokens are doubled).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 attn_drop: float = 0.0, eta: Optional[float] = 1.0, tokens_norm: bool = True,
                 symmetric: bool = False, norm_layer: Callable[[int], nn.Module] = partial(nn.LayerNorm, eps=1e-6),
                 act_layer: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        attn_cls = SymmetricClassAttention if symmetric else ClassAttention
        self.attn = attn_cls(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.norm2 = norm_layer(dim)
        # timm annotates act_layer as a class; any callable returning the activation is what it calls
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer,  # type: ignore[arg-type]
                       drop=drop)
        eta = 1.0 if eta is None else eta
        self.gamma1 = nn.Parameter(eta * torch.ones(dim))
        self.gamma2 = nn.Parameter(eta * torch.ones(dim))
        self.tokens_norm = tokens_norm

    def forward(self, x: Tensor) -> Tensor:
        xn = self.norm1(x)
        x = x + self.gamma1 * torch.cat([self.attn(xn), xn[:, 1:]], dim=1)
        if self.tokens_norm:
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        return x + torch.cat([self.gamma2 * self.mlp(x[:, :1]), x[:, 1:]], dim=1)


# ------------------------------------------------------------------------------------------ model
def _pap_settings(token_mixing: str, rpc_layers: Union[None, str, int, Iterable[int]], depth: int,
                  **pap: Any) -> Tuple[List[int], Dict[str, Any]]:
    """Validate the token-mixing choice and the PAP options; returns the PAP blocks and options."""
    if token_mixing not in TOKEN_MIXING_TYPES:
        raise ValueError(f"token_mixing must be one of {TOKEN_MIXING_TYPES}, got {token_mixing!r}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    layers = parse_layers(rpc_layers, depth)
    if layers and token_mixing != "sym":
        raise ValueError(f"rpc_layers needs symmetric token mixing (token_mixing='sym'), "
                         f"got token_mixing={token_mixing!r}; use symfan_* / rpc_fan_* models")
    if isinstance(pap["n_iter"], float) and float(pap["n_iter"]).is_integer():
        pap["n_iter"] = int(pap["n_iter"])
    RF.check_pap_options(**pap)
    pap["lambd"] = float(pap["lambd"])
    return layers, pap


def _token_mixer(token_mixing: str, pap_layer: bool, pap: Dict[str, Any], attn_kwargs: Dict[str, Any]) -> nn.Module:
    """A FAN block's token mixer: asymmetric attention (``"attn"``), else symmetric attention, PAP in the
    blocks ``rpc_layers`` names."""
    if token_mixing == "attn":
        return Attention(**attn_kwargs)
    return RPCAttention(**attn_kwargs, **pap) if pap_layer else SymmetricAttention(**attn_kwargs)


class FAN(nn.Module):
    """Fully Attentional Network (FAN-ViT) with :mod:`rpc_attention.nn` token mixing.

    Args:
        img_size, patch_size (4, 8 or 16), in_chans, num_classes, embed_dim, depth, num_heads,
        mlp_ratio, qkv_bias: as in a timm ViT.
        global_pool: ``"token"`` (the class token, default), ``"avg"`` (mean of the patch tokens) or ``""``.
        token_mixing: ``"attn"`` (asymmetric, NVlabs FAN) or ``"sym"`` (symmetric: keys serve as queries,
            also in the class attention, as in the RPC authors' FAN).
        rpc_layers: blocks whose token mixing runs PAP (``"all"``, an index or a list; ``token_mixing="sym"`` only).
        n_iter, lambd, threshold, mu_mode, model_dim, tol, lowrank, shrink, dual_step: PAP options of
            those blocks (see :func:`rpc_attention.functional.pap_attention`).
        drop_rate: dropout after the positions, the projections and the MLPs (the authors' ``drop``).
        attn_drop_rate: attention dropout. drop_path_rate: stochastic depth, the same rate in every
            block (the authors' choice, not a linear ramp).
        cls_attn_layers: class-attention blocks (2). eta: layer-scale init (1.0). tokens_norm: see
            :class:`ClassAttentionBlock` (True in every released model).
        use_pos_embed: add the Fourier positions. fused_attn: SDPA kernels (else explicit softmax).

    ``model.rpc_cfg`` (also in ``model.pretrained_cfg["rpc_cfg"]``) records the token mixing and PAP settings.
    """

    def __init__(
        self,
        img_size: Union[int, Tuple[int, int]] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        token_mixing: str = "attn",
        rpc_layers: Union[None, str, int, Iterable[int]] = None,
        # PAP options, typed and documented here; functional.check_pap_options is their one validator
        n_iter: int = 4, lambd: float = 4.0, threshold: str = "lambda_mu", mu_mode: Optional[str] = None,
        model_dim: Optional[int] = None, tol: Optional[float] = None,
        lowrank: str = "values", shrink: str = "soft", dual_step: float = 1.0,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        cls_attn_layers: int = 2,
        eta: float = 1.0,
        tokens_norm: bool = True,
        use_pos_embed: bool = True,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if global_pool not in ("", "token", "avg"):
            raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
        layers, pap = _pap_settings(token_mixing, rpc_layers, depth, n_iter=n_iter, lambd=lambd,
                                    threshold=threshold, mu_mode=mu_mode, model_dim=model_dim, tol=tol,
                                    lowrank=lowrank, shrink=shrink, dual_step=dual_step)
        self.num_classes, self.global_pool = num_classes, global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens, self.grad_checkpointing = 1, False
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.patch_embed = ConvPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.pos_embed = FourierPositionalEncoding(dim=embed_dim) if use_pos_embed else None
        self.pos_drop = nn.Dropout(drop_rate)
        attn_kwargs = dict(dim=embed_dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop_rate,
                           proj_drop=drop_rate, fused_attn=fused_attn)
        self.blocks = nn.ModuleList([
            FANBlock(embed_dim, num_heads, _token_mixer(token_mixing, i in layers, pap, attn_kwargs),
                     mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop=drop_rate, attn_drop=attn_drop_rate,
                     drop_path=drop_path_rate, eta=eta, norm_layer=norm_layer)
            for i in range(depth)])
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self.cls_token: Optional[nn.Parameter] = nn.Parameter(torch.zeros(1, 1, embed_dim))  # None once pruned
        cls_block = partial(ClassAttentionBlock, embed_dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                            drop=drop_rate, attn_drop=attn_drop_rate, eta=eta, tokens_norm=tokens_norm,
                            symmetric=token_mixing == "sym", norm_layer=norm_layer)
        self.cls_attn_blocks = nn.ModuleList([cls_block() for _ in range(cls_attn_layers)])
        self.norm: nn.Module = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.rpc_cfg: Dict[str, Any] = {"token_mixing": token_mixing, "rpc_layers": layers,
                                        **(dict(pap, model_dim=model_dim or embed_dim) if layers else {})}
        self._init_weights()

    def _init_weights(self) -> None:
        """The authors' init: linear weights trunc-normal(0.02) with zero bias, LayerNorm (1, 0), the
        depthwise convs of the channel MLP normal(0, sqrt(2 / fan_out)), class token trunc-normal(0.02);
        the stem and position convs keep PyTorch's default."""
        trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, DepthwiseConvMixer):
                for conv in (m.conv1, m.conv2):
                    fan_out = conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels // conv.groups
                    nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / fan_out))
                    if conv.bias is not None:
                        nn.init.zeros_(conv.bias)

    # ---------------------------------------------------------------------------- timm API
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r"^cls_token|^pos_embed|^patch_embed",
                    blocks=[(r"^blocks\.(\d+)", None), (r"^cls_attn_blocks\.(\d+)", (99999,)), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            if global_pool not in ("", "token", "avg"):
                raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
            self.global_pool = global_pool
        self.num_classes = num_classes
        ref = self.norm.weight if isinstance(self.norm, nn.LayerNorm) else self.cls_token
        self.head = (nn.Linear(self.num_features, num_classes, device=getattr(ref, "device", None),
                               dtype=getattr(ref, "dtype", None)) if num_classes > 0 else nn.Identity())

    # ---------------------------------------------------------------------------- forward
    def _embed(self, x: Tensor) -> Tuple[Tensor, int, int]:
        x, height, width = self.patch_embed(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed(height, width)
        return self.pos_drop(x), height, width

    def forward_cls(self, x: Tensor) -> Tensor:
        """Prepend the class token and run the class-attention blocks."""
        cls_token = self.cls_token
        assert cls_token is not None  # called only while the model has its class token (not pruned)
        x = torch.cat([cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        return x

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, C_in, H, W)`` to normalised tokens ``(B, 1 + N, C)`` (class token first)."""
        x, height, width = self._embed(x)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, height, width, use_reentrant=False)
            else:
                x = blk(x, height, width)
        if self.cls_token is not None:
            x = self.forward_cls(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens:].mean(dim=1)
        elif self.global_pool == "token":
            x = x[:, 0]
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """Outputs of the FAN blocks ``indices`` (last n if int, all if None) as NCHW maps or NLC tokens.

        ``norm`` applies the final norm to each; unless ``intermediates_only``, also returns the final
        features (class-attention blocks and norm applied) as :meth:`forward_features` does.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, height, width = self._embed(x)
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x, height, width, use_reentrant=False)
            else:
                x = blk(x, height, width)
            if i in take_indices:
                y = self.norm(x) if norm else x
                if output_fmt == "NCHW":
                    y = y.reshape(y.shape[0], height, width, -1).permute(0, 3, 1, 2).contiguous()
                intermediates.append(y)
        if intermediates_only:
            return intermediates
        if self.cls_token is not None:
            x = self.forward_cls(x)
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last wanted index (and the norm / class attention / head)."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.cls_attn_blocks = nn.ModuleList()
            self.cls_token = None
            self.num_prefix_tokens = 0
            self.reset_classifier(0, "")
        return take_indices

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.rpc_cfg.items())


# -------------------------------------------------------------------------------- timm plumbing
def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 1.0, "interpolation": "bicubic", "fixed_input_size": False,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj.0.0", "classifier": "head", **kwargs,
    }


default_cfgs = generate_default_cfgs({name: _cfg() for name in FAN_MODEL_NAMES})


def checkpoint_filter_fn(state_dict: Dict[str, Tensor], model: Optional[nn.Module] = None) -> Dict[str, Tensor]:
    """Rename older FAN checkpoint keys to the current layout: ``pos_embeder.`` -> ``pos_embed.``, and a
    fused class-attention ``qkv`` split into ``q``/``k``/``v`` (``k``/``v`` only for symmetric models)."""
    out: Dict[str, Tensor] = {}
    fan: Any = model  # a FAN (or None): rpc_cfg is read by name
    symmetric = fan is not None and fan.rpc_cfg["token_mixing"] == "sym"
    for key, value in unwrap_state_dict(state_dict).items():
        key = key.replace("pos_embeder.", "pos_embed.")
        if key.startswith("cls_attn_blocks.") and ".attn.qkv." in key:
            head, kind = key.split(".attn.qkv.")
            parts = value.reshape(3, -1, *value.shape[1:]).unbind(0)
            for name, part in zip("qkv", parts):
                if not (symmetric and name == "q"):
                    out[f"{head}.attn.{name}.{kind}"] = part
            continue
        out[key] = value
    return out


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build through timm's factory: ``features_only``, ``pretrained_cfg_overlay`` and ``pretrained=True``
    with a local file (``pretrained_cfg_overlay=dict(file=...)``, read by :func:`checkpoint_filter_fn`)."""
    return build_timm_model(FAN, variant, pretrained, cfg_attrs=("rpc_cfg",),
                            pretrained_filter_fn=checkpoint_filter_fn, **kwargs)


_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=4)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, num_heads=8)
_RPC = dict(token_mixing="sym", rpc_layers=[0], n_iter=4, lambd=4.0)


# timm entry points: one small function per registered name, as in timm.
@register_model
def fan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """FAN-tiny (NVlabs FAN-T-ViT): 192 wide, 12 blocks, 4 heads, asymmetric token mixing."""
    return _create("fan_tiny_12_p16_224", pretrained, **{**_TINY, "token_mixing": "attn", **kwargs})


@register_model
def fan_small_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """FAN-small (NVlabs FAN-S-ViT): 384 wide, 12 blocks, 8 heads, asymmetric token mixing."""
    return _create("fan_small_12_p16_224", pretrained, **{**_SMALL, "token_mixing": "attn", **kwargs})


@register_model
def symfan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """SymFAN-tiny: FAN-tiny with symmetric token mixing and class attention (the RPC paper's FAN baseline)."""
    return _create("symfan_tiny_12_p16_224", pretrained, **{**_TINY, "token_mixing": "sym", **kwargs})


@register_model
def symfan_small_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """SymFAN-small: FAN-small with symmetric token mixing and class attention."""
    return _create("symfan_small_12_p16_224", pretrained, **{**_SMALL, "token_mixing": "sym", **kwargs})


@register_model
def rpc_fan_tiny_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """RPC-FAN-tiny: SymFAN-tiny with PAP in block 0, 4 softmax evaluations, lambda 4 ("4iter/layer1")."""
    return _create("rpc_fan_tiny_12_p16_224", pretrained, **{**_TINY, **_RPC, **kwargs})


@register_model
def rpc_fan_small_12_p16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """RPC-FAN-small: SymFAN-small with PAP in block 0, 4 softmax evaluations, lambda 4."""
    return _create("rpc_fan_small_12_p16_224", pretrained, **{**_SMALL, **_RPC, **kwargs})


# ------------------------------------------------------------------------------ authors' checkpoints
def load_fan_checkpoint(model: FAN, checkpoint: Union[str, Dict[str, Any]], strict: bool = True,
                        prefer_ema: bool = False):
    """Load an authors' FAN / symmetric FAN / RPC-FAN checkpoint (NVlabs/FAN or rachtsy/FAN) into ``model``.

    Accepts a path (``.pth``, ``.pth.tar``, ``.safetensors``) or a (wrapped) state dict: unwraps
    ``{"state_dict": ...}`` / ``{"model": ...}`` (``prefer_ema``: the EMA weights when present),
    strips ``module.``, renames older keys (:func:`checkpoint_filter_fn`). A checkpoint with query
    weights cannot load into a symmetric model (and vice versa): the error names the right family.
    Returns the ``load_state_dict`` result.
    """
    if not isinstance(model, FAN):
        raise ValueError(f"load_fan_checkpoint needs a FAN model (fan_*, symfan_*, rpc_fan_*), got {type(model).__name__}")
    if isinstance(checkpoint, dict):
        sd = unwrap_state_dict(checkpoint, prefer_ema)
    else:
        sd = read_checkpoint(checkpoint, prefer_ema)
    sd = checkpoint_filter_fn(sd, model)
    own = model.state_dict()
    for k, v in sd.items():
        if k in own and own[k].shape != v.shape:
            raise ValueError(f"checkpoint tensor {k} has shape {tuple(v.shape)}, the model expects "
                             f"{tuple(own[k].shape)} (check embed_dim / num_heads / num_classes / patch_size)")
    return model.load_state_dict(sd, strict=strict)
