"""Layer-level robustness of attention to sparse key corruption (docs/robustness.md#layer-level-benchmark).

For keys ``k`` and values ``v`` (float64, ``(B, H, N, d)``) and a sparse corruption ``s`` (random sign,
``magnitude`` standard deviations of the example's keys), every method ``A`` gets the relative output
change ``r = ||A(k + s) - A(k)|| / ||A(k)||`` (Frobenius norm over all examples and heads; the values
stay fixed), as a dose-response over magnitudes and densities. Three patterns of corruption
(:data:`PATTERNS`): scattered ``entries`` (a share ``density`` of the entries), whole ``tokens`` (rows:
every entry of ``max(1, round(density N))`` tokens in every head, what an adversarial patch does to a
ViT's keys) and whole ``features`` (columns: every token's entry in ``max(1, round(density H d))`` of
the example's ``H d`` key features).

Methods: PAP variants (named option sets of :func:`rpc_attention.functional.pap_attention`) and four
controls computed on the same draws:

* ``symmetric``: plain symmetric attention on the corrupted keys;
* ``clip``: symmetric attention on keys clipped to ``median +- c * 1.4826 MAD`` (per batch, head and
  feature the median over tokens; the robust scale of :func:`rpc_attention.functional.robust_scale`):
  :func:`rpc_attention.functional.clip_keys`, the control the models use too;
* ``drop``: symmetric attention with the tokens whose key row is a robust outlier (the token rule of
  :func:`rpc_attention.functional.pap.outlier_rows` at ``drop`` robust deviations) masked out as keys
  (:func:`rpc_attention.functional.key_drop_mask`);
* ``oracle``: knows which entries are corrupted and replaces them by the per-feature median over
  tokens of the uncorrupted entries (0 where a whole feature is corrupted), then symmetric attention.

For every method also the clean-key deviation ``||A(k) - A_sym(k)|| / ||A_sym(k)||``, the key error
``||k_used - k|| / ||k||`` (the keys the final attention used: for PAP the cleaned keys K2) and, for
token corruption, ``r_others``: r over the tokens that were not corrupted (a corrupted token's own
output cannot be recovered from its keys); for PAP variants the precision and recall of ``supp(S)``
against ``supp(s)``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import functional as RF
from ..functional import clip_keys, key_drop_mask

__all__ = ["CONTROLS", "PATTERNS", "PAP_DEFAULTS", "VariantSpec", "parse_variant", "DEFAULT_VARIANTS",
           "corruption_support", "corrupt_keys", "oracle_keys", "relative_change", "support_scores", "synthetic_keys",
           "run_keys", "robustness_grid", "robustness_study"]

CONTROLS = ("symmetric", "clip", "drop", "oracle")
PATTERNS = ("entries", "tokens", "features")
PAP_DEFAULTS: Dict[str, Any] = {"n_iter": 6, "lambd": 4.0}
_NUMBERS = {"n_iter": int, "lambd": float, "dual_step": float, "tol": float, "model_dim": int, "row_lambd": float}
_WORDS = ("threshold", "mu_mode", "lowrank", "shrink")


@dataclass(frozen=True)
class VariantSpec:
    """A named PAP variant: ``options`` are keyword options of ``pap_attention``."""

    name: str
    options: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options.items()) or "official defaults"


def parse_variant(text: str) -> VariantSpec:
    """``NAME=key:value,key:value`` (e.g. ``robust=threshold:mad,lambd:8,lowrank:keys,shrink:hard,
    dual_step:0``) or ``NAME`` alone (the official PAP, 6 iterations, lambda 4). Options are checked
    by :func:`rpc_attention.functional.check_pap_options`; ValueError names the bad part."""
    name, _, body = text.partition("=")
    name = name.strip()
    if not name or name in CONTROLS:
        raise ValueError(f"variant {text!r}: give a name other than {CONTROLS} before '='")
    options: Dict[str, Any] = dict(PAP_DEFAULTS)
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or key not in (*_NUMBERS, *_WORDS):
            raise ValueError(f"variant {name!r}: expected key:value with key in {sorted((*_NUMBERS, *_WORDS))}, "
                             f"got {part!r}")
        try:
            options[key] = _NUMBERS[key](value) if key in _NUMBERS else value
        except ValueError:
            raise ValueError(f"variant {name!r}: {key} must be a number, got {value!r}") from None
    RF.check_pap_options(**options)
    return VariantSpec(name, options)


# The official PAP, the robust variant of docs/robustness.md, the value-space variant at lambd 8 and the
# same with the token rule (the frontier of docs/robustness.md#structured-corruption).
DEFAULT_VARIANTS = ("official", "robust=threshold:mad,lambd:6,lowrank:keys,shrink:hard,dual_step:0,n_iter:2",
                    "values8=threshold:mad,lambd:8,lowrank:values,shrink:hard,dual_step:0,n_iter:2",
                    "rows=threshold:mad,lambd:8,lowrank:values,shrink:hard,dual_step:0,n_iter:2,row_lambd:6")


def _generator(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(tag.encode())) % (2 ** 63))


def _pick(g: torch.Generator, batch: int, total: int, count: int) -> Tensor:
    """bool ``(batch, total)``: ``count`` distinct positions per example, drawn without replacement."""
    order = torch.rand(batch, total, generator=g, dtype=torch.float64).argsort(dim=1)
    return torch.zeros(batch, total, dtype=torch.bool).scatter_(1, order[:, :count], True)


def corruption_support(shape, density: float, pattern: str, g: torch.Generator) -> Tensor:
    """bool ``(B, H, N, d)``: the corrupted entries of one draw (see :data:`PATTERNS`)."""
    b, h, n, d = shape
    if pattern == "entries":
        return torch.rand(shape, generator=g, dtype=torch.float64) < density
    if pattern == "tokens":
        rows = _pick(g, b, n, max(1, round(density * n)))
        return rows[:, None, :, None].expand(b, h, n, d).clone()
    if pattern == "features":
        cols = _pick(g, b, h * d, max(1, round(density * h * d))).reshape(b, h, 1, d)
        return cols.expand(b, h, n, d).clone()
    raise ValueError(f"corruption pattern must be one of {PATTERNS}, got {pattern!r}")


def corrupt_keys(keys: Tensor, density: float, magnitude: float, seed: int = 0,
                 pattern: str = "entries") -> Tuple[Tensor, Tensor]:
    """``(k + s, supp(s))``: ``s`` is ``+-magnitude * std(k_b)`` (random sign per entry) on the entries of
    example ``b`` that ``pattern`` picks, 0 elsewhere (``std`` over the example's heads, tokens and
    features). Seeded by ``(seed, pattern, density, magnitude)``."""
    tag = f"keys:{density:g}:{magnitude:g}" if pattern == "entries" else f"{pattern}:{density:g}:{magnitude:g}"
    g = _generator(seed, tag)
    hit = corruption_support(keys.shape, density, pattern, g)
    sign = torch.randint(0, 2, keys.shape, generator=g).to(keys.dtype) * 2 - 1
    std = keys.flatten(1).std(dim=1).reshape(-1, 1, 1, 1)
    return keys + hit.to(keys.dtype) * sign * magnitude * std, hit


def _feature_median(keys: Tensor, drop: Optional[Tensor] = None) -> Tensor:
    x = keys if drop is None else keys.masked_fill(drop, float("nan"))
    return torch.nan_to_num(x.nanmedian(dim=-2, keepdim=True).values, nan=0.0)


def oracle_keys(keys: Tensor, hit: Tensor) -> Tensor:
    """The entries in ``hit`` replaced by the per-feature median over tokens of the other entries."""
    return torch.where(hit, _feature_median(keys, hit).expand_as(keys), keys)


def relative_change(new: Tensor, ref: Tensor) -> float:
    """``||new - ref|| / ||ref||`` (Frobenius over everything)."""
    return float(torch.linalg.vector_norm(new - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def support_scores(sparse: Tensor, hit: Tensor) -> Tuple[float, float]:
    """Precision and recall of ``supp(S)`` against ``hit`` (precision 1 when S is empty)."""
    found = sparse != 0
    true_pos = int((found & hit).sum())
    return true_pos / max(int(found.sum()), 1) if found.any() else 1.0, true_pos / max(int(hit.sum()), 1)


def synthetic_keys(batch: int = 16, heads: int = 4, tokens: int = 64, head_dim: int = 16, rank: int = 4,
                   noise: float = 0.1, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """Low-rank-plus-noise keys ``U W / sqrt(rank) + noise * E`` and Gaussian values (float64)."""
    g = _generator(seed, "synthetic")
    shape = (batch, heads, tokens, head_dim)
    u = torch.randn(batch, heads, tokens, rank, generator=g, dtype=torch.float64)
    w = torch.randn(batch, heads, rank, head_dim, generator=g, dtype=torch.float64)
    keys = u @ w / math.sqrt(rank) + noise * torch.randn(shape, generator=g, dtype=torch.float64)
    return keys, torch.randn(shape, generator=g, dtype=torch.float64)


def run_keys(run_dir, examples: int = 64, device: str = "cpu") -> Tuple[Tensor, Tensor, str]:
    """Keys and values of the first attention block of a trained run on its first ``examples`` test
    images (float64; the raw keys before PAP in an RPC block), and the block's name."""
    from .hooks import AttentionCapture, find_attention_modules
    from .sources import probe_from_run

    probe = probe_from_run(run_dir, limit=examples, device=device)
    modules = find_attention_modules(probe.model)
    if not modules:
        raise ValueError(f"the model of run {run_dir} has no attention block this library can capture")
    name = modules[0][0]
    with AttentionCapture(probe.model, names=[name]) as capture, torch.no_grad():
        probe.forward()
    if not capture.captures:
        raise ValueError(f"capturing {name} of run {run_dir} failed: {capture.errors}")
    cap = capture.captures[0]
    keys = cap.k_raw if cap.k_raw is not None else cap.k
    return keys.double(), cap.v.double(), name


