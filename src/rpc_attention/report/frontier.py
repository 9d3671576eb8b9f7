"""The robustness frontier of a study: per model, clean top-1 against top-1 under the adaptive patch attack
(both from the ``patch`` suite's records, so on the same test images), or the defended clean top-1
against the certified top-1 of the ``certify`` suite; mean and seed std, and each model's difference from
the baseline with its 95 % seed interval (paired by seed).

Read from the ``results.json`` dict only; :func:`frontier_rows` feeds the table (:func:`frontier_table`,
the ``frontier`` publish view) and the figures (``report.figures.patch_frontier``,
``report.figures.certify_frontier``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..evaluate.certify import attacked_metric, certified_metric, defended_metric
from ..evaluate.patch import CLEAN_TOP1, top1_patches
from ..markdown import markdown_table
from .collect import metric_value
from .intervals import t_interval

SUITE = "patch"
ROLE_ORDER = {"baseline": 0, "rpc": 1, "variant": 2}
AXES = ((CLEAN_TOP1, "clean top-1"), (top1_patches(1), "1-patch top-1"), (top1_patches(2), "2-patch top-1"))
# per suite: the metrics of the table (with their names) and the two whose differences from the baseline it shows
SUITE_AXES = {
    "patch": (AXES, ((CLEAN_TOP1, "clean"), (top1_patches(1), "1-patch")), "Clean and attacked top-1 on the same test images (the patch "
              "suite's records)."),
    "certify": (((CLEAN_TOP1, "undefended clean top-1"), (defended_metric("patch"), "defended clean top-1"),
                 (certified_metric("patch"), "certified top-1, 1 patch"),
                 (attacked_metric("patch"), "defended top-1 under attack, 1 patch"),
                 (certified_metric("token"), "certified top-1, 1 token")),
                ((defended_metric("patch"), "defended"), (certified_metric("patch"), "certified")),
                "All on the same test images (the certify suite's records); certified top-1 is a lower bound under "
                "any patch of the threat, the attacked top-1 an upper bound from one attack."),
}


def _axes(suite: str):
    return SUITE_AXES.get(suite, SUITE_AXES["patch"])


def _baseline(res: Dict[str, Any], models: List[str]) -> Optional[str]:
    return next((k for k in models if (res.get("models") or {}).get(k, {}).get("role") == "baseline"), None)


def _seed_values(per_seed: Dict[str, Any], metric: str) -> Dict[str, float]:
    vals = {seed: metric_value(e.get("metrics") or {}, metric) for seed, e in per_seed.items()}
    return {seed: v for seed, v in vals.items() if v is not None}


def _stats(values: Dict[str, float]) -> Dict[str, Any]:
    xs = list(values.values())
    if not xs:
        return {"n": 0, "mean": None, "std": None}
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else None
    return {"n": len(xs), "mean": mean, "std": std}


def frontier_rows(res: Dict[str, Any], suite: str = SUITE) -> List[Dict[str, Any]]:
    """One row per model the suite ran on: ``label``, ``role``, per metric of the suite's axes (:data:`SUITE_AXES`) its ``stats``
    (n, mean, std over seeds) and ``diff`` from the baseline (the per-seed differences' t interval,
    None for the baseline or with fewer than two paired seeds)."""
    per_model = (res.get("evals") or {}).get(suite) or {}
    roles = {k: (res.get("models") or {}).get(k, {}).get("role") for k in per_model}
    # the baseline first, then the RPC models, then the other variants (controls), each in the results' order
    models = sorted(per_model, key=lambda k: ROLE_ORDER.get(roles[k], len(ROLE_ORDER)))
    base = _baseline(res, models)
    rows = []
    for key in models:
        info = (res.get("models") or {}).get(key, {})
        row: Dict[str, Any] = {"model": key, "label": info.get("label", key), "role": info.get("role"),
                               "stats": {}, "diff": {}}
        for metric, _ in _axes(suite)[0]:
            mine = _seed_values(per_model[key], metric)
            row["stats"][metric] = _stats(mine)
            if base is not None and key != base:
                ref = _seed_values(per_model[base], metric)
                row["diff"][metric] = t_interval([mine[s] - ref[s] for s in mine if s in ref])
        rows.append(row)
    return rows


def _cell(stats: Dict[str, Any]) -> str:
    if not stats["n"]:
        return "—"
    return f"{stats['mean']:.2f}" + (f" ± {stats['std']:.2f}" if stats["std"] is not None else "")


def _diff(ci: Optional[Dict[str, Any]]) -> str:
    return "—" if ci is None else f"{ci['diff']:+.2f} [{ci['lo']:+.2f}, {ci['hi']:+.2f}]"


def frontier_table(res: Dict[str, Any], suite: str = SUITE) -> List[str]:
    """The frontier as a Markdown table (mean ± seed std; differences from the baseline with their 95 % seed
    interval); an empty list when the study ran no ``suite``."""
    rows = frontier_rows(res, suite)
    if not rows:
        return []
    axes, diffs, note = _axes(suite)
    base = next((r["label"] for r in rows if r["role"] == "baseline"), "the baseline")
    header = ["model", "seeds"] + [f"{name} (%)" for _, name in axes] + [f"{name} − {base}" for _, name in diffs]
    body = [[r["label"], str(r["stats"][axes[0][0]]["n"])] + [_cell(r["stats"][m]) for m, _ in axes]
            + [_diff(r["diff"].get(m)) for m, _ in diffs] for r in rows]
    return markdown_table(header, body) + [
        "", f"Mean ± standard deviation over seeds; differences from {base} paired by seed, mean [95 % t interval "
        f"over the seeds]. {note}"]


def variant_table(res: Dict[str, Any], suite: str = SUITE, patches: int = 1) -> List[str]:
    """Top-1 under each attack variant alone (``top1@<k>patch_<variant>``: CE or attention loss, exact or
    BPDA gradients) beside the worst case over them, mean ± seed std per model: the worst case counts how
    many variants a model faces; an empty list when the study ran no ``suite``."""
    per_model = (res.get("evals") or {}).get(suite) or {}
    worst = top1_patches(patches)
    variants: List[str] = []
    for per_seed in per_model.values():
        for e in per_seed.values():
            for name in (e.get("metrics") or {}):
                tail = name[len(worst) + 1:] if name.startswith(worst + "_") else None
                if tail and tail not in variants:
                    variants.append(tail)
    rows = frontier_rows(res, suite)
    if not rows:
        return []
    body = [[r["label"]] + [_cell(_stats(_seed_values(per_model[r["model"]], f"{worst}_{v}"))) for v in variants]
            + [_cell(r["stats"][worst])] for r in rows]
    return markdown_table(["model"] + [f"{v} (%)" for v in variants] + ["worst case (%)"], body) + [
        "", f"Top-1 under {patches} patch(es), each attack variant alone and the worst case per example over the "
        "variants a model faces (— : not run; BPDA runs only on a model with a non-differentiable step or a key "
        "control); mean ± standard deviation over seeds."]

