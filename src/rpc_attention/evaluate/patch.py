"""Adversarial patches: suite ``patch`` (docs/robustness.md#adversarial-patch).

``k`` patches of the model's patch size, on its patch grid (each replaces exactly one token's
embedding, the worst case for a ViT), whose pixels are free in ``[0, 1]``; the rest of the image is
unchanged. Pixel space: the model is wrapped with its normalisation and the attack works on ``[0, 1]``
pixels.

* **Location.** Searched exhaustively per example, in the order of the attack's own ranking: the grid
  cells ranked by input-gradient saliency (sum of ``|d loss / d x|`` over the cell, from the variant's
  gradient model on the clean image). One patch: every cell of the grid. ``k`` patches: every set of
  ``k`` distinct cells among the top half of the ranking (all cells when that half has fewer than
  ``k``), in lexicographic order of their ranks (:func:`candidate_cells`).
* **Pixels.** PGD at each location: ``restarts`` uniform random starts in ``[0, 1]``, each drawn from
  its own seed (the variant, the location's rank, the restart), so an example's start does not depend
  on which other examples are still being attacked; ``steps`` signed-gradient steps of ``step_size``
  on the patch pixels, clipped to ``[0, 1]``. An example is broken at its first misclassified iterate
  (as the ``pgd`` suite's ``keep_best``); further locations and restarts run only on the examples
  still unbroken. More steps or restarts therefore never raise accuracy: the same seeds give the same
  trajectories, only longer or more of them. The numbers of patches run in increasing order and an
  example a variant broke with fewer patches counts as broken with more (the extra patch may copy the
  clean pixels it covers), so accuracy never rises with the number of patches either.
* **Losses.** ``ce``: cross-entropy. ``attention``: Patch-Fool's attention-aware loss (Fu et al., ICLR
  2022), cross-entropy plus ``attention_weight`` times the attention mass every block puts on the
  patch tokens (mean over blocks, heads and queries; in ``[0, 1]``), read from the blocks' own keys
  by forward hooks (:class:`TokenAttention`). Both are maximised.
* **Gradients.** ``model``: through the defended model itself, every PAP pass included (the hard
  threshold and the medians pass the gradient of what they select). ``bpda``: where a PAP block has
  steps that are not differentiable (hard shrinkage, a median or quantile threshold), or a block runs
  a key control (clip, drop; ``key_control``), a BPDA estimate (Athalye et al., ICML 2018): the
  gradient is that of an explicit surrogate (:func:`bpda_surrogate`: the same weights with each PAP
  block replaced by plain symmetric attention, or by PAP with soft shrinkage, and each key control
  removed), while success is always judged on the defended model. The ``model`` gradient goes through
  the controls themselves: the clipping (0 on a clipped entry) and the attention with the dropped
  tokens masked.

An example counts as correct under ``k`` patches only when it survives every attack variant
(``loss x gradient``) and is correct on the clean image (the worst case per example).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import nn as rnn
from ..functional.attention import normalise_mask
from ..functional.key_controls import valid_keys
from .inputs import Normalized, data_name, eval_indices, load_eval_data, norm_stats
from .per_example import PerExample
from .predict import chunks, top1_hits
from .suites import Column, CommonOptions, Cost, StudyUse, list_option, register_suite

LOSSES = ("ce", "attention")
SURROGATES = ("none", "symmetric", "soft")
CLEAN_TOP1 = "clean_top1"


def top1_patches(k: int) -> str:
    """The worst-case metric under ``k`` patches, e.g. ``top1@1patch``."""
    return f"top1@{k}patch"


@dataclass(frozen=True)
class PatchGrid:
    """The model's token grid: patch size in pixels, rows and columns, and the tokens before the patch
    tokens (class token, registers); grid cell ``c`` is token ``prefix + c`` (row-major)."""

    patch: int
    rows: int
    cols: int
    prefix: int

    @property
    def cells(self) -> int:
        return self.rows * self.cols


def patch_grid(model: nn.Module, image_shape: Tuple[int, ...]) -> PatchGrid:
    """The :class:`PatchGrid` of a ViT (``patch_embed.patch_size``, ``num_prefix_tokens``) on images
    of ``image_shape`` (``(C, H, W)`` or ``(N, C, H, W)``)."""
    size = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if size is None:
        raise ValueError("the patch attack needs a ViT with a patch grid (model.patch_embed.patch_size); this "
                         f"model ({type(model).__name__}) has none")
    ph, pw = (size, size) if isinstance(size, int) else tuple(size)
    h, w = image_shape[-2:]
    if ph != pw or h % ph or w % pw:
        raise ValueError(f"the patch attack needs square patches that tile the image; got patch {ph}x{pw} on "
                         f"{h}x{w} images")
    return PatchGrid(int(ph), h // ph, w // pw, int(getattr(model, "num_prefix_tokens", 0) or 0))


def cell_mask(cells: Tensor, grid: PatchGrid, like: Tensor) -> Tensor:
    """``[B, 1, H, W]`` mask (dtype of ``like``): 1 on the grid cells ``cells`` (``[B, k]``) of each image."""
    b = cells.shape[0]
    onehot = torch.zeros(b, grid.cells, dtype=like.dtype, device=like.device)
    onehot.scatter_(1, cells.to(like.device), 1.0)
    small = onehot.view(b, 1, grid.rows, grid.cols)
    return small.repeat_interleave(grid.patch, dim=2).repeat_interleave(grid.patch, dim=3)


def apply_patch(x: Tensor, mask: Tensor, values: Tensor) -> Tensor:
    """``x`` with its pixels under ``mask`` replaced by ``values`` (every channel)."""
    return x * (1 - mask) + values * mask


def cell_saliency(model: nn.Module, x: Tensor, y: Tensor, grid: PatchGrid) -> Tensor:
    """``[B, cells]``: the sum over each grid cell (and channels) of ``|d CE / d x|`` at ``x``."""
    x = x.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), x)
    per_pixel = grad.abs().sum(1, keepdim=True)
    return F.avg_pool2d(per_pixel, grid.patch).flatten(1)


def candidate_cells(saliency: Tensor, k: int) -> Tensor:
    """``[B, L, k]``: the cell sets the location search tries per example, in order: the grid cells ranked
    by ``saliency`` (``[B, cells]``, most salient first); for ``k = 1`` every cell, for ``k > 1`` every set
    of ``k`` distinct cells among the top half of the ranking (among all cells when the half has fewer
    than ``k``), in lexicographic order of their ranks."""
    cells = saliency.shape[1]
    ranked = saliency.argsort(dim=1, descending=True, stable=True).cpu()
    if k == 1:
        return ranked[:, :, None]
    top = max(-(-cells // 2), k)
    ranks = torch.tensor(list(itertools.combinations(range(top), k)), dtype=torch.long)   # [L, k]
    return ranked[:, ranks]


def _attention_probs(mod: nn.Module, x: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
    """``[B, H, N, N]`` softmax attention a block's output used, recomputed with gradients from its
    ``qkv`` projection (PAP blocks: from the cleaned keys of their final pass, ``last_state``), under
    the forward's ``attn_mask`` (bool or additive, or None; a key it hides gets no attention)."""
    b, n, _ = x.shape
    mask = normalise_mask(attn_mask, b, mod.num_heads, n, n)
    keep = mask
    if isinstance(mod, rnn.RPCAttention) and mod.last_state is not None:
        q = k = mod.last_state.cleaned_keys
    else:
        parts = mod.qkv(x).reshape(b, n, mod.n_proj, mod.num_heads, mod.head_dim).permute(2, 0, 3, 1, 4)
        k = parts[0] if isinstance(mod, rnn.SymmetricAttention) else parts[1]
        q = k if isinstance(mod, rnn.SymmetricAttention) else parts[0]
        if isinstance(mod, rnn.SymmetricAttention):  # a key control's clipped keys or dropped tokens
            k, dropped = mod.attention_keys(k, valid_keys(mask))
            q = k
            if dropped is not None:
                keep = dropped if keep is None else keep & dropped
    scores = mod.scale * (q @ k.transpose(-2, -1))
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


