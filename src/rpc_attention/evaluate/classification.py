"""Clean accuracy and adversarial-attack suites for image classifiers (docs/method.md#adversarial-attacks).

Suites: ``clean`` (top-1/top-5), ``fgsm``, ``pgd``, ``spsa``, ``sld``, ``cw``, ``noise``,
``autoattack``, ``square``.  Every attack suite takes ``space=pixel|official`` (see
:mod:`rpc_attention.evaluate.attacks`) and an ``eps`` list (``--set pgd.eps=1:6/255`` or
``--set eps=1/255,4/255`` for all selected suites), and reports top-1/top-5 under attack for each eps,
the clean accuracy of the same examples and the largest perturbation actually used.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from .attacks import SPACES, InputSpace, make_attack
from .inputs import data_name, eval_batches, eval_indices, norm_stats, num_classes_of
from .per_example import PerExample
from .predict import top1_hits, topk_correct
from .suites import register_suite

SWEEP = "1:6/255"


def _data_record(cfg: Mapping[str, Any], n: int, split: str = "test") -> Dict[str, Any]:
    return {"dataset": data_name(cfg), "split": split, "n_examples": n}


def clean_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device = opts["device"]
    model.to(device).eval()
    n, batches = eval_batches(cfg, "test", opts.get("limit"), int(opts["batch_size"]), desc="clean")
    hits = {1: 0, 5: 0}
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
    if n == 0:
        raise ValueError("the evaluation split is empty")
    m = {"top1": 100.0 * hits[1] / n, "top5": 100.0 * hits[5] / n, "error": 100.0 - 100.0 * hits[1] / n}
    record.metric("top1", ["clean"])
    record.metric("error", ["clean"], error=True)
    return {"metrics": m, "data": _data_record(cfg, n), "n_examples": n, "per_example": record.as_dict(),
            "protocol": "top-1/top-5 accuracy (%) on the un-attacked evaluation split"}


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
    record.metric("clean_top1", ["clean"])
    return space, right_total, n_out


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
        rows, metrics = [], {"clean_top1": 100.0 * clean_right / n}
        for eps in eps_list:
            attack = make_attack(name, space, eps, opts, n_classes=n_classes)
            hit1 = hit5 = 0
            max_linf = 0.0
            norms: List[torch.Tensor] = []
            out_of_range = 0.0
            label = _eps_label(eps, norm) if space.name == "pixel" else f"{eps:g}"
            _, batches = eval_batches(cfg, "test", opts.get("limit"), bs, desc=f"{name} eps={label}")
            for xb, yb in batches():
                xb, yb = xb.to(device), yb.to(device)
                ref = space.to_space(xb)
                adv = attack(xb, yb)
                with torch.no_grad():
                    logits = scorer(adv).float()
                right = top1_hits(logits.cpu(), yb.cpu())
                record.add(label if eps is not None else "attacked", right)
                hit1 += int(right.sum())
                hit5 += topk_correct(logits.cpu(), yb.cpu(), (5,))[5]
                d = (adv - ref).flatten(1).float()
                max_linf = max(max_linf, float(d.abs().max()) if d.numel() else 0.0)
                norms.append(d.norm(p=1 if norm == "L1" else 2, dim=1).cpu())
                if space.name == "pixel":
                    out_of_range = max(out_of_range, float((adv.min().clamp(max=0).neg())), float((adv.max() - 1).clamp(min=0)))
            nrm = torch.cat(norms)
            row: Dict[str, Any] = {}
            if eps is not None:
                row["eps"] = label
            row.update({"top1": 100.0 * hit1 / n, "top5": 100.0 * hit5 / n,
                        "max_linf": max_linf, f"mean_{'l1' if norm == 'L1' else 'l2'}": float(nrm.mean())})
            rows.append(row)
            key = "top1" if eps is None else f"top1@{label}"
            metrics[key] = row["top1"]
            record.metric(key, [label if eps is not None else "attacked"])
            if out_of_range > 1e-6:  # cannot happen in pixel space; recorded if it ever does
                metrics["pixel_range_violation"] = out_of_range
        if len(eps_list) > 1:
            metrics["mean_top1"] = sum(r["top1"] for r in rows) / len(rows)
            record.metric("mean_top1", [r["eps"] for r in rows])
        proto = protocol
        if name == "autoattack":
            std = {"steps": 100, "targets": 9, "n_queries": 5000}
            cut = {k: opts.get(k) for k in std if opts.get(k) != std[k]}
            if cut:
                proto = ("reduced-budget AutoAttack (APGD-CE, APGD-T, FAB-T, Square; "
                         + ", ".join(f"{k}={v} instead of {std[k]}" for k, v in cut.items()) + ")")
        settings = {"norm": norm, "eps_units": "pixel [0,1]" if space.name == "pixel" else "normalised",
                    "clipping": "[0,1]" if space.name == "pixel" else "none"}
        return {"metrics": metrics, "rows": rows, "data": _data_record(cfg, n), "n_examples": n,
                "protocol": f"{proto} ({space.name} space)", "settings": settings, "per_example": record.as_dict()}

    fn.__name__ = f"{name}_suite"
    return fn


_SPACE = {"space": "pixel", "official_margin": 1.0}

register_suite("clean", clean_suite, defaults={}, description="clean top-1/top-5 accuracy")
register_suite(
    "fgsm", _attack_suite("fgsm", "FGSM (torchattacks), untargeted, cross-entropy", "Linf"),
    defaults={"eps": SWEEP, **_SPACE}, description="FGSM L-inf sweep")
register_suite(
    "pgd", _attack_suite("pgd", "PGD L-inf (ours), untargeted, cross-entropy, random start, an example broken at "
                                "its first misclassified iterate (keep_best)", "Linf"),
    defaults={"eps": SWEEP, "steps": 20, "step_ratio": 0.15, "random_start": True, "keep_best": True, "limit": 1000,
              **_SPACE},
    description="PGD L-inf sweep, 20 steps of 0.15 eps, random start")
register_suite(
    "spsa", _attack_suite("spsa", "SPSA L-inf (torchattacks, gradient-free, margin loss, Adam)", "Linf"),
    defaults={"eps": "1/255", "steps": 10, "n_samples": 128, "delta": 0.01, "lr": 0.01, "max_batch_size": 64,
              "limit": 1000, **_SPACE},
    description="SPSA gradient-free L-inf attack")
register_suite(
    "sld", _attack_suite("sld", "sparse L1 descent (ours, cleverhans algorithm), cross-entropy", "L1"),
    defaults={"eps": "10", "steps": 20, "step_size": 1.0, "grad_sparsity": 99.0, "rand_init": False,
              "clip_grad": False, "limit": 1000, **_SPACE},
    description="sparse L1 descent (L1 ball)")
register_suite(
    "cw", _attack_suite("cw", "Carlini-Wagner L2 (torchattacks), unbounded, c fixed", "L2"),
    defaults={"c": 1.0, "kappa": 0.0, "steps": 50, "lr": 0.01, "limit": 1000, **_SPACE},
    description="Carlini-Wagner L2 (no budget: report accuracy and mean L2)")
register_suite(
    "noise", _attack_suite("noise", "uniform L-inf noise U(-eps, eps) (ours), seeded", "Linf"),
    defaults={"eps": SWEEP, **_SPACE}, description="uniform noise sweep")
register_suite(
    "square", _attack_suite("square", "Square attack L-inf (torchattacks), margin loss", "Linf"),
    defaults={"eps": "1/255", "n_queries": 5000, "p_init": 0.8, "limit": 1000, **_SPACE},
    description="Square attack (score-based, L-inf)")
register_suite(
    "autoattack",
    _attack_suite("autoattack", "AutoAttack standard: APGD-CE, APGD-T, FAB-T, Square (torchattacks components)", "Linf"),
    defaults={"eps": "1/255", "steps": 100, "targets": 9, "n_queries": 5000, "limit": 1000, **_SPACE},
    description="AutoAttack (standard version), L-inf")