def _pap(keys: Tensor, values: Tensor, options: Dict[str, Any]):
    return RF.pap_attention(keys, values, return_state=True, **options)


def _controls(corrupted: Tensor, values: Tensor, hit: Optional[Tensor], clip: float, drop: float):
    """``{control: (output, keys used)}`` on one set of keys (no oracle without ``hit``)."""
    sym = RF.symmetric_attention
    keep = key_drop_mask(corrupted, drop)
    clipped = clip_keys(corrupted, clip)
    out = {"symmetric": (sym(corrupted, values), corrupted), "clip": (sym(clipped, values), clipped),
           "drop": (sym(corrupted, values, attn_mask=keep), corrupted * keep.transpose(-1, -2))}
    if hit is not None:
        repaired = oracle_keys(corrupted, hit)
        out["oracle"] = (sym(repaired, values), repaired)
    return out


def _metrics(out: Tensor, clean: Tensor, k_used: Tensor, keys: Tensor, others: Optional[Tensor]) -> Dict[str, float]:
    """r, the key error and, for token corruption, r over the tokens that were not corrupted."""
    found = {"r": relative_change(out, clean),
             "key_error": float(torch.linalg.vector_norm(k_used - keys) / torch.linalg.vector_norm(keys))}
    if others is not None:
        found["r_others"] = relative_change(out[others], clean[others])
    return found


