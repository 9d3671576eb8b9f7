"""SymViT, RPC-SymViT and Scaled-Attention ViTs as timm models.

All models are timm :class:`~timm.models.vision_transformer.VisionTransformer` instances (subclass
:class:`SymViT`) whose blocks carry an :mod:`rpc_attention.nn` attention module at ``blocks[i].attn``:

=====================================  ==========================================================
``symvit_{tiny,small,base}_patch16_224``      :class:`~rpc_attention.nn.SymmetricAttention` everywhere
``rpc_symvit_tiny_patch16_224``               PAP (:class:`~rpc_attention.nn.RPCAttention`) in block 0, 6 iterations
``rpc_symvit_{small,base}_patch16_224``       PAP in every block, 2 iterations
``scaled_vit_tiny_patch16_224``               :class:`~rpc_attention.nn.ScaledAttention` mode ``"s"``
``scaled_alpha_vit_tiny_patch16_224``         :class:`~rpc_attention.nn.ScaledAttention` mode ``"alpha"``
=====================================  ==========================================================

Sizes: tiny 192 wide / 12 blocks / 3 heads, small 384/12/6, base 768/12/12; patch 16, 224x224, CLS
token, pre-LN (LayerNorm eps 1e-6), GELU MLP ratio 4, qkv bias, stochastic depth. Every option can be
overridden through ``timm.create_model(name, **kwargs)``: ``num_classes, img_size, patch_size,
in_chans, embed_dim, depth, num_heads, drop_path_rate, ...`` and the RPC options ``rpc_layers``
(``"all"``, a block index or a list of them; block 0 is the paper's "layer1"), ``n_iter``, ``lambd``,
``threshold``, ``mu_mode``, ``model_dim``, ``tol``. Weight init is timm's ViT init.

State dicts have exactly the official SymViT / RPC-SymViT layout (timm ViT names; symmetric ``qkv`` is
``[2C, C]`` keys-then-values). The official sizes are not always ours (the official ``deit_small`` is 348
wide): :func:`load_official_checkpoint` builds the model that fits a checkpoint's tensors and loads it.
Through timm, ``pretrained=True, pretrained_cfg_overlay=dict(file=path)`` loads local weights into the
named model; ``features_only``, FX tracing and ``torch.jit.script`` work as for timm's own ViTs
(:mod:`rpc_attention.models.factory`).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Dict, Iterable, List, Optional, Union

import torch
from timm.layers import to_2tuple
from timm.models import generate_default_cfgs, register_model
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from .. import functional as RF
from ..nn import Attention, RPCAttention, ScaledAttention, SymmetricAttention, parse_layers
from .factory import build_timm_model

__all__ = ["SymViT", "SymViTBlock", "MODEL_NAMES", "OFFICIAL_HEADS_BY_WIDTH", "resolve_rpc_layers", "load_official_checkpoint",
           "checkpoint_model_kwargs", "read_checkpoint", "unwrap_state_dict"]

ATTENTION_TYPES = ("sym", "attn", "scaled_s", "scaled_alpha")

MODEL_NAMES = (
    "symvit_tiny_patch16_224", "symvit_small_patch16_224", "symvit_base_patch16_224",
    "rpc_symvit_tiny_patch16_224", "rpc_symvit_small_patch16_224", "rpc_symvit_base_patch16_224",
    "scaled_vit_tiny_patch16_224", "scaled_alpha_vit_tiny_patch16_224",
)


def resolve_rpc_layers(rpc_layers: Union[None, str, int, Iterable[int]], depth: int) -> List[int]:
    """Normalise ``rpc_layers`` to a sorted list of block indices (:func:`rpc_attention.nn.parse_layers`)."""
    return parse_layers(rpc_layers, depth)


class _NoAttention(nn.Module):
    """Placeholder passed to timm's Block; replaced right away by the real attention module."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()


