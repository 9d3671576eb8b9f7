"""Segmenter (Strudel et al. 2021) with a SymViT / RPC-SymViT encoder.

:class:`Segmenter` = a timm ViT encoder (any registered SymViT, built by ``timm.create_model`` with
``num_classes=0``) + a decoder:

- ``"linear"`` (:class:`LinearDecoder`): one linear layer from each patch token to class logits.
- ``"mask_transformer"`` (:class:`MaskTransformerDecoder`): patch tokens projected to the decoder
  width and joined by one learnable embedding per class; ``depth`` (default 2) pre-LN transformer
  blocks with :class:`rpc_attention.nn.SymmetricAttention`, or :class:`rpc_attention.nn.RPCAttention`
  (PAP) in the blocks listed by ``rpc_layers`` (the official RPC Segmenter: block 0); then patch and
  class features are projected, L2-normalised, multiplied (masks = patches x classes^T) and
  LayerNorm-ed over the classes.

Logits are upsampled bilinearly from the patch grid to the input size. Inputs whose sides are not
multiples of the patch are zero-padded at the bottom/right and the logits cropped back; the encoder
runs with timm's ``dynamic_img_size`` so the position embeddings are resampled to any grid.

PAP in the encoder is chosen with the encoder's own ``rpc_layers`` (e.g. ``rpc_symvit_tiny_patch16_224``
or ``rpc_layers=[0]``); PAP in the decoder separately with ``decoder_rpc``, so both can be compared.

:func:`load_encoder_weights` initialises the encoder from a classification run directory
(``DIR/model.safetensors``), resampling the position embeddings when the image size differs.
:func:`sliding_window_logits` is the sliding-window inference used for large images (ADE20K).
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import RPCAttention, SymmetricAttention, parse_layers

__all__ = [
    "Segmenter", "LinearDecoder", "MaskTransformerDecoder", "build_segmenter", "load_encoder_weights",
    "sliding_window_logits", "SEGMENTER_KEYS",
]

# model-config keys consumed by the Segmenter itself; every other key goes to timm.create_model(encoder).
SEGMENTER_KEYS = (
    "name", "kwargs", "encoder", "num_classes", "decoder", "decoder_layers", "decoder_dim", "decoder_heads",
    "decoder_mlp_ratio", "decoder_drop", "decoder_drop_path", "decoder_rpc", "decoder_n_iter",
    "decoder_lambd", "decoder_threshold", "decoder_mu_mode", "encoder_init", "ema",
)


def _resolve_layers(spec: Union[None, bool, str, int, Iterable[int]], depth: int, what: str) -> List[int]:
    """``True`` (or ``"true"``/``"yes"``) means the first decoder block; otherwise as
    :func:`rpc_attention.nn.parse_layers`."""
    if spec is False or (isinstance(spec, str) and spec.strip().lower() in ("false", "no")):
        return []
    if spec is True or (isinstance(spec, str) and spec.strip().lower() in ("true", "yes")):
        return [0]
    return parse_layers(spec, depth, what)


class LinearDecoder(nn.Module):
    """Per-patch linear classifier: tokens ``[B, N, C]`` -> logits ``[B, K, gh, gw]``."""

    def __init__(self, encoder_dim: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.head = nn.Linear(encoder_dim, num_classes)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: Tensor, grid: Tuple[int, int]) -> Tensor:
        b = x.shape[0]
        return self.head(x).transpose(1, 2).reshape(b, self.num_classes, grid[0], grid[1])


class MaskTransformerDecoder(nn.Module):
    """Segmenter's mask transformer with symmetric attention (PAP in the blocks ``rpc_layers``).

    Args:
        encoder_dim: width of the encoder tokens.
        num_classes: K.
        dim: decoder width (default ``encoder_dim``); ``num_heads`` default ``max(1, dim // 64)``.
        depth: decoder blocks (Segmenter: 2).
        rpc_layers: decoder blocks running PAP (``True`` = block 0, ``"all"``, an index or list).
        n_iter, lambd, threshold, mu_mode: PAP options of those blocks.
    """

    def __init__(self, encoder_dim: int, num_classes: int, dim: Optional[int] = None, depth: int = 2,
                 num_heads: Optional[int] = None, mlp_ratio: float = 4.0, drop_rate: float = 0.1,
                 drop_path_rate: float = 0.0, rpc_layers=None, n_iter: int = 4, lambd: float = 4.0,
                 threshold: str = "lambda_mu", mu_mode: Optional[str] = None) -> None:
        super().__init__()
        from .vision import SymViTBlock  # the encoder's block class (timm Block + our attention)

        dim = int(dim or encoder_dim)
        num_heads = int(num_heads or max(1, dim // 64))
        if depth < 1:
            raise ValueError(f"decoder_layers must be >= 1, got {depth}")
        self.num_classes, self.dim, self.depth = num_classes, dim, depth
        self.rpc_layers = _resolve_layers(rpc_layers, depth, "decoder_rpc")
        pap: Dict[str, Any] = {"n_iter": int(n_iter), "lambd": float(lambd), "threshold": threshold, "mu_mode": mu_mode}
        rpc_set = set(self.rpc_layers)

        def attn_factory(index: int, **akw):
            if index in rpc_set:
                return RPCAttention(**pap, **akw)
            return SymmetricAttention(**akw)

        dpr = [float(v) for v in torch.linspace(0, drop_path_rate, depth)]
        self.proj_dec = nn.Linear(encoder_dim, dim)
        self.cls_emb = nn.Parameter(torch.zeros(1, num_classes, dim))
        self.blocks = nn.ModuleList([
            SymViTBlock(dim, num_heads, attn_factory=attn_factory, depth=i, mlp_ratio=mlp_ratio, qkv_bias=True,
                        proj_drop=drop_rate, drop_path=dpr[i], norm_layer=partial(nn.LayerNorm, eps=1e-6))
            for i in range(depth)
        ])
        self.decoder_norm = nn.LayerNorm(dim)
        self.proj_patch = nn.Parameter(dim ** -0.5 * torch.randn(dim, dim))
        self.proj_classes = nn.Parameter(dim ** -0.5 * torch.randn(dim, dim))
        self.mask_norm = nn.LayerNorm(num_classes)
        self.pap_options = pap if self.rpc_layers else {}
        self.apply(self._init_module)
        nn.init.trunc_normal_(self.cls_emb, std=0.02)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: Tensor, grid: Tuple[int, int]) -> Tensor:
        b, n, _ = x.shape
        x = self.proj_dec(x)
        x = torch.cat([x, self.cls_emb.expand(b, -1, -1)], dim=1)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_norm(x)
        patches, classes = x[:, :n] @ self.proj_patch, x[:, n:] @ self.proj_classes
        patches = F.normalize(patches, dim=-1)
        classes = F.normalize(classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # [B, N, K]
        return masks.transpose(1, 2).reshape(b, self.num_classes, grid[0], grid[1])

    def extra_repr(self) -> str:
        return f"depth={self.depth}, dim={self.dim}, rpc_layers={self.rpc_layers}, pap={self.pap_options}"


class Segmenter(nn.Module):
    """Encoder (timm ViT with ``num_prefix_tokens``) + decoder; ``forward(x [B,C,H,W]) -> logits [B,K,H,W]``."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, num_classes: int) -> None:
        super().__init__()
        for attr in ("patch_embed", "forward_features", "num_prefix_tokens"):
            if not hasattr(encoder, attr):
                raise ValueError(f"Segmenter encoder must be a timm VisionTransformer (missing {attr!r})")
        vit: Any = encoder  # a timm VisionTransformer: its attributes are read and set by name
        self.encoder: Any = vit
        self.decoder = decoder
        self.num_classes = int(num_classes)
        p = vit.patch_embed.patch_size
        self.patch_size = (int(p[0]), int(p[1])) if isinstance(p, (tuple, list)) else (int(p), int(p))
        vit.dynamic_img_size = True  # resample position embeddings to the (padded) input grid
        vit.patch_embed.strict_img_size = False
        vit.patch_embed.flatten = False
        from timm.layers import Format
        vit.patch_embed.output_fmt = Format.NHWC

    @property
    def img_size(self) -> Tuple[int, int]:
        s = self.encoder.patch_embed.img_size
        return (int(s[0]), int(s[1]))

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.patch_size[0], (-w) % self.patch_size[1]
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        hp, wp = h + ph, w + pw
        grid = (hp // self.patch_size[0], wp // self.patch_size[1])
        tokens = self.encoder.forward_features(x)[:, self.encoder.num_prefix_tokens:]
        masks = self.decoder(tokens, grid)
        masks = F.interpolate(masks, size=(hp, wp), mode="bilinear", align_corners=False)
        return masks[..., :h, :w]


# ------------------------------------------------------------------------------------------ builders
def _build_decoder(mcfg: Dict[str, Any], enc_dim: int, num_classes: int) -> nn.Module:
    """The decoder a ``model`` config section names (see :func:`build_segmenter`); the decoder's PAP
    options default to the encoder's (``n_iter``, ``lambd``, ...), else 4 / 4.0."""
    kind = str(mcfg.get("decoder", "mask_transformer")).lower()
    if kind == "linear":
        if mcfg.get("decoder_rpc"):
            raise ValueError("decoder_rpc needs decoder=mask_transformer (the linear decoder has no attention)")
        return LinearDecoder(enc_dim, num_classes)
    if kind not in ("mask_transformer", "mask-transformer", "mask"):
        raise ValueError(f"model.decoder must be 'mask_transformer' or 'linear', got {kind!r}")

    def pick(key, enc_key, default):
        v = mcfg.get(key)
        if v is None:
            v = mcfg.get(enc_key)
        return default if v is None else v

    return MaskTransformerDecoder(
        enc_dim, num_classes, dim=mcfg.get("decoder_dim"), depth=int(mcfg.get("decoder_layers", 2)),
        num_heads=mcfg.get("decoder_heads"), mlp_ratio=float(mcfg.get("decoder_mlp_ratio", 4.0)),
        drop_rate=float(mcfg.get("decoder_drop", 0.1)), drop_path_rate=float(mcfg.get("decoder_drop_path", 0.0)),
        rpc_layers=mcfg.get("decoder_rpc"), n_iter=int(pick("decoder_n_iter", "n_iter", 4)),
        lambd=float(pick("decoder_lambd", "lambd", 4.0)),
        threshold=pick("decoder_threshold", "threshold", "lambda_mu"),
        mu_mode=pick("decoder_mu_mode", "mu_mode", None),
    )


def build_segmenter(mcfg: Dict[str, Any]) -> Segmenter:
    """Build a :class:`Segmenter` from a ``model`` config section.

    Keys: ``encoder`` or ``name`` (timm name of the encoder, default ``symvit_tiny_patch16_224``),
    ``num_classes``, ``decoder``
    (``mask_transformer`` | ``linear``), ``decoder_layers``, ``decoder_dim``, ``decoder_heads``,
    ``decoder_mlp_ratio``, ``decoder_drop``, ``decoder_drop_path``, ``decoder_rpc`` (false | true =
    block 0 | list | ``"all"``), ``decoder_n_iter``, ``decoder_lambd``, ``decoder_threshold``,
    ``decoder_mu_mode`` (default: the encoder's ``n_iter`` / ``lambd`` / ... or 4 / 4.0),
    ``encoder_init`` (a classification run directory or a ``.safetensors`` file). Every other key
    (``img_size, patch_size, in_chans, embed_dim, depth, num_heads, drop_path_rate, rpc_layers,
    n_iter, lambd, ...``), and every key of ``kwargs`` (a dict), is passed to
    ``timm.create_model(encoder, ...)``; ``None`` values are dropped.
    """
    from .factory import create_model  # (importing models registers the SymViT models)

    if "num_classes" not in mcfg:
        raise ValueError("model.num_classes is required for a Segmenter")
    num_classes = int(mcfg["num_classes"])
    enc_name = mcfg.get("encoder") or mcfg.get("name") or "symvit_tiny_patch16_224"
    if str(enc_name).lower() == "segmenter":
        raise ValueError("model.name is the encoder's timm name (e.g. symvit_tiny_patch16_224), not 'segmenter'")
    enc_kwargs = {k: v for k, v in mcfg.items() if k not in SEGMENTER_KEYS and v is not None}
    enc_kwargs.update({k: v for k, v in (mcfg.get("kwargs") or {}).items() if v is not None})
    enc_kwargs.pop("num_classes", None)
    enc_kwargs.setdefault("dynamic_img_size", True)
    try:
        encoder = create_model(enc_name, pretrained=False, num_classes=0, **enc_kwargs)
    except RuntimeError as exc:
        if "Unknown model" in str(exc):
            raise ValueError(f"unknown encoder {enc_name!r}: expected a registered timm model such as "
                             f"symvit_tiny_patch16_224 or rpc_symvit_tiny_patch16_224") from None
        raise
    vit: Any = encoder  # a timm VisionTransformer
    decoder = _build_decoder(mcfg, int(vit.embed_dim), num_classes)
    model = Segmenter(encoder, decoder, num_classes)
    if mcfg.get("encoder_init"):
        load_encoder_weights(model.encoder, mcfg["encoder_init"])
    return model


def _read_weights(path: Path) -> Dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"cannot read weights from {path}: {exc}") from None


def load_encoder_weights(encoder: nn.Module, source: Union[str, Path, Dict[str, Tensor]]) -> Dict[str, Any]:
    """Load every encoder weight from a classification run (``DIR/model.safetensors``), a
    ``.safetensors`` file, a segmentation run (keys ``encoder.*``) or a state dict.

    The classifier head is dropped; the position embeddings are resampled (bicubic, timm's
    ``resample_abs_pos_embed``) when the checkpoint's patch grid differs from the encoder's. Raises
    ``FileNotFoundError`` for a missing run/file and ``ValueError`` when an encoder weight is missing
    or has another shape (e.g. a different width or depth). Returns ``{"loaded": n, "resized": [...],
    "dropped": [...]}``.
    """
    from timm.layers import resample_abs_pos_embed

    if isinstance(source, dict):
        sd, where = dict(source), "state dict"
    else:
        p = Path(source).expanduser()
        if p.is_dir():
            f = p / "model.safetensors"
            if not f.is_file():
                raise FileNotFoundError(f"encoder_init: {f} not found (expected a finished classification run "
                                        f"directory containing model.safetensors)")
            p = f
        elif not p.is_file():
            raise FileNotFoundError(f"encoder_init: {p} does not exist (give a run directory or a .safetensors file)")
        sd, where = _read_weights(p), str(p)
    if sd and all(k.startswith("encoder.") for k in sd if not k.startswith("decoder.")):
        sd = {k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")}
    vit: Any = encoder  # a timm VisionTransformer: num_prefix_tokens and patch_embed are read by name
    own = encoder.state_dict()
    dropped = sorted(k for k in sd if k not in own)
    resized = []
    out = {}
    for k, ref in own.items():
        if k not in sd:
            continue
        v = sd[k]
        if k == "pos_embed" and v.shape != ref.shape:
            prefix = 0 if getattr(vit, "no_embed_class", False) else int(vit.num_prefix_tokens)
            n_old = v.shape[1] - prefix
            side = int(round(math.sqrt(n_old)))
            if side * side != n_old:
                raise ValueError(f"encoder_init: cannot resample a non-square pos_embed of {n_old} patches")
            grid = tuple(int(g) for g in vit.patch_embed.grid_size)
            v = resample_abs_pos_embed(v.float(), new_size=grid, old_size=(side, side),
                                       num_prefix_tokens=prefix).to(ref.dtype)
            resized.append(k)
        if v.shape != ref.shape:
            raise ValueError(f"encoder_init: weight {k} has shape {tuple(v.shape)} in {where} but "
                             f"{tuple(ref.shape)} in the encoder (match model.embed_dim/depth/num_heads/"
                             f"patch_size/in_chans to the classification run)")
        out[k] = v
    missing = sorted(k for k in own if k not in out)
    if missing:
        raise ValueError(f"encoder_init: {len(missing)} encoder weights missing from {where}: "
                         f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    encoder.load_state_dict(out, strict=True)
    return {"loaded": len(out), "resized": resized, "dropped": dropped}


# --------------------------------------------------------------------------------- sliding windows
@torch.no_grad()
def sliding_window_logits(model: nn.Module, x: Tensor, window: Union[int, Sequence[int]],
                          stride: Optional[Union[int, Sequence[int]]] = None, num_classes: Optional[int] = None,
                          batch_size: int = 4) -> Tensor:
    """Logits ``[B, K, H, W]`` of ``model`` over windows of size ``window`` moved by ``stride``
    (default: the window), averaged where windows overlap. Images smaller than the window are
    zero-padded to it and the result cropped back.
    """
    wh, ww = (window, window) if isinstance(window, int) else tuple(window)
    stride = stride or (wh, ww)
    sh, sw = (stride, stride) if isinstance(stride, int) else tuple(stride)
    b, _, h, w = x.shape
    ph, pw = max(wh - h, 0), max(ww - w, 0)
    if ph or pw:
        x = F.pad(x, (0, pw, 0, ph))
    H, W = x.shape[-2:]
    tops = list(range(0, max(H - wh, 0) + 1, sh))
    if tops[-1] + wh < H:
        tops.append(H - wh)
    lefts = list(range(0, max(W - ww, 0) + 1, sw))
    if lefts[-1] + ww < W:
        lefts.append(W - ww)
    coords = [(t, l) for t in tops for l in lefts]
    k = num_classes or getattr(model, "num_classes", None)
    logits = None
    count = torch.zeros(1, 1, H, W, device=x.device, dtype=x.dtype)
    for i in range(0, len(coords), max(1, batch_size)):
        chunk = coords[i:i + batch_size]
        crops = torch.cat([x[:, :, t:t + wh, l:l + ww] for t, l in chunk], dim=0)
        out = model(crops).float()
        if logits is None:
            k = out.shape[1]
            logits = torch.zeros(b, k, H, W, device=x.device, dtype=torch.float32)
        for j, (t, l) in enumerate(chunk):
            logits[:, :, t:t + wh, l:l + ww] += out[j * b:(j + 1) * b]
            count[:, :, t:t + wh, l:l + ww] += 1
    assert logits is not None  # at least one window
    logits = logits / count.float()
    return logits[..., :h, :w]