def _cell(keys: Tensor, values: Tensor, hit: Tensor, corrupted: Tensor, clean: Dict[str, Tuple[Tensor, float]],
          variants: Sequence[VariantSpec], clip: float, drop: float, pattern: str) -> Dict[str, Dict[str, float]]:
    """Every method's metrics on one corrupted draw, against its own clean output ``clean[name]``."""
    others = None
    if pattern == "tokens":  # (B, H, N, d_v) positions of the uncorrupted tokens
        others = (~hit.any(dim=-1, keepdim=True)).expand(*hit.shape[:3], values.shape[-1])
    out: Dict[str, Dict[str, float]] = {}
    for name, (res, k_used) in _controls(corrupted, values, hit, clip, drop).items():
        out[name] = _metrics(res, clean[name][0], k_used, keys, others)
    for spec in variants:
        res, state = _pap(corrupted, values, spec.options)
        precision, recall = support_scores(state.sparse, hit)
        out[spec.name] = {**_metrics(res, clean[spec.name][0], state.cleaned_keys, keys, others),
                          "precision": precision, "recall": recall}
    return out


def _clean_outputs(keys: Tensor, values: Tensor, variants: Sequence[VariantSpec], clip: float, drop: float):
    """Each method's output on the clean keys, and its deviation from symmetric attention there."""
    clean = {name: res for name, (res, _) in _controls(keys, values, None, clip, drop).items()}
    base = clean["symmetric"]
    clean["oracle"] = base
    for spec in variants:
        clean[spec.name] = _pap(keys, values, spec.options)[0]
    return {name: (o, relative_change(o, base)) for name, o in clean.items()}