class TokenAttention:
    """Context manager: forward hooks on every :mod:`rpc_attention.nn` attention block of ``model``
    that add up, per example, the attention mass on the tokens :attr:`tokens` (``[B, k]``; set before
    each forward), as a differentiable ``[B]`` tensor per block (:attr:`masses`). PAP blocks keep
    their state during it (``keep_state``) so the final pass's cleaned keys are read."""

    def __init__(self, model: nn.Module) -> None:
        self.blocks = [m for m in model.modules() if isinstance(m, (rnn.Attention, rnn.SymmetricAttention))]
        if not self.blocks:
            raise ValueError("the attention-aware patch loss reads rpc_attention.nn attention blocks; this model has "
                             "none (drop it with --set patch.losses=ce)")
        self.tokens: Optional[Tensor] = None
        self.masses: List[Tensor] = []
        self._handles: list = []
        self._kept: Dict[int, bool] = {}

    def _hook(self, mod: nn.Module, args, kwargs, output) -> None:
        probs = _attention_probs(mod, args[0], kwargs.get("attn_mask"))
        idx = self.tokens.to(probs.device)
        on = probs.gather(-1, idx.view(-1, 1, 1, idx.shape[1]).expand(*probs.shape[:3], idx.shape[1]))
        self.masses.append(on.sum(-1).mean(dim=(1, 2)))

    def mass(self) -> Tensor:
        """``[B]``: mean over the blocks of the last forward of the mass on the tokens; clears it."""
        out = torch.stack(self.masses).mean(0)
        self.masses = []
        return out

    def __enter__(self) -> TokenAttention:
        for m in self.blocks:
            if isinstance(m, rnn.RPCAttention):
                self._kept[id(m)], m.keep_state = m.keep_state, True
            self._handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        for m in self.blocks:
            if id(m) in self._kept:
                m.keep_state, m.last_state = self._kept.pop(id(m)), None


