"""Sparse corruption, the kind PAP is designed for: suite ``sparse`` (docs/robustness.md#sparse-corruption).

Three corruptions, each touching a small share of the input, on the same test images:

* **salt-and-pepper pixels**: a share of the pixels (default 2, 5 and 10 %) set to black or white
  (probability 1/2 each, all channels of the pixel);
* **patch occlusion**: 1, 2 or 4 distinct patches of the model's patch size, on its patch grid (so
  exactly that many tokens are corrupted), filled with ``occlusion_fill`` (0.5, mid grey);
* **key corruption**: test-time sparse corruption of the keys of the first attention block, the
  ``pap-demo`` setting inside a trained model: a forward hook on that block's ``qkv`` projection adds
  ``+-key_magnitude`` (5; a list gives a dose-response) standard deviations of the example's clean keys
  (``key_per_head``: of each head's keys) to a random ``key_fraction`` (5 %) of its key entries
  (random sign). In a symmetric model the queries are the keys, so they move too. When that block runs
  PAP, the precision and recall of its sparse term's support against the corrupted entries are
  recorded (``key_sparse``).

Every draw is seeded by ``(seed, corruption, level, example index)``, so a result does not depend on
the batching or the device. Metrics: top-1 (%) clean and under each setting, and two means kept apart
because they measure different things: ``mean_top1_input`` over the input-level settings
(salt-and-pepper, occlusion: what a deployed model meets) and ``mean_top1_keys`` over the key
corruptions (a synthetic test of the mechanism: corruption injected into block 1's keys in exactly
the sparse form robust PCA assumes).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import Tensor, nn

from .. import nn as rnn
from .inputs import Normalized, data_name, eval_indices, load_eval_data, norm_stats
from .per_example import PerExample
from .predict import top1_hits
from .suites import Column, CommonOptions, Cost, StudyUse, list_option, register_suite

MEAN_TOP1_INPUT = "mean_top1_input"  # mean top-1 (%) over the input-level settings (salt-and-pepper, occlusion)
MEAN_TOP1_KEYS = "mean_top1_keys"  # mean top-1 (%) over the key-corruption magnitudes (block-1 keys)

__all__ = ["salt_and_pepper", "occlude_patches", "KeyCorruption", "SparseSupport", "first_attention", "sparse_suite"]


def _generator(seed: int, kind: str, level: float, index: int) -> torch.Generator:
    tag = zlib.crc32(f"{kind}:{level:g}".encode())
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + tag * 7919 + int(index)) % (2 ** 63))


def salt_and_pepper(x: Tensor, fraction: float, seed: int = 0, offset: int = 0) -> Tensor:
    """Images ``[N, C, H, W]`` in [0, 1] with ``round(fraction * H * W)`` pixels of each set to 0 or 1
    (all channels). Image ``i`` is seeded by ``(seed, fraction, offset + i)``."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"salt-and-pepper fraction must be in [0, 1], got {fraction}")
    n, c, h, w = x.shape
    count = int(round(fraction * h * w))
    out = x.clone()
    for i in range(n):
        g = _generator(seed, "salt_pepper", fraction, offset + i)
        where = torch.randperm(h * w, generator=g)[:count]
        value = torch.randint(0, 2, (count,), generator=g).to(x.dtype)
        out[i].view(c, h * w)[:, where] = value.to(x.device)
    return out


def occlude_patches(x: Tensor, n_patches: int, patch: int, fill: float = 0.5, seed: int = 0, offset: int = 0) -> Tensor:
    """Images with ``n_patches`` distinct ``patch x patch`` squares of the patch grid set to ``fill``."""
    n, c, h, w = x.shape
    rows, cols = h // patch, w // patch
    if not 0 <= n_patches <= rows * cols:
        raise ValueError(f"cannot occlude {n_patches} of the {rows * cols} patches of {patch} px")
    out = x.clone()
    for i in range(n):
        g = _generator(seed, "occlusion", n_patches, offset + i)
        for cell in torch.randperm(rows * cols, generator=g)[:n_patches].tolist():
            r, q = divmod(cell, cols)
            out[i, :, r * patch:(r + 1) * patch, q * patch:(q + 1) * patch] = fill
    return out