class SymViTBlock(Block):
    """timm's pre-LN ViT block whose attention is built by ``attn_factory(block_index, dim, ...)``."""

    def __init__(self, dim: int, num_heads: int, *, attn_factory, depth: int = 0, qkv_bias: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, attn_layer=None, device=None, dtype=None,
                 **kwargs) -> None:
        # attn_layer: timm's VisionTransformer passes one to every block; ``attn_factory`` replaces it
        super().__init__(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop,
                         attn_layer=_NoAttention, depth=depth, device=device, dtype=dtype, **kwargs)
        self.attn = attn_factory(depth, dim=dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop,
                                 proj_drop=proj_drop, device=device, dtype=dtype)


def _scaled_s_tokens(kwargs: Dict[str, Any]) -> int:
    """The fixed token count N of ``scaled_s`` attention (its N x N weight), from the ViT's keyword arguments."""
    if kwargs.get("dynamic_img_size"):
        raise ValueError("scaled_s attention has a fixed N x N matrix and cannot use dynamic_img_size")
    img = to_2tuple(kwargs.get("img_size", 224))
    patch = to_2tuple(kwargs.get("patch_size", 16))
    if img[0] % patch[0] or img[1] % patch[1]:
        raise ValueError(f"img_size {img} must be divisible by patch_size {patch} for scaled_s attention")
    prefix = (1 if kwargs.get("class_token", True) else 0) + int(kwargs.get("reg_tokens", 0))
    return (img[0] // patch[0]) * (img[1] // patch[1]) + prefix


def _key_control(attention: str, rpc_layers: List[int], depth: int, control: Optional[str],
                 level: Optional[float], layers: Union[None, str, int, Iterable[int]]) -> Dict[str, Any]:
    """The checked key-control settings of a SymViT (empty without a control): one ValueError naming the
    bad combination (a level or blocks without a control, a control outside symmetric attention or on a
    PAP block)."""
    level = RF.check_key_control(control, level)
    if control is None:
        if layers is not None:
            raise ValueError(f"key_control_layers={layers!r} needs key_control (clip or drop)")
        return {}
    if attention != "sym":
        raise ValueError(f"key_control needs symmetric attention (attention='sym'), got attention={attention!r}")
    chosen = parse_layers(0 if layers is None else layers, depth, name="key_control_layers")
    if not chosen:
        raise ValueError(f"key_control={control!r} with key_control_layers={layers!r}: name at least one block")
    both = sorted(set(chosen) & set(rpc_layers))
    if both:
        raise ValueError(f"key_control_layers and rpc_layers both name block(s) {both}: a key control is for "
                         "symmetric blocks (PAP cleans its keys itself)")
    return {"key_control": control, "key_control_level": level, "key_control_layers": chosen}


def _attention_factory(attention: str, rpc_set: set, pap: Dict[str, Any], control: Dict[str, Any],
                       num_tokens: Optional[int]):
    """``attn_factory(block_index, **attention keywords)`` of a SymViT: the attention module of each block."""

    def attn_factory(index: int, **akw):
        if attention == "attn":
            return Attention(**akw)
        if attention in ("scaled_s", "scaled_alpha"):
            return ScaledAttention(mode=attention.split("_", 1)[1], num_tokens=num_tokens, **akw)
        if index in rpc_set:
            return RPCAttention(**pap, **akw)
        if control and index in control["key_control_layers"]:
            return SymmetricAttention(key_control=control["key_control"],
                                      key_control_level=control["key_control_level"], **akw)
        return SymmetricAttention(**akw)

    return attn_factory


class SymViT(VisionTransformer):
    """A timm VisionTransformer with :mod:`rpc_attention.nn` attention in every block.

    Args (besides every :class:`VisionTransformer` argument):
        attention: ``"sym"`` (SymmetricAttention, RPC blocks possible), ``"attn"`` (plain asymmetric
            :class:`rpc_attention.nn.Attention`), ``"scaled_s"`` or ``"scaled_alpha"`` (ScaledAttention).
        rpc_layers: blocks running PAP (``"all"``, an index or a list; only with ``attention="sym"``).
        n_iter, lambd, threshold, mu_mode, model_dim, tol, lowrank, shrink, dual_step, row_lambd: PAP options of
            the RPC blocks (see :func:`rpc_attention.functional.pap_attention`).
        key_control: ``"clip"`` or ``"drop"``: a key control (:mod:`rpc_attention.functional.key_controls`)
            in the symmetric blocks ``key_control_layers`` (default block 0, where the RPC-SymViTs defend);
            ``key_control_level``: its level in robust deviations (default: the control's own). The controls
            have no parameters: a trained SymViT loads unchanged and runs with one.

    ``model.rpc_cfg`` (also stored in ``model.pretrained_cfg["rpc_cfg"]``) records the attention type,
    the PAP blocks and their settings; ``repr(model)`` shows them too.
    """

    def __init__(
        self,
        *,
        attention: str = "sym",
        rpc_layers: Union[None, str, int, Iterable[int]] = None,
        # PAP options, typed and documented here; functional.check_pap_options is their one validator
        n_iter: int = 6,
        lambd: float = 4.0,
        threshold: str = "lambda_mu",
        mu_mode: Optional[str] = None,
        model_dim: Optional[int] = None,
        tol: Optional[float] = None,
        lowrank: str = "values",
        shrink: str = "soft",
        dual_step: float = 1.0,
        row_lambd: Optional[float] = None,
        key_control: Optional[str] = None,
        key_control_level: Optional[float] = None,
        key_control_layers: Union[None, str, int, Iterable[int]] = None,
        **kwargs: Any,
    ) -> None:
        if attention not in ATTENTION_TYPES:
            raise ValueError(f"attention must be one of {ATTENTION_TYPES}, got {attention!r}")
        depth = int(kwargs.get("depth", 12))
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        layers = resolve_rpc_layers(rpc_layers, depth)
        if layers and attention != "sym":
            raise ValueError(f"rpc_layers needs symmetric attention (attention='sym'), got attention={attention!r}")
        if isinstance(n_iter, float) and float(n_iter).is_integer():
            n_iter = int(n_iter)
        RF.check_pap_options(n_iter=n_iter, lambd=lambd, threshold=threshold, mu_mode=mu_mode, tol=tol,
                             model_dim=model_dim, lowrank=lowrank, shrink=shrink, dual_step=dual_step,
                             row_lambd=row_lambd)
        for name in ("block_fn", "attn_layer"):
            if name in kwargs:
                raise ValueError(f"SymViT chooses its own {name}; use attention=/rpc_layers= instead")
        num_tokens = _scaled_s_tokens(kwargs) if attention == "scaled_s" else None
        control = _key_control(attention, layers, depth, key_control, key_control_level, key_control_layers)
        pap = {"n_iter": n_iter, "lambd": float(lambd), "threshold": threshold, "mu_mode": mu_mode,
               "model_dim": model_dim, "tol": tol, "lowrank": lowrank, "shrink": shrink, "dual_step": float(dual_step)}
        if row_lambd is not None:  # recorded only when set: rpc_cfg of earlier runs stays as it was
            pap["row_lambd"] = float(row_lambd)
        attn_factory = _attention_factory(attention, set(layers), pap, control, num_tokens)
        kwargs.setdefault("norm_layer", partial(nn.LayerNorm, eps=1e-6))
        # timm annotates block_fn as a class; any callable returning a block is what it calls
        super().__init__(block_fn=partial(SymViTBlock, attn_factory=attn_factory), **kwargs)  # type: ignore[arg-type]
        self.rpc_cfg: Dict[str, Any] = {
            "attention": attention,
            "rpc_layers": layers,
            **({k: v for k, v in pap.items()} if layers else {}),
        }
        if layers and pap["model_dim"] is None:
            self.rpc_cfg["model_dim"] = self.embed_dim
        self.rpc_cfg.update(control)  # recorded only when a control is on

    def extra_repr(self) -> str:
        if self.rpc_cfg["rpc_layers"]:
            opts = ", ".join(f"{k}={v!r}" for k, v in self.rpc_cfg.items() if k not in ("attention",))
            return f"attention={self.rpc_cfg['attention']!r}, PAP in {opts}"
        return f"attention={self.rpc_cfg['attention']!r}, rpc_layers=[]"


# -------------------------------------------------------------------------------------- timm plumbing
def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.875, "interpolation": "bicubic", "fixed_input_size": True,
        "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit", **kwargs,
    }