@dataclass(frozen=True)
class PatchAttack:
    """The pixel search of one attack variant: ``steps`` signed-gradient steps of ``step_size`` on
    the patch pixels, maximising the cross-entropy plus ``attention_weight`` times the attention mass
    on the patch tokens (only with a :class:`TokenAttention` on the gradient model)."""

    steps: int = 100
    step_size: float = 0.05
    attention_weight: float = 1.0


def _forward(model: nn.Module, adv: Tensor, attention: Optional[TokenAttention], tokens: Tensor):
    """``(logits, attention mass [B] or None)`` of one forward of ``model`` on ``adv``."""
    if attention is None:
        return model(adv), None
    attention.masses, attention.tokens = [], tokens
    logits = model(adv)
    return logits, attention.mass()


def patch_pgd(judge: nn.Module, grad_model: nn.Module, x: Tensor, y: Tensor, mask: Tensor, attack: PatchAttack,
              generator: Optional[torch.Generator] = None, attention: Optional[TokenAttention] = None,
              tokens: Optional[Tensor] = None, start: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """PGD on the pixels under ``mask`` (``[B, 1, H, W]``) of the ``[0, 1]`` images ``x``.

    Gradients come from ``grad_model`` (the defended model, or a BPDA surrogate); whether an iterate
    is misclassified is judged on ``judge``. Starts from ``start`` (``[0, 1]`` images, the pixels under the
    patch are used) or from ``U(0, 1)`` patch pixels drawn from ``generator`` for the whole image, so the
    draw does not depend on where the patch is. Returns
    ``(adversarial images, broken [B])``: an example broken at some iterate keeps its first
    misclassified iterate and is not attacked further; the others get the last iterate.
    """
    x = x.detach()
    values = (torch.rand(x.shape, generator=generator) if start is None else start).to(x).clone()
    best = apply_patch(x, mask, values)
    broken = torch.zeros(len(y), dtype=torch.bool, device=x.device)
    for step in range(int(attack.steps) + 1):
        act = (~broken).nonzero().flatten()
        if len(act) == 0:
            break
        last = step == int(attack.steps)
        v = values[act].requires_grad_(not last)
        adv = apply_patch(x[act], mask[act], v)
        with torch.set_grad_enabled(not last):
            logits, mass = _forward(grad_model, adv, attention, None if tokens is None else tokens[act])
        if judge is grad_model:
            judged = logits.detach()
        else:
            with torch.no_grad():
                judged = judge(adv.detach())
        first = judged.argmax(-1) != y[act]
        best[act] = adv.detach()
        broken[act[first]] = True
        if last:
            break
        loss = F.cross_entropy(logits, y[act], reduction="sum")
        if mass is not None:
            loss = loss + float(attack.attention_weight) * mass.sum()
        (grad,) = torch.autograd.grad(loss, v)
        values[act] = (v.detach() + float(attack.step_size) * grad.sign()).clamp(0.0, 1.0)
    return best, broken


def _replacement(mod: rnn.SymmetricAttention, kind: str) -> nn.Module:
    """A block with ``mod``'s weights: plain symmetric attention, or PAP with soft shrinkage."""
    base = dict(dim=mod.dim, num_heads=mod.num_heads, qkv_bias=mod.qkv.bias is not None,
                fused_attn=mod.fused_attn)
    if kind == "symmetric":
        new: nn.Module = rnn.SymmetricAttention(**base)
    else:
        new = rnn.RPCAttention(**base, **{**mod.pap_options(), "shrink": "soft"})
    new.load_state_dict(mod.state_dict())
    return new.to(device=mod.qkv.weight.device, dtype=mod.qkv.weight.dtype).eval()


def _controlled(mod: nn.Module) -> bool:
    """A symmetric block behind a key control (clip or drop)."""
    return isinstance(mod, rnn.SymmetricAttention) and not isinstance(mod, rnn.RPCAttention) and bool(mod.key_control)


def bpda_surrogate(model: nn.Module, kind: str = "symmetric") -> nn.Module:
    """A copy of ``model`` whose every PAP block (:class:`rpc_attention.nn.RPCAttention`) is rebuilt
    with the same weights as plain symmetric attention (``kind="symmetric"``: no sparse step at all) or
    as PAP with soft shrinkage (``"soft"``: the other options kept), and whose every block behind a key
    control (``key_control``: clip or drop) is plain symmetric attention (either kind: the control
    removed); ``model`` is left unchanged."""
    if kind not in SURROGATES[1:]:
        raise ValueError(f"BPDA surrogate must be one of {', '.join(SURROGATES[1:])}, got {kind!r}")
    out = copy.deepcopy(model)
    for name, mod in list(out.named_modules()):
        if isinstance(mod, rnn.RPCAttention) or _controlled(mod):
            parent, _, child = name.rpartition(".")
            new = _replacement(mod, kind if isinstance(mod, rnn.RPCAttention) else "symmetric")
            setattr(out.get_submodule(parent) if parent else out, child, new)
    return out.eval()


def has_nondifferentiable_pap(model: nn.Module) -> bool:
    """Whether a block of ``model`` has steps without a useful gradient: a PAP block with hard shrinkage
    or a threshold from medians (``mad``) or a quantile (``target_fraction``), or a key control (the
    clipping bounds are medians, the drop mask a hard step). Soft shrinkage and the mean-based thresholds
    (the official options) are differentiable almost everywhere."""
    return any((isinstance(m, rnn.RPCAttention) and (m.shrink == "hard" or m.threshold in ("mad", "target_fraction")))
               or _controlled(m) for m in model.modules())


@dataclass(frozen=True)
class Variant:
    """One attack variant: its loss (``ce`` or ``attention``) and where its gradient comes from
    (``model``: the defended model; ``bpda``: the surrogate)."""

    loss: str
    gradient: str = "model"

    @property
    def name(self) -> str:
        return self.loss if self.gradient == "model" else f"{self.loss}_bpda"


def attack_variants(model: nn.Module, opts: Mapping[str, Any]) -> Tuple[List[Variant], Optional[nn.Module], str]:
    """The variants to run, the BPDA surrogate (None when none runs) and a note on the BPDA setting."""
    use_bpda = opts["bpda"] != "none" and has_nondifferentiable_pap(model)
    gradients = ["model"] + (["bpda"] if use_bpda else [])
    variants = [Variant(loss, g) for g in gradients for loss in opts["losses"]]
    if opts["bpda"] == "none":
        note = "not run (bpda=none)"
    elif not use_bpda:
        note = ("not run: no PAP block with a hard threshold or a median / quantile threshold and no key control, "
                "the gradients through the model are exact (almost everywhere)")
    else:
        note = (f"surrogate: every PAP block as {'symmetric attention' if opts['bpda'] == 'symmetric' else 'soft-shrinkage PAP'}"
                ", every key control removed")
    return variants, (bpda_surrogate(model, opts["bpda"]) if use_bpda else None), note


def _attack_examples(judge: nn.Module, grad_model: nn.Module, x: Tensor, y: Tensor, k: int, grid: PatchGrid,
                     variant: Variant, opts: Mapping[str, Any], seed: int) -> Tensor:
    """``[N]`` bool: which examples (all correct on the clean image) survive one variant with ``k``
    patches: every location of :func:`candidate_cells` and every restart there misses them. The start of
    restart ``r`` at the ``l``-th location is drawn for the whole chunk from a generator seeded by
    ``(seed, l, r)`` and indexed by example, so it does not depend on which examples are still alive."""
    device, bs = opts["device"], int(opts["batch_size"])
    attack = PatchAttack(int(opts["steps"]), float(opts["step_size"]), float(opts["attention_weight"]))
    survived = []
    for sl in chunks(len(y), bs, desc=f"patch k={k} {variant.name}"):
        xb, yb = x[sl].to(device), y[sl].to(device)
        alive = torch.ones(len(yb), dtype=torch.bool)
        locations = candidate_cells(cell_saliency(grad_model, xb, yb, grid), k)
        attention = TokenAttention(grad_model) if variant.loss == "attention" else None
        with attention if attention is not None else contextlib.nullcontext():
            for loc in range(locations.shape[1]):
                for restart in range(int(opts["restarts"])):
                    idx = alive.nonzero().flatten()
                    if len(idx) == 0:
                        break
                    gen = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * loc + restart)
                    start = torch.rand(xb.shape, generator=gen)[idx]
                    cells = locations[idx, loc]
                    mask = cell_mask(cells, grid, xb)
                    _, broken = patch_pgd(judge, grad_model, xb[idx], yb[idx], mask, attack, None, attention,
                                          cells + grid.prefix, start=start)
                    alive[idx[broken.cpu()]] = False
        survived.append(alive)
    return torch.cat(survived) if survived else torch.zeros(0, dtype=torch.bool)


