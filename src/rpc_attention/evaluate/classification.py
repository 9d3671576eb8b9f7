"""Clean accuracy and adversarial-attack suites for image classifiers (docs/method.md#adversarial-attacks).

Suites: ``clean`` (top-1/top-5), ``fgsm``, ``pgd``, ``spsa``, ``sld``, ``cw``, ``noise``,
``autoattack``, ``square``.  Every attack suite takes ``space=pixel|official`` (see
:mod:`rpc_attention.evaluate.attacks`) and an ``eps`` list (``--set pgd.eps=1:6/255`` or
``--set eps=1/255,4/255`` for all selected suites), and reports top-1/top-5 under attack for each eps,
the clean accuracy of the same examples and the largest perturbation actually used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from .attacks import SPACES, InputSpace, get_attack, make_attack
from .inputs import data_name, eval_batches, eval_indices, norm_stats, num_classes_of
from .per_example import PerExample
from .predict import top1_hits, topk_correct
from .suites import Column, CommonOptions, Cost, StudyUse, eps_option, register_suite

SWEEP = "1:6/255"

# The summary metrics of these suites (percent); an eps sweep adds ``top1@<eps>`` per budget.
TOP1, TOP5, ERROR = "top1", "top5", "error"
CLEAN_TOP1, MEAN_TOP1 = "clean_top1", "mean_top1"


def top1_at(eps_label: str) -> str:
    """The metric of top-1 under attack at one budget, e.g. ``top1_at("1/255")`` = ``"top1@1/255"``."""
    return f"{TOP1}@{eps_label}"


def _data_record(cfg: Mapping[str, Any], n: int, split: str = "test") -> Dict[str, Any]:
    from ..data.images import eval_split_name

    # an ImageFolder tree without a test folder is evaluated on its val folder, and says so
    return {"dataset": data_name(cfg), "split": eval_split_name(dict(cfg), split), "n_examples": n}


def clean_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device = opts["device"]
    model.to(device).eval()
    n, batches = eval_batches(cfg, "test", opts.get("limit"), int(opts["batch_size"]), desc="clean")
    hits = {1: 0, 5: 0}
    classes = 0
    scorer = None
    record = PerExample(eval_indices(cfg, "test", opts.get("limit")))
    for xb, yb in batches():
        if scorer is None:
            scorer = InputSpace(model, *norm_stats(cfg, xb.shape[1]), "pixel").image_model
        with torch.no_grad():
            logits = scorer(xb.to(device)).float().cpu()
        right = top1_hits(logits, yb)
        record.add("clean", right)
        hits[1] += int(right.sum())
        hits[5] += topk_correct(logits, yb, (5,))[5]
        classes = logits.shape[-1]
    if n == 0:
        raise ValueError("the evaluation split is empty")
    m = {TOP1: 100.0 * hits[1] / n, TOP5: 100.0 * hits[5] / n, ERROR: 100.0 - 100.0 * hits[1] / n}
    if classes <= 5:  # top-5 of five classes or fewer is 100 % by construction: not reported
        del m[TOP5]
    record.metric(TOP1, ["clean"])
    record.metric(ERROR, ["clean"], error=True)
    return {"metrics": m, "data": _data_record(cfg, n), "n_examples": n, "per_example": record.as_dict(),
            "protocol": f"top-1{'/top-5' if TOP5 in m else ''} accuracy (%) on the un-attacked evaluation split"}


def _eps_label(eps: Optional[float], norm: str = "Linf") -> str:
    if eps is None:
        return "-"
    if norm != "Linf":
        return f"{eps:g}"
    k = eps * 255
    return f"{round(k)}/255" if abs(k - round(k)) < 1e-6 else f"{eps:g}"


def _clean_pass(model: nn.Module, cfg: Mapping[str, Any], space_name: str, batches, device: str,
                record: PerExample):
    """``(input space, examples right, number of classes)`` on the clean examples the attack will use;
    each example's correctness goes into ``record`` as the ``clean`` setting (metric ``clean_top1``)."""
    space, right_total, n_out = None, 0, None
    for xb, yb in batches():
        if space is None:
            space = InputSpace(model, *norm_stats(cfg, xb.shape[1]), space_name)
        with torch.no_grad():
            logits = space.image_model(xb.to(device)).float().cpu()
        n_out = logits.shape[-1]
        right = top1_hits(logits, yb)
        record.add("clean", right)
        right_total += int(right.sum())
    record.metric(CLEAN_TOP1, ["clean"])
    return space, right_total, n_out