default_cfgs = generate_default_cfgs({name: _cfg() for name in MODEL_NAMES})


def _create(variant: str, pretrained: bool = False, **kwargs) -> nn.Module:
    return build_timm_model(SymViT, variant, pretrained, cfg_attrs=("rpc_cfg",),
                            pretrained_filter_fn=_checkpoint_filter, **kwargs)


_TINY = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
_SMALL = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
_BASE = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)


def _merge(defaults: dict, kwargs: dict) -> dict:
    return dict(defaults, **kwargs)


@register_model
def symvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """SymViT-tiny: DeiT-tiny (192/12/3) with symmetric attention in every block."""
    return _create("symvit_tiny_patch16_224", pretrained, **_merge(dict(_TINY, attention="sym"), kwargs))


@register_model
def symvit_small_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """SymViT-small: DeiT-small's 384/12/6 with symmetric attention.

    The official ``deit_small`` SymViT checkpoint is 348 wide (6 heads of 58): build that one with
    :func:`load_official_checkpoint` (or ``embed_dim=348``).
    """
    return _create("symvit_small_patch16_224", pretrained, **_merge(dict(_SMALL, attention="sym"), kwargs))


@register_model
def symvit_base_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """SymViT-base: 768/12/12 with symmetric attention in every block."""
    return _create("symvit_base_patch16_224", pretrained, **_merge(dict(_BASE, attention="sym"), kwargs))