def first_attention(model: nn.Module) -> Tuple[str, nn.Module, int]:
    """``(name, module, key slot)`` of the first attention block with a fused ``qkv`` projection
    (rpc_attention.nn modules and timm ``Attention``); the key slot is the index of the keys among the
    projection's chunks (0 of (k, v) in symmetric blocks, 1 of (q, k, v) otherwise)."""
    for name, mod in model.named_modules():
        qkv = getattr(mod, "qkv", None)
        if not isinstance(qkv, nn.Linear) or not hasattr(mod, "num_heads"):
            continue
        if isinstance(mod, rnn.SymmetricAttention):  # RPCAttention too: (k, v)
            return name, mod, 0
        if qkv.out_features % 3 == 0:  # (q, k, v): asymmetric, scaled, timm
            return name, mod, 1
    raise ValueError("key corruption needs an attention block with a fused qkv projection (rpc_attention.nn "
                     "attention or timm Attention); none found in this model; drop it with --set sparse.key_fraction=0")


class KeyCorruption:
    """Context manager: adds ``+-magnitude * std(k)`` to a random ``fraction`` of the key entries of
    the first attention block of ``model`` (per example, seeded by ``(seed, offset + i)``; set
    :attr:`offset` to the index of the batch's first example before each forward). ``per_head``: the
    std of each head's keys instead of all the example's keys. The entries hit in the last forward
    are :attr:`last_hit`, shaped as the block's ``(B, H, N, head_dim)`` keys."""

    def __init__(self, model: nn.Module, fraction: float, magnitude: float, seed: int = 0,
                 per_head: bool = False) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"key_fraction must be in (0, 1], got {fraction}")
        self.name, self.module, self.slot = first_attention(model)
        self.fraction, self.magnitude, self.seed, self.offset = float(fraction), float(magnitude), int(seed), 0
        self.per_head, self.last_hit = bool(per_head), None
        self._handle = None

    def _scale(self, keys: Tensor) -> Tensor:
        """The std the corruption is measured in: of all keys ``(n, C)``, or per head, broadcast to them."""
        if not self.per_head:
            return keys.std()
        n, width = keys.shape
        heads = int(self.module.num_heads)
        per_head = keys.reshape(n, heads, width // heads).transpose(0, 1).reshape(heads, -1).std(dim=1)
        return per_head.repeat_interleave(width // heads).reshape(1, width)

    def _hook(self, mod: nn.Module, args, output: Tensor) -> Tensor:
        b, n, width = output.shape
        parts = output.reshape(b, n, -1, width // (3 if self.slot == 1 else 2))
        keys = parts[:, :, self.slot]
        out = parts.clone()
        hits = []
        for i in range(b):
            g = _generator(self.seed, "keys", self.fraction, self.offset + i)
            hit = torch.rand(keys.shape[1:], generator=g) < self.fraction
            sign = torch.randint(0, 2, keys.shape[1:], generator=g) * 2 - 1
            noise = (hit * sign).to(keys.device, keys.dtype) * self.magnitude * self._scale(keys[i])
            out[i, :, self.slot] = keys[i] + noise
            hits.append(hit)
        heads = int(self.module.num_heads)
        self.last_hit = torch.stack(hits).reshape(b, n, heads, -1).transpose(1, 2)
        return out.reshape(b, n, width)

    def __enter__(self) -> KeyCorruption:
        self._handle = self.module.qkv.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class SparseSupport:
    """Context manager beside a :class:`KeyCorruption` of a PAP block: after each forward, counts how
    many of the entries PAP's final sparse term S takes were corrupted (precision) and how many
    corrupted entries S takes (recall). Nothing is counted for a block that does not run PAP."""

    def __init__(self, corruption: KeyCorruption) -> None:
        self.corruption, self.module = corruption, corruption.module
        self.active = isinstance(self.module, rnn.RPCAttention)
        self.found = self.hit = self.both = 0
        self._handle, self._kept = None, False

    def _hook(self, mod: nn.Module, args, output) -> None:
        state, hit = mod.last_state, self.corruption.last_hit
        if state is None or hit is None:
            return
        taken = (state.sparse != 0).cpu()
        self.found += int(taken.sum())
        self.hit += int(hit.sum())
        self.both += int((taken & hit).sum())

    def scores(self) -> Dict[str, Any]:
        if not self.active:
            return {}
        return {"precision": self.both / self.found if self.found else None,
                "recall": self.both / self.hit if self.hit else None,
                "s_entries": self.found, "corrupted_entries": self.hit}

    def __enter__(self) -> SparseSupport:
        if self.active:
            self._kept, self.module.keep_state = self.module.keep_state, True
            self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
            self.module.keep_state, self.module.last_state = self._kept, None


def _patch_size(model: nn.Module, cfg: Mapping[str, Any]) -> int:
    pe = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if pe is None:
        pe = ((cfg.get("model") or {}).get("kwargs") or {}).get("patch_size")
    if pe is None:
        raise ValueError("patch occlusion needs the model's patch size (model.patch_embed.patch_size or "
                         "model.kwargs.patch_size in the run config); this model has neither")
    return int(pe[0] if isinstance(pe, (tuple, list)) else pe)


def _settings(opts: Mapping[str, Any]) -> List[Tuple[str, str, float]]:
    out = [("salt-and-pepper", f"{100 * float(f):g}% of pixels", float(f)) for f in opts.get("salt_pepper") or []]
    out += [("patch occlusion", f"{int(k)} patch{'es' if int(k) != 1 else ''}", int(k)) for k in opts.get("occlusion") or []]
    frac, mags = float(opts.get("key_fraction") or 0), _magnitudes(opts)
    scale = "std of each head's keys" if opts.get("key_per_head") else "std"
    for mag in mags if frac > 0 else []:
        out.append(("key corruption", f"{100 * frac:g}% of block-1 keys, +-{mag:g} {scale}",
                    (frac, mag) if len(mags) > 1 else frac))
    return out


def _magnitudes(opts: Mapping[str, Any]) -> List[float]:
    raw = opts.get("key_magnitude")
    return [float(m) for m in (raw if isinstance(raw, (list, tuple)) else [raw])]


def _metric_name(kind: str, level) -> str:
    """``top1_keys@5%`` for one key magnitude, ``top1_keys@5%x20std`` for each of several."""
    short = {"salt-and-pepper": "salt_pepper", "patch occlusion": "occlusion", "key corruption": "keys"}[kind]
    if isinstance(level, tuple):
        return f"top1_{short}@{100 * level[0]:g}%x{level[1]:g}std"
    return f"top1_{short}@{level:g}" if kind == "patch occlusion" else f"top1_{short}@{100 * level:g}%"


def _key_setting(model: nn.Module, level, opts: Mapping[str, Any], seed: int, top1) -> Tuple[float, Dict[str, Any]]:
    """Top-1 under one key corruption (``top1(corrupt)``), and S's support scores of a PAP block."""
    frac, mag = level if isinstance(level, tuple) else (level, _magnitudes(opts)[0])
    with KeyCorruption(model, frac, mag, seed, bool(opts.get("key_per_head"))) as kc, SparseSupport(kc) as support:
        def at(xb, start):
            kc.offset = start
            return xb
        acc = top1(at)
    return acc, support.scores()


def sparse_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device = opts["device"]
    model.to(device).eval()
    seed, bs = int(opts.get("seed") or 0), int(opts["batch_size"])
    x, y = load_eval_data(cfg, "test", opts.get("limit"))
    n = len(y)
    if n == 0:
        raise ValueError("the evaluation split is empty")
    scorer = Normalized(model, *norm_stats(cfg, x.shape[1])).to(device)
    settings = _settings(opts)
    patch = _patch_size(model, cfg) if any(k == "patch occlusion" for k, _, _ in settings) else None

    record = PerExample(eval_indices(cfg, "test", opts.get("limit")))

    @torch.no_grad()
    def top1(corrupt, setting: str) -> float:
        hits = 0
        for start in range(0, n, bs):
            xb = corrupt(x[start:start + bs], start)
            right = top1_hits(scorer(xb.to(device)).float().cpu(), y[start:start + bs])
            record.add(setting, right)
            hits += int(right.sum())
        return 100.0 * hits / n

    clean = top1(lambda xb, start: xb, "clean")
    metrics: Dict[str, float] = {"top1_clean": clean}
    record.metric("top1_clean", ["clean"])
    rows: List[Dict[str, Any]] = [{"corruption": "none (clean)", "level": "-", "top1": clean, "drop": 0.0}]
    key_sparse: Dict[str, Dict[str, Any]] = {}  # S precision / recall of a PAP first block per key setting
    for kind, label, level in settings:
        name = _metric_name(kind, level)
        if kind == "salt-and-pepper":
            acc = top1(lambda xb, start, p=level: salt_and_pepper(xb, p, seed, start), name)
        elif kind == "patch occlusion":
            fill = float(opts["occlusion_fill"])
            acc = top1(lambda xb, start, n=int(level), f=fill: occlude_patches(xb, n, patch, f, seed, start), name)
        else:
            acc, scores = _key_setting(model, level, opts, seed, lambda corrupt, name=name: top1(corrupt, name))
            if scores:
                key_sparse[name] = scores
                for what in ("precision", "recall"):
                    if scores[what] is not None:
                        metrics[f"s_{what}_{name[len('top1_'):]}"] = scores[what]
        metrics[name] = acc
        record.metric(name, [name])
        rows.append({"corruption": kind, "level": label, "top1": acc, "drop": clean - acc})
    _declare_means(metrics, record, settings)
    return {"metrics": metrics, "rows": rows, "n_examples": n, "per_example": record.as_dict(),
            "data": {"dataset": data_name(cfg), "split": "test", "n_examples": n},
            "settings": {"patch_size": patch}, "key_sparse": key_sparse,
            "protocol": ("top-1 (%) under sparse corruption: salt-and-pepper pixels, patch occlusion on the patch "
                         "grid (mean_top1_input), and +-magnitude std added to a random share of the first attention "
                         "block's keys (mean_top1_keys: a synthetic test of the mechanism, corruption in exactly the "
                         "sparse form robust PCA assumes); seeded per example")}


def _declare_means(metrics: Dict[str, float], record: PerExample, settings: List[Tuple[str, str, float]]) -> None:
    """``mean_top1_input`` over the input-level settings and ``mean_top1_keys`` over the key corruptions,
    each where the suite ran such a setting; never one mean over both (they measure different things)."""
    for mean, keys in ((MEAN_TOP1_INPUT, False), (MEAN_TOP1_KEYS, True)):
        names = [_metric_name(kind, level) for kind, _, level in settings if (kind == "key corruption") == keys]
        if names:
            metrics[mean] = sum(metrics[k] for k in names) / len(names)
            record.metric(mean, names)


def _check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    for f in opts.get("salt_pepper") or []:
        if not 0.0 <= float(f) <= 1.0:
            raise ValueError(f"sparse.salt_pepper: fractions must be in [0, 1], got {f} (e.g. 0.02,0.05,0.1)")
    for k in opts.get("occlusion") or []:
        if float(k) != int(k) or int(k) < 0:
            raise ValueError(f"sparse.occlusion: patch counts must be whole numbers >= 0, got {k} (e.g. 1,2,4)")
    kf = float(opts.get("key_fraction") or 0)
    mags = _magnitudes(opts)
    if not 0.0 <= kf <= 1.0 or not mags or not all(math.isfinite(m) for m in mags):
        raise ValueError(f"sparse.key_fraction must be in [0, 1] (0 skips it) and key_magnitude finite numbers "
                         f"(e.g. 5,20,100), got {kf}, {opts.get('key_magnitude')}")
    if len(set(mags)) != len(mags):
        raise ValueError(f"sparse.key_magnitude lists a magnitude twice: {mags}")
    if opts.get("key_per_head") and kf == 0:
        raise ValueError("sparse.key_per_head scales the key corruption, which sparse.key_fraction=0 leaves out")


@dataclass(frozen=True)
class SparseOptions(CommonOptions):
    """Fractions of salt-and-pepper pixels, numbers of occluded patches (and their grey level), and the
    share and sizes (in key standard deviations, one setting per size) of the corrupted block-1 keys (0:
    skipped), measured per example or, with ``key_per_head``, per head."""

    salt_pepper: List[float] = list_option([0.02, 0.05, 0.10])
    occlusion: List[float] = list_option([1.0, 2.0, 4.0])
    occlusion_fill: float = 0.5
    key_fraction: float = 0.05
    key_magnitude: List[float] = list_option([5.0])
    key_per_head: bool = False


register_suite(
    "sparse", sparse_suite,
    options=SparseOptions,
    description="sparse corruption: salt-and-pepper pixels, patch occlusion, sparse key corruption in block 1",
    check=_check, metrics=(MEAN_TOP1_INPUT, MEAN_TOP1_KEYS), cost=Cost(8, 0),
    columns=(Column("vision", MEAN_TOP1_INPUT, "salt-and-pepper / occlusion top-1, mean (%)", position=90),
             Column("vision", MEAN_TOP1_KEYS, "block-1 key corruption top-1, mean (%; synthetic)", position=91)),
    study=StudyUse(limit="sparse_limit", extra_sets="sparse_sets"))
