"""Layer-level robustness of attention to sparse key corruption (docs/robustness.md#layer-level-benchmark).

For keys ``k`` and values ``v`` (float64, ``(B, H, N, d)``) and a sparse corruption ``s`` (a share
``density`` of the entries, random sign, ``magnitude`` standard deviations of the example's keys), every
method ``A`` gets the relative output change ``r = ||A(k + s) - A(k)|| / ||A(k)||`` (Frobenius norm over
all examples and heads; the values stay fixed), as a dose-response over magnitudes and densities.

Methods: PAP variants (named option sets of :func:`rpc_attention.functional.pap_attention`) and three
controls computed on the same draws:

* ``symmetric``: plain symmetric attention on the corrupted keys;
* ``clip``: symmetric attention on keys clipped to ``median +- c * 1.4826 MAD`` (per batch, head and
  feature the median over tokens; the robust scale of :func:`rpc_attention.functional.robust_scale`);
* ``oracle``: knows which entries are corrupted and replaces them by the per-feature median over
  tokens of the uncorrupted entries, then symmetric attention (the floor of an entrywise repair).

For every method also the clean-key deviation ``||A(k) - A_sym(k)|| / ||A_sym(k)||`` and the key error
``||k_used - k|| / ||k||`` (the keys the final attention used: for PAP the cleaned keys K2); for PAP
variants the precision and recall of ``supp(S)`` against ``supp(s)``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import functional as RF

CONTROLS = ("symmetric", "clip", "oracle")
PAP_DEFAULTS: Dict[str, Any] = {"n_iter": 6, "lambd": 4.0}
_NUMBERS = {"n_iter": int, "lambd": float, "dual_step": float, "tol": float, "model_dim": int}
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


# The official PAP and the best variant of docs/robustness.md.
DEFAULT_VARIANTS = ("official", "robust=threshold:mad,lambd:6,lowrank:keys,shrink:hard,dual_step:0,n_iter:2")


def _generator(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + zlib.crc32(tag.encode())) % (2 ** 63))


def corrupt_keys(keys: Tensor, density: float, magnitude: float, seed: int = 0) -> Tuple[Tensor, Tensor]:
    """``(k + s, supp(s))``: ``s`` is ``+-magnitude * std(k_b)`` on a random share ``density`` of the
    entries of example ``b`` (``std`` over its heads, tokens and features), 0 elsewhere. Seeded by
    ``(seed, density, magnitude)``."""
    g = _generator(seed, f"keys:{density:g}:{magnitude:g}")
    hit = torch.rand(keys.shape, generator=g, dtype=torch.float64) < density
    sign = torch.randint(0, 2, keys.shape, generator=g).to(keys.dtype) * 2 - 1
    std = keys.flatten(1).std(dim=1).reshape(-1, 1, 1, 1)
    return keys + hit.to(keys.dtype) * sign * magnitude * std, hit


def _feature_median(keys: Tensor, drop: Optional[Tensor] = None) -> Tensor:
    x = keys if drop is None else keys.masked_fill(drop, float("nan"))
    return torch.nan_to_num(x.nanmedian(dim=-2, keepdim=True).values, nan=0.0)


def clip_keys(keys: Tensor, c: float) -> Tensor:
    """Keys clipped to ``median +- c * robust_scale`` (median per feature over tokens)."""
    centre, scale = _feature_median(keys), c * RF.robust_scale(keys)
    return torch.minimum(torch.maximum(keys, centre - scale), centre + scale)


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


def _cell(keys: Tensor, values: Tensor, hit: Tensor, corrupted: Tensor, clean: Dict[str, Tuple[Tensor, Tensor]],
          variants: Sequence[VariantSpec], clip: float) -> Dict[str, Dict[str, float]]:
    """Every method's metrics on one corrupted draw, against its own clean output ``clean[name]``."""
    sym = RF.symmetric_attention
    norm_k = float(torch.linalg.vector_norm(keys))
    used = {"symmetric": corrupted, "clip": clip_keys(corrupted, clip), "oracle": oracle_keys(corrupted, hit)}
    out: Dict[str, Dict[str, float]] = {}
    for name, k_used in used.items():
        out[name] = {"r": relative_change(sym(k_used, values), clean[name][0]),
                     "key_error": float(torch.linalg.vector_norm(k_used - keys)) / norm_k}
    for spec in variants:
        res, state = _pap(corrupted, values, spec.options)
        precision, recall = support_scores(state.sparse, hit)
        out[spec.name] = {"r": relative_change(res, clean[spec.name][0]), "precision": precision, "recall": recall,
                          "key_error": float(torch.linalg.vector_norm(state.cleaned_keys - keys)) / norm_k}
    return out


