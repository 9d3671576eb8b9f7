"""Model level: one training step (forward, cross-entropy, backward, AdamW step) and inference throughput.

Families (:data:`FAMILIES`), each with its baseline: vision (SymViT-tiny, RPC-SymViT-tiny 6iter/layer1
and 2iter/all-layer, the robust RPC-SymViT-tiny of the ``fmnist-rpc-symvit-robust`` preset, timm's DeiT-tiny), FAN (FAN-tiny, the asymmetric baseline, SymFAN-tiny, RPC-FAN-tiny
4iter/layer1) and language models (Symlm-small vs RPC-Symlm-small, PAP in blocks 0-3, 4 iterations).
A configuration lists the case keys of each family it runs (:class:`rpc_attention.bench.config.Config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import Config
from .measure import HeapControl, autocast, error_text, peak_bytes, progress, sdpa_backend, summary, sync, time_call


@dataclass(frozen=True)
class ModelCase:
    """A model of one family: ``key`` (what a configuration lists), the table label, the timm name or
    preset, and keyword arguments of its constructor."""

    key: str
    label: str
    name: str
    kwargs: Dict = field(default_factory=dict)
    checkpoint_iters: bool = False


def _build_vision(case: ModelCase, cfg: Config, device: torch.device) -> nn.Module:
    import timm

    from .. import models  # noqa: F401  (importing it registers the SymViT family in timm)

    kwargs = {**case.kwargs, **cfg.vision_kwargs}
    model = timm.create_model(case.name, pretrained=False, num_classes=1000, img_size=cfg.img_size, **kwargs).to(device)
    if case.checkpoint_iters:
        for m in model.modules():
            if hasattr(m, "checkpoint_iters"):
                m.checkpoint_iters = True
    return model


def _build_fan(case: ModelCase, cfg: Config, device: torch.device) -> nn.Module:
    import timm

    from .. import models  # noqa: F401  (importing it registers the FAN family in timm)

    return timm.create_model(case.name, pretrained=False, num_classes=1000, img_size=cfg.img_size,
                             **cfg.fan_kwargs).to(device)


def _build_lm(case: ModelCase, cfg: Config, device: torch.device) -> nn.Module:
    from ..models.lm import build_lm

    kw = dict(vocab_size=10000, cutoffs=[2000, 6000], context=cfg.lm_context, dropout=0.0)
    kw.update(cfg.lm_kwargs)
    kw.update(case.kwargs)
    return build_lm(case.name, **kw).to(device)


def _lm_cases(cfg: Config) -> Tuple[ModelCase, ...]:
    """The language-model cases; PAP goes into the first four blocks (fewer when the model has fewer)."""
    layers = list(range(min(4, cfg.lm_kwargs.get("n_layer", 16))))
    return (ModelCase("symlm", "Symlm-small", "symlm-small"),
            ModelCase("rpc_symlm", f"RPC-Symlm-small (PAP 4 iter, blocks {layers[0]}-{layers[-1]})", "symlm-small",
                      dict(rpc_layers=layers, n_iter=4)))


def _step_pair(model: nn.Module, device: torch.device, train_loss, infer_forward):
    """``(train, infer)`` closures: one optimizer step on ``train_loss()``, one no-grad ``infer_forward()``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def train():
        model.train()
        with autocast(device), sdpa_backend(device):
            loss = train_loss()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        model.eval()
        with torch.no_grad(), autocast(device), sdpa_backend(device):
            return infer_forward()
    return train, infer


def _vision_steps(model: nn.Module, cfg: Config, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.train_batch, 3, cfg.img_size, cfg.img_size, generator=g).to(device)
    y = torch.randint(0, 1000, (cfg.train_batch,), generator=g).to(device)
    xi = torch.randn(cfg.infer_batch, 3, cfg.img_size, cfg.img_size, generator=g).to(device)
    train, infer = _step_pair(model, device, lambda: F.cross_entropy(model(x), y), lambda: model(xi))
    return train, infer, cfg.train_batch, cfg.infer_batch


def _lm_steps(model: nn.Module, cfg: Config, device: torch.device):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, model.config.vocab_size, (cfg.lm_batch, cfg.lm_context + 1), generator=g).to(device)

    def loss():
        return model.loss(idx[:, :-1], idx[:, 1:])

    train, infer = _step_pair(model, device, loss, loss)
    ntok = cfg.lm_batch * cfg.lm_context
    return train, infer, ntok, ntok


@dataclass(frozen=True)
class Family:
    """A group of model cases timed together against ``baseline``: ``cases(cfg)`` lists every case of the
    family, ``selected(cfg)`` the keys a configuration runs, ``build`` makes a model, ``steps`` its
    ``(train, infer, train items, infer items)``."""

    name: str
    unit: str
    baseline: str
    cases: Callable[[Config], Sequence[ModelCase]]
    selected: Callable[[Config], Sequence[str]]
    build: Callable[[ModelCase, Config, torch.device], nn.Module]
    steps: Callable

    def case(self, key: str, cfg: Config) -> ModelCase:
        found = {c.key: c for c in self.cases(cfg)}
        if key not in found:
            raise KeyError(f"no {self.name} benchmark model {key!r}; known: {', '.join(found)}")
        return found[key]


