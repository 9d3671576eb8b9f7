"""Masking a ViT's input: the mask sets of the certified patch defence and the forward passes that
drop tokens (docs/robustness.md#certified-patch-defence).

* **Geometry.** A patch of ``P`` pixels per side placed anywhere touches at most
  :func:`token_extent` tokens per axis of the model's token grid (``P`` placed on the grid: one). Windows
  of ``e + s - 1`` tokens at stride ``s`` (:func:`axis_windows`) hold every run of ``e`` consecutive
  tokens: the start of a run at ``j`` falls in ``[w, w + s)`` for the window starting at the multiple
  ``w = s * floor(j / s)``, and the last window is moved back to end at the border. A mask is the
  product of a row window and a column window (:func:`mask_set`), so every patch lies entirely inside
  at least one mask (tested by brute force over every position on small grids).
* **Dropping tokens.** :func:`drop_tokens_mask` turns dropped grid cells into the key mask of every
  attention block (bool ``(B, 1, 1, N)``, True = may be attended to; the class token and the other
  prefix tokens are never dropped). A dropped token takes no part in any block's attention as a key:
  no query attends to it (SDPA and PAP alike), and PAP's mu, its token count and its robust statistics
  are taken over the kept keys only, as are a key control's. Its own row is still computed but nothing
  reads it: the class token is the only output (:func:`check_token_dropping` refuses other poolings),
  LayerNorm and the MLP act token by token, and the patch embedding does not overlap its cells. So the
  pixels of a dropped cell cannot change the logits; a test perturbs them and checks the logits do not
  move, and another checks the masked forward against the same model run on the kept tokens alone.
* **Shortening the sequence** (the fast path, :func:`kept_tokens`). Since a dropped token changes
  nothing that is read, it can as well be left out: the kept tokens are gathered right after the
  position embedding (a forward hook on the ViT's ``norm_pre``, a per-token module, for the length of
  one call), so a masked pass costs its kept tokens' worth of work, less than an unmasked pass. Rows of
  a batch that keep fewer tokens than the batch's most are padded with their class token, which the key
  mask hides. :class:`MaskedClassifier` takes this path unless ``gather=False`` (the key mask over the
  full sequence, the definition above, which the attention-aware attack needs for its token indices); a
  test holds the two together in float64.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .inputs import Normalized
from .patch import PatchGrid

THREATS = ("patch", "token")
MASKINGS = ("tokens", "pixels")


def token_extent(pixels: int, patch: int, aligned: bool = False) -> int:
    """The most tokens along one axis that a run of ``pixels`` pixels touches on a grid of ``patch``-pixel
    tokens: placed anywhere, ``floor((pixels + patch - 2) / patch) + 1`` (a run that starts on a token's
    last pixel); ``aligned`` (starting on a token boundary), ``ceil(pixels / patch)``."""
    if pixels < 1 or patch < 1:
        raise ValueError(f"a patch of {pixels} pixels on tokens of {patch} pixels: both must be >= 1")
    return math.ceil(pixels / patch) if aligned else (pixels + patch - 2) // patch + 1


def axis_windows(n: int, extent: int, stride: int) -> List[Tuple[int, int]]:
    """``[(start, stop), ...]``: windows of ``extent + stride - 1`` cells (at most ``n``) along an axis of
    ``n`` cells at ``stride``, the last one moved back to end at ``n``, so that every run of ``extent``
    consecutive cells lies inside one of them."""
    if not 1 <= extent <= n or stride < 1:
        raise ValueError(f"windows on an axis of {n} cells: the extent ({extent}) must be in [1, {n}] and the "
                         f"stride ({stride}) >= 1")
    size = min(extent + stride - 1, n)
    starts = list(range(0, n - size + 1, stride))
    if starts[-1] != n - size:
        starts.append(n - size)
    return [(s, s + size) for s in starts]


def stride_for(n: int, extent: int, masks_per_axis: int) -> int:
    """The stride that gives at most ``masks_per_axis`` windows (0: stride 1, the smallest masks)."""
    if masks_per_axis < 0:
        raise ValueError(f"masks_per_axis must be >= 0 (0: one mask per position), got {masks_per_axis}")
    return 1 if masks_per_axis == 0 else max(1, math.ceil((n - extent + 1) / masks_per_axis))


@dataclass(frozen=True)
class MaskSet:
    """The masks of the double-masking defence on a token grid: ``dropped`` is bool ``[M, rows * cols]``
    (True = the cell is masked), row-major; ``extent`` the cells per axis a patch of the threat touches,
    ``windows`` the row / column windows (the masks are their products, rows outer)."""

    threat: str
    pixels: int
    grid: PatchGrid
    extent: int
    stride: int
    row_windows: Tuple[Tuple[int, int], ...]
    col_windows: Tuple[Tuple[int, int], ...]
    dropped: Tensor

    @property
    def count(self) -> int:
        return int(self.dropped.shape[0])

    def describe(self) -> str:
        r0, r1 = self.row_windows[0]
        c0, c1 = self.col_windows[0]
        where = "anywhere" if self.threat == "patch" else "on the token grid"
        return (f"{self.count} masks of {r1 - r0}x{c1 - c0} tokens at stride {self.stride} on the "
                f"{self.grid.rows}x{self.grid.cols} grid, covering one {self.pixels}x{self.pixels}-pixel patch "
                f"{where} (at most {self.extent}x{self.extent} tokens)")


def mask_set(grid: PatchGrid, threat: str, pixels: int = 0, masks_per_axis: int = 0) -> MaskSet:
    """The mask set covering ``threat`` on ``grid``: ``"patch"``, one square of ``pixels`` pixels per side
    (0: the token size) placed anywhere; ``"token"``, one token replaced (a square of the token size on
    the grid). ``masks_per_axis`` caps the windows per axis (0: stride 1, the smallest masks)."""
    if threat not in THREATS:
        raise ValueError(f"threat must be one of {', '.join(THREATS)}, got {threat!r}")
    if threat == "token" and pixels not in (0, grid.patch):
        raise ValueError(f"the token threat is one token of {grid.patch} pixels; patch pixels={pixels} is for the "
                         "patch threat")
    pixels = int(pixels) or grid.patch
    if pixels > grid.patch * min(grid.rows, grid.cols):
        raise ValueError(f"a {pixels}-pixel patch does not fit on the {grid.rows * grid.patch}x"
                         f"{grid.cols * grid.patch}-pixel image")
    extent = token_extent(pixels, grid.patch, aligned=threat == "token")
    # along a short axis a patch cannot touch more tokens than the axis has
    stride = stride_for(min(grid.rows, grid.cols), min(extent, grid.rows, grid.cols), masks_per_axis)
    rows = axis_windows(grid.rows, min(extent, grid.rows), stride)
    cols = axis_windows(grid.cols, min(extent, grid.cols), stride)
    dropped = torch.zeros(len(rows) * len(cols), grid.rows, grid.cols, dtype=torch.bool)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            dropped[i * len(cols) + j, r0:r1, c0:c1] = True
    return MaskSet(threat, pixels, grid, extent, stride, tuple(rows), tuple(cols), dropped.flatten(1))


def touched_cells(grid: PatchGrid, top: int, left: int, pixels: int) -> Tensor:
    """Bool ``[rows * cols]``: the grid cells a ``pixels``-wide square at pixel ``(top, left)`` overlaps."""
    out = torch.zeros(grid.rows, grid.cols, dtype=torch.bool)
    out[top // grid.patch:(top + pixels - 1) // grid.patch + 1, left // grid.patch:(left + pixels - 1) // grid.patch + 1] = True
    return out.flatten()


def check_token_dropping(model: nn.Module) -> None:
    """Raise ValueError unless dropping tokens through the key mask hides them from ``model``'s output: a
    timm ViT whose forward takes ``attn_mask``, pooled on the class token, with a patch embedding that
    does not overlap its cells (kernel = stride = patch size) and a per-token ``norm_pre`` (where the
    shortened sequence is gathered)."""
    name = type(model).__name__
    if "attn_mask" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"token masking passes a key mask through the model's forward(x, attn_mask=...); "
                         f"{name}.forward takes none (a timm VisionTransformer from timm 1.0.17 on does)")
    if getattr(model, "global_pool", None) != "token" or getattr(model, "attn_pool", None) is not None \
            or getattr(model, "cls_token", None) is None:
        raise ValueError(f"token masking needs a class-token classifier (global_pool='token'): {name} pools "
                         f"{getattr(model, 'global_pool', None)!r}, which would read the dropped tokens; use "
                         "masking=pixels")
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if not isinstance(proj, nn.Conv2d) or tuple(proj.kernel_size) != tuple(proj.stride) \
            or tuple(proj.kernel_size) != tuple((size, size) if isinstance(size, int) else size):
        raise ValueError(f"token masking needs a patch embedding whose cells do not overlap (a convolution with "
                         f"kernel = stride = patch size); {name}'s does not")
    if not isinstance(getattr(model, "norm_pre", None), (nn.Identity, nn.LayerNorm)):
        raise ValueError(f"token masking leaves dropped tokens out after {name}.norm_pre, which must be a per-token "
                         f"module (Identity or LayerNorm); it is {type(getattr(model, 'norm_pre', None)).__name__}")


def drop_tokens_mask(dropped: Tensor, prefix: int) -> Tensor:
    """The key mask, bool ``(B, 1, 1, prefix + cells)`` (True = may be attended to), that drops the grid
    cells ``dropped`` (bool ``[B, cells]``) and keeps the ``prefix`` tokens (class token, registers)."""
    keep = torch.cat([torch.ones(dropped.shape[0], prefix, dtype=torch.bool, device=dropped.device), ~dropped], 1)
    return keep[:, None, None, :]


def pixel_mask(dropped: Tensor, grid: PatchGrid) -> Tensor:
    """``[B, 1, H, W]`` float mask (1 on the pixels of the cells ``dropped``, bool ``[B, cells]``)."""
    small = dropped.float().view(-1, 1, grid.rows, grid.cols)
    return small.repeat_interleave(grid.patch, dim=2).repeat_interleave(grid.patch, dim=3)


def kept_tokens(dropped: Tensor, prefix: int) -> Tuple[Tensor, Optional[Tensor]]:
    """``(index, key_mask)`` of the shortened sequence that drops the grid cells ``dropped`` (bool
    ``[B, cells]``): ``index`` (long ``[B, K]``) the positions in the full sequence of the ``prefix`` tokens
    and the kept cells, in order, where ``K`` is the most tokens a row keeps; a row that keeps fewer is
    padded with position 0 (its class token), hidden by ``key_mask`` (bool ``(B, 1, 1, K)``, True = may be
    attended to; None when every row keeps ``K``)."""
    keep = drop_tokens_mask(dropped, prefix)[:, 0, 0]                        # [B, prefix + cells]
    counts = keep.sum(1)
    most = int(counts.max())
    # a stable sort of "dropped" puts each row's kept positions first, in order
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :most]
    valid = torch.arange(most, device=dropped.device)[None, :] < counts[:, None]
    index = torch.where(valid, order, torch.zeros_like(order))
    return index, (None if bool(valid.all()) else valid[:, None, None, :])


@contextlib.contextmanager
def gathered_tokens(vit: nn.Module, index: Tensor) -> Iterator[None]:
    """For the calls inside it, ``vit`` runs its blocks on the tokens ``index`` (long ``[B, K]``) of each
    image only: a forward hook on ``vit.norm_pre`` (the per-token module between the position embedding
    and the first block) gathers them."""

    def gather(module: nn.Module, args: tuple, out: Tensor) -> Tensor:
        return out.gather(1, index.to(out.device)[:, :, None].expand(-1, -1, out.shape[-1]))

    handle = vit.norm_pre.register_forward_hook(gather)
    try:
        yield
    finally:
        handle.remove()


class MaskedClassifier(Normalized):
    """``forward(x, dropped)``: the logits of ``model`` on ``[0, 1]`` images ``x`` with the grid cells
    ``dropped`` (bool ``[B, cells]``) masked: dropped as tokens (``masking="tokens"``) or with their pixels
    set to ``fill`` (``"pixels"``). ``mean`` / ``std``: the model's input normalisation
    (:class:`~rpc_attention.evaluate.inputs.Normalized`). Dropped tokens are left out of the sequence
    (``gather``, the default: :func:`kept_tokens`) or kept and hidden by the key mask of every block
    (``gather=False``: the same logits, at the cost of the full sequence, with every token at its place,
    as the attention-aware attack needs). Differentiable in ``x``."""

    def __init__(self, model: nn.Module, mean: Tensor, std: Tensor, grid: PatchGrid, masking: str = "tokens",
                 fill: float = 0.0, gather: Optional[bool] = None) -> None:
        if masking not in MASKINGS:
            raise ValueError(f"masking must be one of {', '.join(MASKINGS)}, got {masking!r}")
        if masking == "tokens":
            check_token_dropping(model)
        elif gather is not None:
            raise ValueError(f"gather={gather} chooses how dropped tokens are left out; masking={masking!r} drops "
                             "no tokens (it fills pixels): leave gather unset")
        super().__init__(model, mean, std)
        self.grid, self.masking, self.fill = grid, masking, float(fill)
        self.gather = masking == "tokens" and gather is not False

    def forward(self, x: Tensor, dropped: Tensor) -> Tensor:
        dropped = dropped.to(x.device)
        if self.masking == "pixels":
            m = pixel_mask(dropped, self.grid).to(x)
            return super().forward(x * (1 - m) + self.fill * m)
        if not self.gather:
            return super().forward(x, attn_mask=drop_tokens_mask(dropped, self.grid.prefix))
        index, key_mask = kept_tokens(dropped, self.grid.prefix)
        with gathered_tokens(self.model, index):
            return super().forward(x, attn_mask=key_mask)


def random_token_drop(batch: int, cells: int, fraction: float, device=None,
                      generator: Optional[torch.Generator] = None) -> Tensor:
    """Bool ``[batch, cells]``: random grid cells to drop for masking-aware training. Each example drops a
    number of cells drawn uniformly from ``0 .. round(fraction * cells)``, the cells themselves uniformly
    without replacement (so the model sees clean images, one mask and the union of two masks' worth of
    missing tokens). Drawn on the CPU from ``generator`` (None: torch's global generator, which the
    trainer seeds and checkpoints), then moved to ``device``."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"the token-drop fraction must be in [0, 1), got {fraction}")
    most = int(round(fraction * cells))
    rank = torch.rand(batch, cells, generator=generator).argsort(-1).argsort(-1)
    count = torch.randint(0, most + 1, (batch, 1), generator=generator)
    return (rank < count).to(device)