@register_model
def rpc_symvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """RPC-SymViT-tiny: PAP in block 0 ("layer1"), 6 iterations, lambda 4; symmetric elsewhere."""
    d = dict(_TINY, attention="sym", rpc_layers=[0], n_iter=6, lambd=4.0)
    return _create("rpc_symvit_tiny_patch16_224", pretrained, **_merge(d, kwargs))


@register_model
def rpc_symvit_small_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """RPC-SymViT-small: PAP in every block, 2 iterations, lambda 4."""
    d = dict(_SMALL, attention="sym", rpc_layers="all", n_iter=2, lambd=4.0)
    return _create("rpc_symvit_small_patch16_224", pretrained, **_merge(d, kwargs))


@register_model
def rpc_symvit_base_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """RPC-SymViT-base: PAP in every block, 2 iterations, lambda 4."""
    d = dict(_BASE, attention="sym", rpc_layers="all", n_iter=2, lambd=4.0)
    return _create("rpc_symvit_base_patch16_224", pretrained, **_merge(d, kwargs))


@register_model
def scaled_vit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """ViT-tiny with Scaled Attention ``softmax(QK^T)(I - S)V`` (S learnable N x N per head)."""
    return _create("scaled_vit_tiny_patch16_224", pretrained, **_merge(dict(_TINY, attention="scaled_s"), kwargs))


@register_model
def scaled_alpha_vit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> nn.Module:
    """ViT-tiny with Scaled Attention ``softmax(QK^T)(I - alpha softmax(KK^T))V`` (learnable alpha)."""
    return _create("scaled_alpha_vit_tiny_patch16_224", pretrained,
                   **_merge(dict(_TINY, attention="scaled_alpha"), kwargs))