def robustness_grid(keys: Tensor, values: Tensor, variants: Sequence[VariantSpec], magnitudes: Sequence[float],
                    densities: Sequence[float], seed: int = 0, clip: float = 4.0, progress=None,
                    patterns: Sequence[str] = ("entries",), drop: float = 6.0) -> Dict[str, Any]:
    """The dose-response of every method on one set of keys: ``{"clean_deviation": {method: x},
    "cells": [{"pattern", "density", "magnitude", "share", "methods": {method: metrics}}]}`` (``share``:
    the fraction of entries corrupted). ``progress`` wraps the list of cells (a tqdm-like callable)."""
    keys, values = keys.double(), values.double()
    clean = _clean_outputs(keys, values, variants, clip, drop)
    grid = [(pat, float(dens), float(mag)) for pat in patterns for dens in densities for mag in magnitudes]
    cells: List[Dict[str, Any]] = []
    for pat, dens, mag in (progress(grid) if progress else grid):
        corrupted, hit = corrupt_keys(keys, dens, mag, seed, pat)
        cells.append({"pattern": pat, "density": dens, "magnitude": mag, "share": float(hit.double().mean()),
                      "methods": _cell(keys, values, hit, corrupted, clean, variants, clip, drop, pat)})
    return {"clean_deviation": {name: dev for name, (_, dev) in clean.items()}, "cells": cells}


def _check_study(magnitudes, densities, patterns, clip: float, drop: float) -> None:
    if not magnitudes or min(magnitudes) <= 0 or not densities or not all(0 < d <= 1 for d in densities):
        raise ValueError(f"magnitudes must be > 0 and densities in (0, 1], got {list(magnitudes)} and "
                         f"{list(densities)}")
    bad = [p for p in patterns if p not in PATTERNS]
    if not patterns or bad:
        raise ValueError(f"corruption patterns must be among {PATTERNS}, got {list(patterns)}")
    if clip <= 0:
        raise ValueError(f"the clipping level must be > 0 robust standard deviations, got {clip}")
    if not 0 <= drop < math.inf:
        raise ValueError(f"the drop level must be a finite number >= 0 of robust deviations, got {drop}")


def robustness_study(variants: Sequence[VariantSpec], *, run_dir=None, synthetic: Optional[Dict[str, Any]] = None,
                     magnitudes: Sequence[float] = (2, 5, 10, 30, 100), densities: Sequence[float] = (0.01, 0.05, 0.2),
                     examples: int = 64, seed: int = 0, clip: float = 4.0, progress=None,
                     patterns: Sequence[str] = ("entries",), drop: float = 6.0) -> Dict[str, Any]:
    """:func:`robustness_grid` on synthetic keys (``synthetic``: keywords of :func:`synthetic_keys`,
    None to skip) and on the block-1 keys of a trained run (``run_dir``, None to skip)."""
    if synthetic is None and run_dir is None:
        raise ValueError("nothing to measure: give a trained run or keep the synthetic keys")
    _check_study(magnitudes, densities, patterns, clip, drop)
    sources = []
    if synthetic is not None:
        keys, values = synthetic_keys(seed=seed, **synthetic)
        label = "synthetic: rank {rank} + noise {noise:g}, {batch} x {heads} heads x {tokens} tokens x {head_dim}"
        sources.append((label.format(**{**dict(batch=16, heads=4, tokens=64, head_dim=16, rank=4, noise=0.1),
                                        **synthetic}), keys, values))
    if run_dir is not None:
        keys, values, name = run_keys(run_dir, examples)
        sources.append((f"trained run {run_dir}: {name} keys of {keys.shape[0]} test images", keys, values))
    result: Dict[str, Any] = {"seed": int(seed), "clip": float(clip), "drop": float(drop),
                              "patterns": list(patterns), "magnitudes": [float(m) for m in magnitudes],
                              "densities": [float(d) for d in densities],
                              "variants": [{"name": v.name, "options": v.options, "describe": v.describe()}
                                           for v in variants], "sources": []}
    for label, keys, values in sources:
        grid = robustness_grid(keys, values, variants, magnitudes, densities, seed, clip, progress, patterns, drop)
        result["sources"].append({"label": label, "shape": list(keys.shape), **grid})
    return result