def _percent(hits: Tensor) -> float:
    """100 x the share of True in ``hits``, exactly (from the counts, not a float32 mean)."""
    return 100.0 * int(hits.sum()) / max(len(hits), 1)


@torch.no_grad()
def _clean_hits(scorer: nn.Module, x: Tensor, y: Tensor, bs: int, device: str) -> Tensor:
    return torch.cat([top1_hits(scorer(x[sl].to(device)).float().cpu(), y[sl]) for sl in chunks(len(y), bs, "patch clean")])


def _patch_counts(opts: Mapping[str, Any], grid: PatchGrid) -> List[int]:
    ks = [int(k) for k in opts["patches"]]
    if max(ks) > grid.cells:
        raise ValueError(f"patch.patches: {max(ks)} patches do not fit on the model's {grid.rows}x{grid.cols} grid "
                         f"of {grid.patch}-pixel patches")
    return ks


def _run_k(k: int, models: Tuple[nn.Module, Optional[nn.Module]], x: Tensor, y: Tensor, alive: Dict[str, Tensor],
           grid: PatchGrid, variants: List[Variant], opts: Mapping[str, Any], record: PerExample):
    """``(row, metrics)`` of ``k`` patches: top-1 (%) under each variant and the per-example worst case.
    ``alive[variant]``: the examples each variant has not broken with fewer patches (the clean hits at
    first); only those are attacked, and the entry is narrowed to the survivors."""
    judge, surrogate = models
    worst, row, metrics = None, {"patches": k}, {}
    for i, variant in enumerate(variants):
        grad_model = judge if variant.gradient == "model" else surrogate
        survived = alive[variant.name].clone()
        idx = survived.nonzero().flatten()
        if len(idx):
            survived[idx] = _attack_examples(judge, grad_model, x[idx], y[idx], k, grid, variant, opts,
                                             int(opts["seed"]) * 1009 + 101 * k + i)
        alive[variant.name] = survived
        name = f"{top1_patches(k)}_{variant.name}"
        record.add(name, survived)
        record.metric(name, [name])
        metrics[name] = row[variant.name] = _percent(survived)
        worst = survived.clone() if worst is None else worst & survived
    record.add(top1_patches(k), worst)
    record.metric(top1_patches(k), [top1_patches(k)])
    metrics[top1_patches(k)] = row["worst case"] = _percent(worst)
    return row, metrics