# ------------------------------------------------------------------------------ official checkpoints
# A symmetric qkv weight [2C, C] does not tell the head count, so the official KPCA_code models (DeiT
# codebase) are recognised by width. Its "deit_small" SymViT is 348 wide with 6 heads of 58, not
# DeiT-small's 384: no registered default matches it, load_official_checkpoint builds it.
OFFICIAL_HEADS_BY_WIDTH: Dict[int, int] = {192: 3, 348: 6, 384: 6, 768: 12}
_SIZE_BY_WIDTH = {192: "tiny", 348: "small", 384: "small", 768: "base"}
_HEADS_BY_SIZE_WORD = {"tiny": 3, "small": 6, "base": 12}


def unwrap_state_dict(obj: Any, prefer_ema: bool = False) -> Dict[str, torch.Tensor]:
    """The tensors of a loaded checkpoint object: the model (or EMA, ``prefer_ema``) state dict inside a
    training checkpoint's dict, with ``module.`` / ``_orig_mod.`` prefixes (DDP, torch.compile) removed."""
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint holds a {type(obj).__name__}, expected a state dict")
    keys = ("model_ema", "state_dict_ema", "model", "state_dict") if prefer_ema else (
        "model", "state_dict", "model_ema", "state_dict_ema")
    for k in keys:
        if k in obj and isinstance(obj[k], dict):
            obj = obj[k]
            break
    sd = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            continue
        for prefix in ("module.", "_orig_mod."):
            if k.startswith(prefix):
                k = k[len(prefix):]
        sd[k] = v
    if not sd:
        raise ValueError("checkpoint contains no tensors")
    return sd


