"""The certified patch defence: suite ``certify`` (docs/robustness.md#certified-patch-defence).

Double masking (PatchCleanser, Xiang et al., USENIX Security 2022) on the masks of
:func:`rpc_attention.evaluate.masking.mask_set`, which cover the threat: every patch of the threat lies
entirely inside at least one mask.

* **Decision** (:func:`double_masking`). Round 1: predict with every single mask; when all agree, that
  label. Otherwise every mask whose label differs from round 1's majority (a disagreeing mask, in mask
  order) is tried: predict with every pair (that mask, another mask); the first one whose two-mask
  predictions all equal its own label gives the output. When none does, round 1's majority (ties: the
  smallest label).
* **Certificate** (:func:`certified`). An example is certified when the prediction with every pair of
  masks, the same mask twice included (a single mask), is its label. Then no patch of the threat
  changes the decision: the mask ``m*`` that holds the patch hides it, so every prediction that uses
  ``m*`` is the clean one, the label. If round 1 agrees, it agrees on ``m*``'s label. A disagreeing mask
  with another label is rejected, because its pair with ``m*`` gives the label. If the majority is not
  the label, ``m*`` itself disagrees and is accepted (all its pairs give the label), unless an earlier
  mask was, whose pair with ``m*`` made its label the label too.
* **Realisation.** A mask drops its cells as tokens, left out of the sequence (``masking=tokens``;
  :class:`rpc_attention.evaluate.masking.MaskedClassifier`; the attack's gradients run on the equal
  full-length passes with the dropped tokens hidden by the key mask), or, for comparison,
  sets their pixels to ``fill`` (``masking=pixels``). All the masked copies of an image run in batches.
* **Adaptive attack on the defended classifier** (``attack_steps > 0``; on the patch threat, whose
  positions include the token-aligned ones): at every patch position (every ``attack_stride`` pixels
  along each axis and the last position), PGD on the patch pixels maximising the mean over the single masks of the
  cross-entropy, or of it plus the Patch-Fool attention mass on the patch's tokens, with gradients
  through the masked forward passes of the model or of its BPDA surrogate (as the ``patch`` suite's
  variants: :func:`rpc_attention.evaluate.patch.bpda_surrogate`); the discrete decision itself is the
  judge: an example is broken when the double-masking decision on the final iterate is wrong. By the
  certificate a certified example cannot be broken, so the attack runs on the uncertified examples the
  defence classifies correctly (``attack_certified=true`` runs it on the certified ones too: a broken
  certified example is a bug).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .inputs import data_name, eval_indices, load_eval_data, norm_stats
from .masking import MASKINGS, THREATS, MaskedClassifier, MaskSet, mask_set, touched_cells
from .patch import PatchGrid, TokenAttention, Variant, apply_patch, attack_variants, patch_grid
from .per_example import PerExample
from .predict import chunks
from .suites import Column, CommonOptions, Cost, StudyUse, list_option, register_suite

CLEAN_TOP1 = "clean_top1"


def certified_metric(threat: str) -> str:
    """Certified top-1 (%) under ``threat`` (``certified_top1_patch``, ``certified_top1_token``)."""
    return f"certified_top1_{threat}"


def defended_metric(threat: str) -> str:
    """Top-1 (%) of the double-masking decision on clean images, with ``threat``'s masks."""
    return f"defended_top1_{threat}"


def attacked_metric(threat: str) -> str:
    """Top-1 (%) of the double-masking decision under the adaptive attack of ``threat``."""
    return f"attacked_top1_{threat}"


def mask_pairs(count: int) -> Tuple[Tensor, Tensor]:
    """``(first, second)``: the ``count (count + 1) / 2`` pairs ``i <= j`` of masks (``i == j``: one mask)."""
    first, second = torch.triu_indices(count, count)
    return first, second