def patch_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device, bs = opts["device"], int(opts["batch_size"])
    model.to(device).eval()
    x, y = load_eval_data(cfg, "test", opts.get("limit"))
    if len(y) == 0:
        raise ValueError("the evaluation split is empty")
    stats = norm_stats(cfg, x.shape[1])
    judge = Normalized(model, *stats).to(device)
    grid = patch_grid(model, tuple(x.shape))
    ks = _patch_counts(opts, grid)
    variants, surrogate, bpda_note = attack_variants(model, opts)
    surrogate_image = None if surrogate is None else Normalized(surrogate, *stats).to(device)
    record = PerExample(eval_indices(cfg, "test", opts.get("limit")))
    clean = _clean_hits(judge, x, y, bs, device)
    record.add("clean", clean)
    record.metric(CLEAN_TOP1, ["clean"])
    metrics: Dict[str, float] = {CLEAN_TOP1: _percent(clean)}
    rows = []
    # fewer patches first: an image broken with k patches is broken with more (an extra patch may copy the
    # clean pixels under it), so only the survivors are attacked again and the result falls with k
    alive = {v.name: clean.clone() for v in variants}
    for k in sorted(ks):
        row, m = _run_k(k, (judge, surrogate_image), x, y, alive, grid, variants, opts, record)
        rows.append(row)
        metrics.update(m)
    return {"metrics": metrics, "rows": rows, "n_examples": len(y), "per_example": record.as_dict(),
            "data": {"dataset": data_name(cfg), "split": "test", "n_examples": len(y)},
            "settings": {"patch_size": grid.patch, "grid": f"{grid.rows}x{grid.cols}", "bpda": bpda_note,
                         "variants": [v.name for v in variants], "space": "pixel [0,1]"},
            "protocol": (f"top-1 (%) under k adversarial patches on the {grid.patch}-pixel patch grid (pixels free in "
                         "[0,1]; location: every cell for one patch, every set of cells among the most salient half for "
                         "several; PGD with signed steps from seeded random starts; "
                         "cross-entropy and Patch-Fool attention losses; gradients through the model and BPDA "
                         "through a surrogate); an example counts under its worst variant")}