def _read_failure(exc: BaseException) -> str:
    """The one line of a reader's error that says what is wrong with the file.

    torch's weights-only unpickler puts the reason after a paragraph on ``weights_only`` defaults
    (``... WeightsUnpickler error: \n\nUnsupported operand 103``); every other reader (safetensors,
    torch's zip reader) starts with it.
    """
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        reason = next((line.strip() for line in text.split(marker, 1)[1].splitlines() if line.strip()), "")
        return f"torch.load(weights_only=True) refused it: {reason}" if reason else text.splitlines()[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _read_checkpoint_object(path: str) -> Any:
    """The object a ``.safetensors`` or torch file holds; FileNotFoundError if there is none, and a
    ValueError naming the file and the problem (one line) if it cannot be read (truncated, corrupt, not
    a checkpoint at all)."""
    import argparse
    import os

    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        if str(path).endswith(".safetensors"):
            from safetensors.torch import load_file
            return load_file(path)
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors' SafetensorError, torch's RuntimeError / UnpicklingError, ...
        raise ValueError(f"cannot read checkpoint {path}: {_read_failure(exc)}") from None


def read_checkpoint(path: str, prefer_ema: bool = False) -> Dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a torch ``.pth`` (``weights_only=True``).

    Official DeiT/SymViT ``.pth`` files wrap the weights as ``{"model": ..., "args": Namespace, ...}``;
    ``argparse.Namespace`` is allow-listed for the safe unpickler. ``"model"`` is preferred over
    ``"model_ema"`` unless ``prefer_ema``. Every error is one line naming ``path``.
    """
    obj = _read_checkpoint_object(path)
    try:
        return unwrap_state_dict(obj, prefer_ema)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _checkpoint_args(obj: Any) -> Dict[str, Any]:
    args = obj.get("args") if isinstance(obj, dict) else None
    if args is None or isinstance(args, torch.Tensor):
        return {}
    return dict(args) if isinstance(args, dict) else dict(vars(args))


def _infer_num_heads(width: int, args: Dict[str, Any]) -> int:
    if isinstance(args.get("num_heads"), int):
        return args["num_heads"]
    name = str(args.get("model", ""))
    for word, heads in _HEADS_BY_SIZE_WORD.items():
        if word in name and width % heads == 0:
            return heads
    if width in OFFICIAL_HEADS_BY_WIDTH:
        return OFFICIAL_HEADS_BY_WIDTH[width]
    raise ValueError(f"cannot tell the head count of a {width}-wide checkpoint (a symmetric qkv weight does not "
                     f"show it); pass num_heads=... to load_official_checkpoint")


def checkpoint_model_kwargs(state_dict: Dict[str, torch.Tensor], args: Optional[Dict[str, Any]] = None,
                            num_heads: Optional[int] = None) -> Dict[str, Any]:
    """The :class:`SymViT` arguments that fit a state dict of the official layout.

    Width, depth, patch size, input channels, classes, MLP ratio, qkv bias, token grid (``img_size``)
    and attention type come from the tensors; the head count from ``num_heads``, else
    ``args["num_heads"]``, else the size word in ``args["model"]`` (``deit_small_...``), else
    :data:`OFFICIAL_HEADS_BY_WIDTH`.
    """
    args = args or {}
    proj = state_dict.get("patch_embed.proj.weight")
    qkv = state_dict.get("blocks.0.attn.qkv.weight")
    if proj is None or proj.dim() != 4 or qkv is None:
        raise ValueError("not a ViT state dict: patch_embed.proj.weight or blocks.0.attn.qkv.weight is missing")
    width, in_chans, patch = proj.shape[0], proj.shape[1], tuple(proj.shape[2:])
    depth = len({k.split(".")[1] for k in state_dict if k.startswith("blocks.")})
    if qkv.shape[0] == 2 * width:
        attention = "sym"
    elif "blocks.0.attn.s_matrix" in state_dict:
        attention = "scaled_s"
    else:
        attention = "scaled_alpha" if "blocks.0.attn.alpha" in state_dict else "attn"
    kwargs: Dict[str, Any] = dict(attention=attention, embed_dim=width, depth=depth, num_heads=num_heads or _infer_num_heads(width, args),
                                  patch_size=patch, in_chans=in_chans, qkv_bias="blocks.0.attn.qkv.bias" in state_dict,
                                  mlp_ratio=state_dict["blocks.0.mlp.fc1.weight"].shape[0] / width,
                                  class_token="cls_token" in state_dict)
    head = state_dict.get("head.weight")
    kwargs["num_classes"] = 0 if head is None else head.shape[0]
    pos = state_dict.get("pos_embed")
    if pos is not None:
        grid = math.isqrt(pos.shape[1] - int(kwargs["class_token"]))
        if grid * grid == pos.shape[1] - int(kwargs["class_token"]):
            kwargs["img_size"] = (grid * patch[0], grid * patch[1])
    return kwargs


def _default_variant(kwargs: Dict[str, Any]) -> str:
    attention = kwargs["attention"]
    if attention == "scaled_s":
        return "scaled_vit_tiny_patch16_224"
    if attention == "scaled_alpha":
        return "scaled_alpha_vit_tiny_patch16_224"
    return f"symvit_{_SIZE_BY_WIDTH.get(kwargs['embed_dim'], 'tiny')}_patch16_224"


def _check_fits(model: nn.Module, sd: Dict[str, torch.Tensor], skip: Iterable[str] = ()) -> None:
    """Raise one ValueError naming the fix when a checkpoint's architecture differs from the model's."""
    vit: Any = model  # a SymViT: embed_dim and blocks are read by name
    width = sd["patch_embed.proj.weight"].shape[0] if "patch_embed.proj.weight" in sd else None
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    if width is not None and (width != vit.embed_dim or depth != len(vit.blocks)):
        raise ValueError(
            f"the checkpoint is a {width}-wide, {depth}-block model, this one is {vit.embed_dim} wide with "
            f"{len(vit.blocks)} blocks; build the model from the checkpoint with "
            f"rpc_attention.models.load_official_checkpoint(path) (or pass embed_dim={width}, depth={depth})")
    own = model.state_dict()
    skipped = tuple(skip)
    for k, v in sd.items():
        if k in own and own[k].shape != v.shape and not k.startswith(skipped):
            raise ValueError(f"checkpoint tensor {k} has shape {tuple(v.shape)}, the model expects "
                             f"{tuple(own[k].shape)}")


def _resample_pos_embed(model: nn.Module, sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    pe = sd.get("pos_embed")
    vit: Any = model  # a SymViT: pos_embed, num_prefix_tokens and patch_embed are read by name
    if pe is not None and getattr(vit, "pos_embed", None) is not None and pe.shape != vit.pos_embed.shape:
        from timm.layers import resample_abs_pos_embed
        prefix = 0 if getattr(vit, "no_embed_class", False) else vit.num_prefix_tokens
        sd = dict(sd, pos_embed=resample_abs_pos_embed(pe, vit.patch_embed.grid_size, num_prefix_tokens=prefix))
    return sd


def _checkpoint_filter(state_dict: Dict[str, Any], model: nn.Module) -> Dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn`` for ``pretrained=True``: official layout, pos_embed resampled."""
    sd = unwrap_state_dict(state_dict)
    sd = _resample_pos_embed(model, sd)
    # timm itself adapts the classifier (other num_classes) and the patch conv (other in_chans) next
    _check_fits(model, sd, skip=("head.", "patch_embed.proj."))
    return sd


def load_official_checkpoint(checkpoint: Union[str, Dict[str, Any], nn.Module],
                             model: Union[None, nn.Module, str, Dict[str, Any]] = None, *,
                             variant: Optional[str] = None, strict: bool = True, prefer_ema: bool = False,
                             **model_kwargs: Any) -> nn.Module:
    """Build the SymViT that fits an official SymViT / RPC-SymViT checkpoint and load it; return the model.

    ``checkpoint`` is a path (``.pth`` / ``.safetensors``) or a (wrapped) state dict; ``{"model": ...}`` is
    unwrapped (``model_ema`` with ``prefer_ema``), ``module.`` prefixes are stripped. The architecture
    comes from the tensors (:func:`checkpoint_model_kwargs`: width, depth, patch, classes, ...; the head
    count from the checkpoint's ``args`` or :data:`OFFICIAL_HEADS_BY_WIDTH`, e.g. the official
    ``deit_small`` SymViT: width 348, 6 heads of 58). ``variant`` picks the registered name whose
    defaults fill the rest (default ``symvit_{tiny,small,base}_patch16_224`` by width; pass e.g.
    ``variant="rpc_symvit_tiny_patch16_224"`` or ``rpc_layers=..., n_iter=...`` for an RPC-SymViT run,
    whose PAP settings are not in the weights); ``model_kwargs`` override anything (``num_heads``,
    ``img_size``: ``pos_embed`` is resampled to the new grid).

    In-place form: ``load_official_checkpoint(model, checkpoint)`` (or ``model=``) checks that the model
    fits and loads into it. Raises ``ValueError`` naming the fix when it does not fit.
    """
    source: Union[None, str, Dict[str, Any], nn.Module] = checkpoint
    if isinstance(source, nn.Module):
        source, model = model, source
    if source is None or isinstance(source, nn.Module):
        raise ValueError("load_official_checkpoint needs a checkpoint path or state dict")
    obj = source if isinstance(source, dict) else _read_checkpoint_object(str(source))
    sd = unwrap_state_dict(obj, prefer_ema)
    if model is None:
        import timm

        inferred = checkpoint_model_kwargs(sd, _checkpoint_args(obj), num_heads=model_kwargs.get("num_heads"))
        kwargs = dict(inferred, **model_kwargs)
        model = timm.create_model(variant or _default_variant(kwargs), **kwargs)
    elif variant is not None or model_kwargs:
        raise ValueError("variant= and model options only apply when load_official_checkpoint builds the model; "
                         "drop them or drop the model argument")
    if not isinstance(model, nn.Module):
        raise ValueError(f"load_official_checkpoint loads into a model (an nn.Module), got {type(model).__name__}")
    sd = _resample_pos_embed(model, sd)
    _check_fits(model, sd)
    model.load_state_dict(sd, strict=strict)
    return model