def _attacked_pass(attack, space: InputSpace, scorer: nn.Module, batches, device: str, norm: str,
                   record: PerExample, setting: str):
    """Attack every batch once: ``(top-1 hits, top-5 hits, largest L-inf change, per-example L1/L2
    norms, largest excursion outside [0, 1])``; each example's correctness goes into ``record``."""
    hit1 = hit5 = 0
    max_linf = out_of_range = 0.0
    norms: List[torch.Tensor] = []
    for xb, yb in batches():
        xb, yb = xb.to(device), yb.to(device)
        ref = space.to_space(xb)
        adv = attack(xb, yb)
        with torch.no_grad():
            logits = scorer(adv).float()
        right = top1_hits(logits.cpu(), yb.cpu())
        record.add(setting, right)
        hit1 += int(right.sum())
        hit5 += topk_correct(logits.cpu(), yb.cpu(), (5,))[5]
        d = (adv - ref).flatten(1).float()
        max_linf = max(max_linf, float(d.abs().max()) if d.numel() else 0.0)
        norms.append(d.norm(p=1 if norm == "L1" else 2, dim=1).cpu())
        if space.name == "pixel":
            out_of_range = max(out_of_range, float(adv.min().clamp(max=0).neg()), float((adv.max() - 1).clamp(min=0)))
    return hit1, hit5, max_linf, norms, out_of_range


def _attack_suite(name: str, protocol: str, norm: str):
    def fn(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
        device = opts["device"]
        model.to(device).eval()
        if opts["space"] not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}, got {opts['space']!r}")
        bs = int(opts["batch_size"])
        n, batches = eval_batches(cfg, "test", opts.get("limit"), bs, desc=f"{name} clean")
        if n == 0:
            raise ValueError("the evaluation split is empty")
        record = PerExample(eval_indices(cfg, "test", opts.get("limit")))
        space, clean_right, n_out = _clean_pass(model, cfg, opts["space"], batches, device, record)
        scorer = space.space_model()
        n_classes = num_classes_of(model, cfg) or int(n_out)
        eps_list: List[Optional[float]] = list(opts["eps"]) if "eps" in opts else [None]
        rows, metrics = [], {CLEAN_TOP1: 100.0 * clean_right / n}
        for eps in eps_list:
            attack = make_attack(name, space, eps, opts, n_classes=n_classes)
            label = _eps_label(eps, norm) if space.name == "pixel" else f"{eps:g}"
            _, batches = eval_batches(cfg, "test", opts.get("limit"), bs, desc=f"{name} eps={label}")
            hit1, hit5, max_linf, norms, out_of_range = _attacked_pass(
                attack, space, scorer, batches, device, norm, record, label if eps is not None else "attacked")
            nrm = torch.cat(norms)
            row: Dict[str, Any] = {}
            if eps is not None:
                row["eps"] = label
            row["top1"] = 100.0 * hit1 / n
            if n_classes > 5:  # top-5 of five classes or fewer is 100 % by construction: not reported
                row["top5"] = 100.0 * hit5 / n
            row.update({"max_linf": max_linf, f"mean_{'l1' if norm == 'L1' else 'l2'}": float(nrm.mean())})
            rows.append(row)
            key = TOP1 if eps is None else top1_at(label)
            metrics[key] = row["top1"]
            record.metric(key, [label if eps is not None else "attacked"])
            if out_of_range > 1e-6:  # cannot happen in pixel space; recorded if it ever does
                metrics["pixel_range_violation"] = out_of_range
        if len(eps_list) > 1:
            metrics[MEAN_TOP1] = sum(r["top1"] for r in rows) / len(rows)
            record.metric(MEAN_TOP1, [r["eps"] for r in rows])
        proto = get_attack(name).protocol(opts) or protocol
        settings = {"norm": norm, "eps_units": "pixel [0,1]" if space.name == "pixel" else "normalised",
                    "clipping": "[0,1]" if space.name == "pixel" else "none"}
        return {"metrics": metrics, "rows": rows, "data": _data_record(cfg, n), "n_examples": n,
                "protocol": f"{proto} ({space.name} space)", "settings": settings, "per_example": record.as_dict()}

    fn.__name__ = f"{name}_suite"
    return fn


@dataclass(frozen=True)
class AttackOptions(CommonOptions):
    """Base of the attack suites' options: the input space (pixel or official), the margin of the official
    space and, by default, 1000 examples; each attack adds its budget (``eps``) and its own parameters."""

    limit: Optional[int] = 1000
    space: str = "pixel"
    official_margin: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.space not in SPACES:
            raise ValueError(f"--set space={self.space}: choose pixel or official")


@dataclass(frozen=True)
class FgsmOptions(AttackOptions):
    limit: Optional[int] = None
    eps: List[float] = eps_option(SWEEP)


@dataclass(frozen=True)
class PgdOptions(AttackOptions):
    eps: List[float] = eps_option(SWEEP)
    steps: int = 20
    step_ratio: float = 0.15
    random_start: bool = True
    keep_best: bool = True


@dataclass(frozen=True)
class SpsaOptions(AttackOptions):
    eps: List[float] = eps_option("1/255")
    steps: int = 10
    n_samples: int = 128
    delta: float = 0.01
    lr: float = 0.01
    max_batch_size: int = 64


@dataclass(frozen=True)
class SldOptions(AttackOptions):
    eps: List[float] = eps_option("10")
    steps: int = 20
    step_size: float = 1.0
    grad_sparsity: float = 99.0
    rand_init: bool = False
    clip_grad: bool = False