def _clean_outputs(keys: Tensor, values: Tensor, variants: Sequence[VariantSpec], clip: float):
    """Each method's output on the clean keys, and its deviation from symmetric attention there."""
    base = RF.symmetric_attention(keys, values)
    clean = {"symmetric": base, "clip": RF.symmetric_attention(clip_keys(keys, clip), values), "oracle": base}
    for spec in variants:
        clean[spec.name] = _pap(keys, values, spec.options)[0]
    return {name: (o, relative_change(o, base)) for name, o in clean.items()}


def robustness_grid(keys: Tensor, values: Tensor, variants: Sequence[VariantSpec], magnitudes: Sequence[float],
                    densities: Sequence[float], seed: int = 0, clip: float = 4.0,
                    progress=None) -> Dict[str, Any]:
    """The dose-response of every method on one set of keys: ``{"clean_deviation": {method: x},
    "cells": [{"density", "magnitude", "methods": {method: metrics}}]}``. ``progress`` wraps the
    list of cells (a tqdm-like callable) when given."""
    keys, values = keys.double(), values.double()
    clean = _clean_outputs(keys, values, variants, clip)
    grid = [(float(dens), float(mag)) for dens in densities for mag in magnitudes]
    cells: List[Dict[str, Any]] = []
    for dens, mag in (progress(grid) if progress else grid):
        corrupted, hit = corrupt_keys(keys, dens, mag, seed)
        cells.append({"density": dens, "magnitude": mag,
                      "methods": _cell(keys, values, hit, corrupted, clean, variants, clip)})
    return {"clean_deviation": {name: dev for name, (_, dev) in clean.items()}, "cells": cells}


def robustness_study(variants: Sequence[VariantSpec], *, run_dir=None, synthetic: Optional[Dict[str, Any]] = None,
                     magnitudes: Sequence[float] = (2, 5, 10, 30, 100), densities: Sequence[float] = (0.01, 0.05, 0.2),
                     examples: int = 64, seed: int = 0, clip: float = 4.0, progress=None) -> Dict[str, Any]:
    """:func:`robustness_grid` on synthetic keys (``synthetic``: keywords of :func:`synthetic_keys`,
    None to skip) and on the block-1 keys of a trained run (``run_dir``, None to skip)."""
    if synthetic is None and run_dir is None:
        raise ValueError("nothing to measure: give a trained run or keep the synthetic keys")
    if not magnitudes or min(magnitudes) <= 0 or not densities or not all(0 < d <= 1 for d in densities):
        raise ValueError(f"magnitudes must be > 0 and densities in (0, 1], got {list(magnitudes)} and "
                         f"{list(densities)}")
    if clip <= 0:
        raise ValueError(f"the clipping level must be > 0 robust standard deviations, got {clip}")
    sources = []
    if synthetic is not None:
        keys, values = synthetic_keys(seed=seed, **synthetic)
        label = "synthetic: rank {rank} + noise {noise:g}, {batch} x {heads} heads x {tokens} tokens x {head_dim}"
        sources.append((label.format(**{**dict(batch=16, heads=4, tokens=64, head_dim=16, rank=4, noise=0.1),
                                        **synthetic}), keys, values))
    if run_dir is not None:
        keys, values, name = run_keys(run_dir, examples)
        sources.append((f"trained run {run_dir}: {name} keys of {keys.shape[0]} test images", keys, values))
    result: Dict[str, Any] = {"seed": int(seed), "clip": float(clip), "magnitudes": [float(m) for m in magnitudes],
                              "densities": [float(d) for d in densities],
                              "variants": [{"name": v.name, "options": v.options, "describe": v.describe()}
                                           for v in variants], "sources": []}
    for label, keys, values in sources:
        grid = robustness_grid(keys, values, variants, magnitudes, densities, seed, clip, progress)
        result["sources"].append({"label": label, "shape": list(keys.shape), **grid})
    return result