_RPC_VIT = "rpc_symvit_tiny_patch16_224"
# The robust PAP of the fmnist-rpc-symvit-robust preset (docs/method.md#robust-variants) in block 0.
ROBUST_PAP = dict(rpc_layers=[0], n_iter=2, lambd=6.0, threshold="mad", lowrank="keys", shrink="hard", dual_step=0.0)
_VISION_CASES = (
    ModelCase("symvit", "SymViT-tiny", "symvit_tiny_patch16_224"),
    ModelCase("rpc6_layer1", "RPC-SymViT-tiny 6iter/layer1", _RPC_VIT, dict(rpc_layers=[0], n_iter=6)),
    ModelCase("rpc2_all", "RPC-SymViT-tiny 2iter/all-layer", _RPC_VIT, dict(rpc_layers="all", n_iter=2)),
    ModelCase("rpc6_layer1_ckpt", "RPC-SymViT-tiny 6iter/layer1 ckpt", _RPC_VIT, dict(rpc_layers=[0], n_iter=6),
              checkpoint_iters=True),
    ModelCase("rpc_robust", "RPC-SymViT-tiny robust 2iter/layer1", _RPC_VIT, ROBUST_PAP),
    ModelCase("deit", "DeiT-tiny (timm, asymmetric)", "deit_tiny_patch16_224"),
)
_FAN_CASES = (
    ModelCase("fan", "FAN-tiny (asymmetric)", "fan_tiny_12_p16_224"),
    ModelCase("symfan", "SymFAN-tiny", "symfan_tiny_12_p16_224"),
    ModelCase("rpc_fan", "RPC-FAN-tiny 4iter/layer1", "rpc_fan_tiny_12_p16_224"),
)

FAMILIES: Tuple[Family, ...] = (
    Family("vision", "images", "symvit", lambda cfg: _VISION_CASES, lambda cfg: cfg.models, _build_vision,
           _vision_steps),
    Family("fan", "images", "fan", lambda cfg: _FAN_CASES, lambda cfg: cfg.fans, _build_fan, _vision_steps),
    Family("lm", "tokens", "symlm", _lm_cases, lambda cfg: cfg.lms, _build_lm, _lm_steps),
)


def _model_row(family: Family, case: ModelCase, cfg: Config, device: torch.device) -> dict:
    model = family.build(case, cfg, device)
    train, infer, n_train, n_infer = family.steps(model, cfg, device)
    row = {"key": case.key, "model": case.label, "unit": family.unit, "train_batch_items": n_train,
           "infer_batch_items": n_infer, "train_times": [], "infer_times": [],
           "params": sum(p.numel() for p in model.parameters())}
    try:
        train()
        infer()
        sync(device)
    except Exception as exc:  # a failing model is reported in its row; the others still run
        row["error"] = error_text(exc)
    row["_train"], row["_infer"], row["_model"] = train, infer, model
    return row


def _family_rows(family: Family, cfg: Config, device: torch.device, show: bool) -> Tuple[List[dict], Optional[str]]:
    rows, note = [], None
    for key in family.selected(cfg):
        try:
            rows.append(_model_row(family, family.case(key, cfg), cfg, device))
        except (ImportError, KeyError, RuntimeError, ValueError) as exc:
            note = f"{key} skipped: {error_text(exc, 160)}"
            progress(f"[bench] {note}", show)
    return rows, note


def bench_models(cfg: Config, device: torch.device, show_progress: bool = True) -> List[dict]:
    """Time a training step and an inference call of every selected model, family by family."""
    families = []
    for family in FAMILIES:
        if not family.selected(cfg):
            continue
        rows, note = _family_rows(family, cfg, device, show_progress)
        for r in range(cfg.repeats):
            progress(f"[bench] models ({family.name}) round {r + 1}/{cfg.repeats}", show_progress)
            for row in rows:
                if "error" not in row:
                    row["train_times"].append(time_call(row["_train"], cfg.model_min_run_time))
                    row["infer_times"].append(time_call(row["_infer"], cfg.model_min_run_time))
        families.append({"family": family.name, "unit": family.unit, "baseline": family.baseline, "rows": rows,
                         "note": note})
    return families


def model_memory(families: List[dict], device: torch.device, show_progress: bool,
                 heap: Optional[HeapControl]) -> None:
    """Peak memory of one training step of every model (after all timings)."""
    for fam in families:
        progress(f"[bench] memory models ({fam['family']})", show_progress)
        for row in fam["rows"]:
            if "error" in row:
                continue
            try:
                row["train_peak_bytes"] = peak_bytes(row["_train"], device, heap)
            except RuntimeError as exc:
                row["mem_error"] = error_text(exc)


def _throughput(items: int, time: dict) -> Optional[float]:
    return items / time["median"] if time["median"] else None


def finish_models(families: List[dict]) -> None:
    """Summaries, throughputs and ratios against the family's baseline, round by round."""
    for fam in families:
        base = next((r for r in fam["rows"] if r["key"] == fam["baseline"] and "error" not in r), None)
        for row in fam["rows"]:
            row["train"], row["infer"] = summary(row["train_times"]), summary(row["infer_times"])
            row["train_throughput"] = _throughput(row["train_batch_items"], row["train"])
            row["infer_throughput"] = _throughput(row["infer_batch_items"], row["infer"])
            ratios = {}
            if base is not None and base["train_times"] and row["train_times"]:
                ratios["train_vs_base"] = summary([t / b for t, b in zip(row["train_times"], base["train_times"])])
                ratios["infer_vs_base"] = summary([t / b for t, b in zip(row["infer_times"], base["infer_times"])])
            if base is not None and base.get("train_peak_bytes") and row.get("train_peak_bytes"):
                ratios["train_peak_vs_base"] = row["train_peak_bytes"] / base["train_peak_bytes"]
            row["ratios"] = ratios
        for row in fam["rows"]:
            for key in ("_train", "_infer", "_model"):
                row.pop(key, None)