@dataclass(frozen=True)
class CwOptions(AttackOptions):
    """Carlini-Wagner has no budget: no ``eps``."""

    c: float = 1.0
    kappa: float = 0.0
    steps: int = 50
    lr: float = 0.01


@dataclass(frozen=True)
class NoiseOptions(FgsmOptions):
    pass


@dataclass(frozen=True)
class SquareOptions(AttackOptions):
    eps: List[float] = eps_option("1/255")
    n_queries: int = 5000
    p_init: float = 0.8


@dataclass(frozen=True)
class AutoAttackOptions(AttackOptions):
    eps: List[float] = eps_option("1/255")
    steps: int = 100
    targets: int = 9
    n_queries: int = 5000


_CLEAN_COLUMNS = tuple(
    c for table in ("vision", "fan", "scaled") for c in (
        Column(table, TOP1, "clean top-1 (%)", paper={"vision": "clean", "fan": "fan_clean"}.get(table), position=10),
        Column(table, TOP5, "clean top-5 (%)", position=11)))
_STRONG = StudyUse(limit="strong_attack_limit")
_SWEEP_METRICS = (CLEAN_TOP1, MEAN_TOP1)

register_suite("clean", clean_suite, description="clean top-1/top-5 accuracy",
               metrics=(TOP1, TOP5, ERROR), cost=Cost(1, 0), columns=_CLEAN_COLUMNS)
register_suite(
    "fgsm", _attack_suite("fgsm", "FGSM (torchattacks), untargeted, cross-entropy", "Linf"),
    options=FgsmOptions, description="FGSM L-inf sweep",
    metrics=_SWEEP_METRICS, cost=Cost(7, 6, per_eps=1), curve=True,
    columns=(Column("vision", MEAN_TOP1, "FGSM top-1, mean over eps (%)", paper="fgsm", position=20),
             Column("fan", MEAN_TOP1, "FGSM top-1, mean over eps (%)", position=20)),
    study=StudyUse(limit="attack_limit", sweep=True))
register_suite(
    "pgd", _attack_suite("pgd", "PGD L-inf (ours), untargeted, cross-entropy, random start, an example broken at "
                                "its first misclassified iterate (keep_best)", "Linf"),
    options=PgdOptions,
    description="PGD L-inf sweep, 20 steps of 0.15 eps, random start",
    metrics=_SWEEP_METRICS, cost=Cost(7, 6 * 20, per_eps=20), curve=True,
    columns=(Column("vision", MEAN_TOP1, "PGD top-1, mean over eps (%)", paper="pgd", position=30),
             Column("fan", MEAN_TOP1, "PGD top-1, mean over eps (%)", position=30)),
    study=StudyUse(limit="attack_limit", sweep=True, steps=True))
register_suite(
    "autoattack",
    _attack_suite("autoattack", "AutoAttack standard: APGD-CE, APGD-T, FAB-T, Square (torchattacks components)", "Linf"),
    options=AutoAttackOptions,
    description="AutoAttack (standard version), L-inf", metrics=(CLEAN_TOP1, top1_at("1/255")), cost=Cost(1, 400),
    columns=(Column("vision", top1_at("1/255"), "AutoAttack top-1 (%)", paper="autoattack", position=40),), study=_STRONG)
register_suite(
    "square", _attack_suite("square", "Square attack L-inf (torchattacks), margin loss", "Linf"),
    options=SquareOptions,
    description="Square attack (score-based, L-inf)", metrics=(CLEAN_TOP1, top1_at("1/255")), cost=Cost(1000, 0),
    columns=(Column("vision", top1_at("1/255"), "Square top-1 (%)", paper="square", position=50),), study=_STRONG)
register_suite(
    "noise", _attack_suite("noise", "uniform L-inf noise U(-eps, eps) (ours), seeded", "Linf"),
    options=NoiseOptions, description="uniform noise sweep",
    metrics=_SWEEP_METRICS, cost=Cost(7, 0, per_eps=0), curve=True,
    columns=(Column("vision", MEAN_TOP1, "uniform noise top-1 (%)", position=60),), study=_STRONG)
register_suite(
    "spsa", _attack_suite("spsa", "SPSA L-inf (torchattacks, gradient-free, margin loss, Adam)", "Linf"),
    options=SpsaOptions,
    description="SPSA gradient-free L-inf attack", metrics=(CLEAN_TOP1, top1_at("1/255")),
    cost=Cost(1, 2 * 128 * 10 // 8), study=_STRONG)
register_suite(
    "sld", _attack_suite("sld", "sparse L1 descent (ours, cleverhans algorithm), cross-entropy", "L1"),
    options=SldOptions,
    description="sparse L1 descent (L1 ball)", metrics=(CLEAN_TOP1, top1_at("10")), cost=Cost(2, 20), study=_STRONG)
register_suite(
    "cw", _attack_suite("cw", "Carlini-Wagner L2 (torchattacks), unbounded, c fixed", "L2"),
    options=CwOptions,
    description="Carlini-Wagner L2 (no budget: report accuracy and mean L2)", metrics=(CLEAN_TOP1, TOP1),
    cost=Cost(2, 50), study=_STRONG)