@torch.no_grad()
def pair_predictions(model: MaskedClassifier, x: Tensor, masks: MaskSet, batch_size: int,
                     device: str) -> Tensor:
    """``[B, M, M]`` (long, symmetric): the prediction on each image of ``x`` with each pair of masks
    dropped together (the diagonal: one mask), every masked copy batched ``batch_size`` at a time. The
    copies run pair by pair, the pairs in order of how many cells they drop, so that a batch's shortened
    sequences (:class:`~rpc_attention.evaluate.masking.MaskedClassifier`) mostly have one length."""
    first, second = mask_pairs(masks.count)
    union = masks.dropped[first] | masks.dropped[second]          # [P, cells]
    order = torch.sort(union.sum(1), stable=True).indices
    preds = torch.empty(len(x), len(first), dtype=torch.long)
    for sl in chunks(len(x) * len(first), batch_size, desc=f"certify {masks.threat}"):
        idx = torch.arange(sl.start, sl.stop)
        img, pair = idx % len(x), order[idx // len(x)]
        preds[img, pair] = model(x[img].to(device), union[pair].to(device)).argmax(-1).cpu()
    table = torch.empty(len(x), masks.count, masks.count, dtype=torch.long)
    table[:, first, second] = preds
    table[:, second, first] = preds
    return table


def double_masking(table: Tensor, num_classes: int) -> Tuple[Tensor, Tensor]:
    """``(labels [B], forward passes [B])`` of the double-masking decision from a pair table ``[B, M, M]``
    (:func:`pair_predictions`). The passes count what the decision alone runs: ``M`` single masks, and
    ``M - 1`` pairs for each disagreeing mask tried before one is accepted (all of them when none is)."""
    count = table.shape[1]
    singles = table.diagonal(dim1=1, dim2=2)                               # [B, M]
    votes = F.one_hot(singles, num_classes).sum(1)                         # [B, C]
    majority = votes.argmax(-1)                                            # ties: the smallest label
    disagree = singles != majority[:, None]
    consistent = (table == singles[:, :, None]).all(-1)                    # all pairs of mask i give its label
    accepted = disagree & consistent
    has = accepted.any(-1)
    first = torch.where(has, accepted.float().argmax(-1), torch.full_like(majority, count))
    labels = torch.where(has, singles.gather(1, first.clamp(max=count - 1)[:, None])[:, 0], majority)
    order = torch.arange(count)[None, :]
    tried = (disagree & (order <= first[:, None])).sum(-1)
    return labels, count + tried * (count - 1)


def certified(table: Tensor, y: Tensor) -> Tensor:
    """Bool ``[B]``: the prediction with every pair of masks (single masks included) is the label ``y``."""
    return (table == y.view(-1, 1, 1)).flatten(1).all(-1)


# ------------------------------------------------------------------------------------------------ attack
@dataclass(frozen=True)
class DefenceAttack:
    """PGD on the patch pixels against the masked forward passes: ``steps`` signed steps of ``step_size``
    from ``U(0, 1)``, maximising the mean over single masks of the cross-entropy plus
    ``attention_weight`` times the attention mass on the patch's tokens (the ``attention`` loss)."""

    steps: int = 20
    step_size: float = 0.05
    attention_weight: float = 1.0


def attack_positions(grid: PatchGrid, masks: MaskSet, stride: int, image_hw: Tuple[int, int]) -> List[Tuple[int, int]]:
    """Pixel positions ``(top, left)`` of the patch the attack tries: the token threat, every grid cell;
    the patch threat, every ``stride`` pixels along each axis (0: the token size) and the last position."""
    if masks.threat == "token":
        return [(r * grid.patch, c * grid.patch) for r in range(grid.rows) for c in range(grid.cols)]
    step = int(stride) or grid.patch
    axes = []
    for n in image_hw:
        last = n - masks.pixels
        starts = list(range(0, last + 1, step))
        if starts[-1] != last:
            starts.append(last)
        axes.append(starts)
    return [(t, left) for t in axes[0] for left in axes[1]]


def _defence_pgd(grad_model: MaskedClassifier, attention: Optional[TokenAttention], x: Tensor, y: Tensor,
                 patch: Tensor, tokens: Tensor, masks: MaskSet, attack: DefenceAttack,
                 generator: torch.Generator) -> Tensor:
    """The final PGD iterate (``[B, C, H, W]``) against the mean over single masks of the loss; ``patch``
    ``[B, 1, H, W]`` is each image's patch, ``tokens`` ``[B, k]`` the tokens it touches."""
    count = masks.count
    dropped = masks.dropped.to(x.device).repeat(len(y), 1)                 # image-major: [B * M, cells]
    labels = y.repeat_interleave(count)
    tokens = tokens.repeat_interleave(count, 0)
    values = torch.rand(x.shape, generator=generator).to(x)
    for _ in range(int(attack.steps)):
        v = values.requires_grad_(True)
        adv = apply_patch(x, patch, v)
        if attention is not None:
            attention.masses, attention.tokens = [], tokens
        logits = grad_model(adv.repeat_interleave(count, 0), dropped)
        loss = F.cross_entropy(logits, labels, reduction="sum") / count
        if attention is not None:
            loss = loss + float(attack.attention_weight) * attention.mass().sum() / count
        (grad,) = torch.autograd.grad(loss, v)
        values = (v.detach() + float(attack.step_size) * grad.sign()).clamp(0.0, 1.0)
    return apply_patch(x, patch, values).detach()


@torch.no_grad()
def defended_predictions(model: MaskedClassifier, x: Tensor, masks: MaskSet, batch_size: int, device: str,
                         num_classes: int) -> Tensor:
    """``[B]``: the double-masking decision as deployed: the single masks first, the pairs only for the
    images whose single masks disagree (the same labels as :func:`double_masking` on the full table)."""
    count = masks.count
    singles = torch.empty(len(x), count, dtype=torch.long)
    flat = singles.view(-1)
    for sl in chunks(len(x) * count, batch_size):
        idx = torch.arange(sl.start, sl.stop)
        flat[sl] = model(x[idx // count].to(device), masks.dropped[idx % count].to(device)).argmax(-1).cpu()
    labels = singles[:, 0].clone()
    split = (singles != singles[:, :1]).any(-1).nonzero().flatten()
    if len(split):
        labels[split] = double_masking(pair_predictions(model, x[split], masks, batch_size, device), num_classes)[0]
    return labels


def _position_groups(grid: PatchGrid, masks: MaskSet,
                     positions: List[Tuple[int, int]]) -> Dict[int, List[Tuple[int, int, Tensor]]]:
    """The positions with the tokens their patch touches, grouped by how many (one attention loss shape)."""
    groups: Dict[int, List[Tuple[int, int, Tensor]]] = {}
    for top, left in positions:
        tokens = touched_cells(grid, top, left, masks.pixels).nonzero().flatten() + grid.prefix
        groups.setdefault(len(tokens), []).append((top, left, tokens))
    return groups


def attack_defence(judge: MaskedClassifier, grad_models: Dict[str, MaskedClassifier], x: Tensor, y: Tensor,
                   masks: MaskSet, variants: List[Variant], positions: List[Tuple[int, int]],
                   attack: DefenceAttack, opts: Mapping[str, Any], num_classes: int, seed: int) -> Tensor:
    """Bool ``[N]``: which examples keep the right double-masking decision at every position under every
    variant. The (example, position) pairs run in batches of ``batch_size / masks`` (each pair is
    ``masks`` masked copies); an example is attacked until it is broken."""
    device, bs = opts["device"], int(opts["batch_size"])
    per_batch = max(1, bs // masks.count)
    alive = torch.ones(len(y), dtype=torch.bool)
    h, w = x.shape[-2:]
    groups = _position_groups(judge.grid, masks, positions)
    for vi, variant in enumerate(variants):
        model = grad_models[variant.gradient]
        if variant.loss == "attention" and model.gather:
            raise ValueError(f"the attention loss indexes the patch's tokens in the full sequence: the "
                             f"{variant.gradient!r} gradient model must keep it (MaskedClassifier(..., gather=False))")
        gen = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * vi)
        for size in sorted(groups):
            group = groups[size]
            pairs = [(e, p) for p in range(len(group)) for e in range(len(y))]     # position-major
            start = 0
            while start < len(pairs):
                batch = [pr for pr in pairs[start:] if alive[pr[0]]][:per_batch]
                if not batch:
                    break
                start = pairs.index(batch[-1], start) + 1
                ex = torch.tensor([e for e, _ in batch])
                patch = torch.zeros(len(batch), 1, h, w)
                for i, (_, p) in enumerate(batch):
                    top, left, _ = group[p]
                    patch[i, :, top:top + masks.pixels, left:left + masks.pixels] = 1.0
                tokens = torch.stack([group[p][2] for _, p in batch])
                xb, yb = x[ex].to(device), y[ex].to(device)
                # the attention hooks only while the gradient model runs (the judge may be the same model)
                attention = TokenAttention(model.model) if variant.loss == "attention" else None
                with attention if attention is not None else contextlib.nullcontext():
                    adv = _defence_pgd(model, attention, xb, yb, patch.to(xb), tokens.to(device), masks, attack, gen)
                labels = defended_predictions(judge, adv.cpu(), masks, bs, device, num_classes)
                alive[ex[labels != y[ex]]] = False
    return alive


# ------------------------------------------------------------------------------------------------ suite
def _percent(hits: Tensor) -> float:
    return 100.0 * int(hits.sum()) / max(len(hits), 1)


@torch.no_grad()
def _clean_hits(model: MaskedClassifier, x: Tensor, y: Tensor, bs: int, device: str) -> Tensor:
    none = torch.zeros(1, model.grid.cells, dtype=torch.bool)
    return torch.cat([model(x[sl].to(device), none.expand(sl.stop - sl.start, -1)).argmax(-1).cpu() == y[sl]
                      for sl in chunks(len(y), bs, "certify clean")])


def _run_threat(threat: str, models: Tuple[MaskedClassifier, Dict[str, MaskedClassifier]], x: Tensor, y: Tensor,
                grid: PatchGrid, variants: List[Variant], opts: Mapping[str, Any], num_classes: int,
                record: PerExample) -> Tuple[Dict[str, Any], Dict[str, float], str]:
    judge, grad_models = models
    masks = mask_set(grid, threat, int(opts["patch_pixels"]) if threat == "patch" else 0, int(opts["masks_per_axis"]))
    table = pair_predictions(judge, x, masks, int(opts["batch_size"]), opts["device"])
    labels, passes = double_masking(table, num_classes)
    defended, cert = labels == y, certified(table, y)
    row: Dict[str, Any] = {"threat": threat, "masks": masks.count, "defended top-1": _percent(defended),
                           "certified top-1": _percent(cert)}
    metrics = {defended_metric(threat): _percent(defended), certified_metric(threat): _percent(cert)}
    for name, hits in ((defended_metric(threat), defended), (certified_metric(threat), cert)):
        record.add(name, hits)
        record.metric(name, [name])
    if int(opts["attack_steps"]) > 0 and threat == "patch":
        target = defended if opts["attack_certified"] else defended & ~cert
        idx = target.nonzero().flatten()
        survived = defended.clone()
        attack = DefenceAttack(int(opts["attack_steps"]), float(opts["attack_step_size"]),
                               float(opts["attention_weight"]))
        positions = attack_positions(grid, masks, int(opts["attack_stride"]), tuple(x.shape[-2:]))
        if len(idx):
            survived[idx] = attack_defence(judge, grad_models, x[idx], y[idx], masks, variants, positions, attack,
                                           opts, num_classes, int(opts["seed"]) * 31 + THREATS.index(threat))
        broken_certified = int((cert & ~survived).sum())
        if broken_certified:
            raise RuntimeError(f"{broken_certified} certified example(s) broken by the attack on the {threat} threat: "
                               "the certificate or the masking is wrong")
        name = attacked_metric(threat)
        record.add(name, survived)
        record.metric(name, [name])
        metrics[name] = row["attacked top-1"] = _percent(survived)
        row["attack positions"] = len(positions)
    metrics[f"forward_passes_{threat}"] = float(passes.float().mean())
    metrics[f"certify_passes_{threat}"] = float(masks.count * (masks.count + 1) // 2)
    row["passes: defence (mean)"] = metrics[f"forward_passes_{threat}"]
    row["passes: certificate"] = metrics[f"certify_passes_{threat}"]
    return row, metrics, masks.describe()


def certify_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device = opts["device"]
    model.to(device).eval()
    x, y = load_eval_data(cfg, "test", opts.get("limit"))
    if len(y) == 0:
        raise ValueError("the evaluation split is empty")
    stats = norm_stats(cfg, x.shape[1])
    grid = patch_grid(model, tuple(x.shape))
    judge = MaskedClassifier(model, *stats, grid, opts["masking"], float(opts["fill"])).to(device)
    num_classes = int(model.num_classes)
    # the attack differentiates the full-length masked passes: the attention loss indexes tokens by place
    keyed = {"gather": False} if opts["masking"] == "tokens" else {}
    grad_models: Dict[str, MaskedClassifier] = {
        "model": MaskedClassifier(model, *stats, grid, opts["masking"], float(opts["fill"]), **keyed).to(device)}
    variants: List[Variant] = []
    bpda_note = "no attack (attack_steps=0)"
    if int(opts["attack_steps"]) > 0:
        variants, surrogate, bpda_note = attack_variants(model, {"bpda": opts["bpda"], "losses": opts["losses"]})
        if surrogate is not None:
            grad_models["bpda"] = MaskedClassifier(surrogate, *stats, grid, opts["masking"], float(opts["fill"]),
                                                   **keyed).to(device)
    record = PerExample(eval_indices(cfg, "test", opts.get("limit")))
    clean = _clean_hits(judge, x, y, int(opts["batch_size"]), device)
    record.add("clean", clean)
    record.metric(CLEAN_TOP1, ["clean"])
    metrics: Dict[str, float] = {CLEAN_TOP1: _percent(clean)}
    rows, described = [], {}
    for threat in opts["threats"]:
        row, m, described[threat] = _run_threat(threat, (judge, grad_models), x, y, grid, variants, opts,
                                                num_classes, record)
        rows.append(row)
        metrics.update(m)
    return {"metrics": metrics, "rows": rows, "n_examples": len(y), "per_example": record.as_dict(),
            "data": {"dataset": data_name(cfg), "split": "test", "n_examples": len(y)},
            "settings": {"grid": f"{grid.rows}x{grid.cols}", "token_pixels": grid.patch, "masks": described,
                         "variants": [v.name for v in variants], "bpda": bpda_note},
            "threat_model": {t: described[t] for t in opts["threats"]},
            "protocol": ("double masking (PatchCleanser) with masks dropped as "
                         + ("tokens left out of the sequence" if opts["masking"] == "tokens" else
                            f"pixels set to {float(opts['fill']):g}")
                         + "; certified: every two-mask prediction is the label, a lower bound on top-1 under any "
                           "patch of the threat; defended: the double-masking decision on clean images")}


@dataclass(frozen=True)
class CertifyOptions(CommonOptions):
    """The threats (``patch``: one square of ``patch_pixels`` pixels anywhere, 0 = the token size;
    ``token``: one token replaced), the mask set (``masks_per_axis``, 0 = stride 1), how a mask is
    realised (``masking``: ``tokens`` dropped through the key mask, or ``pixels`` set to ``fill``) and the
    adaptive attack on the defended classifier (``attack_steps`` > 0 runs it; ``attack_stride`` pixels
    between patch positions, 0 = the token size; ``losses``, ``bpda``, ``attention_weight`` as the
    ``patch`` suite's; ``attack_certified``: attack the certified examples too)."""

    limit: Optional[int] = 500
    threats: List[str] = list_option(list(THREATS))
    patch_pixels: int = 0
    masks_per_axis: int = 0
    masking: str = "tokens"
    fill: float = 0.0
    attack_steps: int = 0
    attack_step_size: float = 0.05
    attack_stride: int = 0
    attack_certified: bool = False
    losses: List[str] = list_option(["ce", "attention"])
    attention_weight: float = 1.0
    bpda: str = "symmetric"

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [t for t in self.threats if t not in THREATS]
        if bad or not self.threats or len(set(self.threats)) != len(self.threats):
            raise ValueError(f"certify.threats: distinct threats from {', '.join(THREATS)}, got {self.threats}")
        if self.masking not in MASKINGS:
            raise ValueError(f"certify.masking must be one of {', '.join(MASKINGS)}, got {self.masking!r}")
        if self.masking == "tokens" and float(self.fill) != 0.0:
            raise ValueError(f"certify.fill={self.fill} fills masked pixels: it needs certify.masking=pixels")
        if not 0.0 <= float(self.fill) <= 1.0:
            raise ValueError(f"certify.fill must be a pixel value in [0, 1], got {self.fill}")
        if int(self.patch_pixels) < 0 or int(self.masks_per_axis) < 0 or int(self.attack_stride) < 0:
            raise ValueError(f"certify.patch_pixels, masks_per_axis and attack_stride must be >= 0 (0: the default), "
                             f"got {self.patch_pixels}, {self.masks_per_axis}, {self.attack_stride}")
        if int(self.patch_pixels) and "patch" not in self.threats:
            raise ValueError(f"certify.patch_pixels={self.patch_pixels} sizes the patch threat, which "
                             f"certify.threats={','.join(self.threats)} leaves out")
        if int(self.attack_steps) < 0 or not float(self.attack_step_size) > 0:
            raise ValueError(f"certify.attack_steps must be >= 0 and attack_step_size > 0, got {self.attack_steps}, "
                             f"{self.attack_step_size}")
        attack_only = {"attack_stride": 0, "attack_certified": False, "attack_step_size": 0.05,
                       "losses": ["ce", "attention"], "attention_weight": 1.0, "bpda": "symmetric"}
        if int(self.attack_steps) == 0:
            changed = [k for k, v in attack_only.items() if getattr(self, k) != v]
            if changed:
                raise ValueError(f"certify.{changed[0]} sets the attack, which certify.attack_steps=0 does not run")
        bad = [x for x in self.losses if x not in ("ce", "attention")]
        if bad or not self.losses or len(set(self.losses)) != len(self.losses):
            raise ValueError(f"certify.losses: distinct losses from ce, attention, got {self.losses}")
        if self.bpda not in ("none", "symmetric", "soft"):
            raise ValueError(f"certify.bpda must be one of none, symmetric, soft, got {self.bpda!r}")


register_suite(
    "certify", certify_suite, options=CertifyOptions,
    description="certified patch defence (double masking, tokens dropped through the key mask): certified and "
                "defended top-1 against one patch anywhere and one token",
    metrics=(CLEAN_TOP1, certified_metric("patch"), certified_metric("token"), defended_metric("patch"),
             defended_metric("token")),
    cost=Cost(181, 0),
    columns=(Column("vision", certified_metric("patch"), "certified top-1, 1 patch anywhere (%)", position=97),),
    study=StudyUse(limit="certify_limit", extra_sets="certify_sets", models="certify_models"))