@dataclass(frozen=True)
class PatchOptions(CommonOptions):
    """Numbers of patches (one result each), the PGD budget (``steps`` of ``step_size``, ``restarts``
    random starts at every location of the search), the losses (``ce``, ``attention``), the weight of the attention term and
    the BPDA surrogate of PAP blocks (``symmetric``, ``soft`` or ``none``)."""

    limit: Optional[int] = 500
    patches: List[float] = list_option([1.0, 2.0])
    steps: int = 100
    restarts: int = 1
    step_size: float = 0.05
    losses: List[str] = list_option(list(LOSSES))
    attention_weight: float = 1.0
    bpda: str = "symmetric"

    def __post_init__(self) -> None:
        super().__post_init__()
        if (not self.patches or any(float(k) != int(k) or int(k) < 1 for k in self.patches)
                or len(set(self.patches)) != len(self.patches)):
            raise ValueError(f"patch.patches: distinct numbers of patches, whole numbers >= 1, got {self.patches}")
        if int(self.steps) < 1 or int(self.restarts) < 1 or not float(self.step_size) > 0:
            raise ValueError(f"patch.steps and patch.restarts must be >= 1 and patch.step_size > 0, got "
                             f"{self.steps}, {self.restarts}, {self.step_size}")
        bad = [x for x in self.losses if x not in LOSSES]
        if bad or not self.losses or len(set(self.losses)) != len(self.losses):
            raise ValueError(f"patch.losses: a list of distinct losses from {', '.join(LOSSES)}, got {self.losses}")
        if self.bpda not in SURROGATES:
            raise ValueError(f"patch.bpda must be one of {', '.join(SURROGATES)}, got {self.bpda!r}")
        if not float(self.attention_weight) >= 0:
            raise ValueError(f"patch.attention_weight must be >= 0, got {self.attention_weight}")


register_suite(
    "patch", patch_suite, options=PatchOptions,
    description="adversarial patches on the patch grid (k = 1, 2), adaptive: CE and Patch-Fool losses, gradients "
                "through PAP and BPDA; worst case per example",
    metrics=(CLEAN_TOP1, top1_patches(1), top1_patches(2)), cost=Cost(3, 1600, per_step=16.0),
    columns=(Column("vision", top1_patches(1), "adaptive 1-patch top-1 (%)", position=95),
             Column("vision", top1_patches(2), "adaptive 2-patch top-1 (%)", position=96)),
    study=StudyUse(limit="patch_limit", steps=True, extra_sets="patch_sets", models="patch_models"))
