"""The report's lead paragraph: the study's answer, written by fixed rules from the collected numbers
(``results.json``): whether PAP's sparse step fired in each RPC model, what each RPC model did to
each metric of :data:`~rpc_attention.report.collect.LEAD_METRICS` against its baseline, with 95 %
intervals, and which of the paper's claims the verdicts support.

Direction words (:data:`LEAD_RULE`): "better" / "worse" when every interval there is (seed, example)
lies on one side of 0, "no clear difference" otherwise; "no interval" when neither exists.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .verdict import INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, oriented

__all__ = ["LEAD_RULE", "direction", "lead_paragraph"]

LEAD_RULE = ("Each change is RPC - baseline (mean over the seeds both have), then its 95 % seed interval (t "
             "interval over the per-seed differences) and its 95 % example interval (paired bootstrap over test "
             "examples, seeds pooled); it is called better or worse when every interval shown lies on that side "
             "of 0, else no clear difference.")


def _intervals(cmp: Dict[str, Any]) -> List[Dict[str, Any]]:
    pooled = (cmp.get("bootstrap") or {}).get("pooled")
    return [ci for ci in (cmp.get("seed_ci"), pooled) if ci]


def direction(cmp: Dict[str, Any], higher_is_better: bool) -> str:
    """"better", "worse", "no clear difference" or "no interval" (:data:`LEAD_RULE`)."""
    ivs = [oriented(ci, higher_is_better) for ci in _intervals(cmp)]
    if not ivs:
        return "no interval"
    if all(lo > 0 for lo, _ in ivs):
        return "better"
    if all(hi < 0 for _, hi in ivs):
        return "worse"
    return "no clear difference"


def _ci_text(ci: Optional[Dict[str, Any]]) -> str:
    return f"[{ci['lo']:+.2f}, {ci['hi']:+.2f}]" if ci else "n/a"


def _change(cmp: Dict[str, Any]) -> str:
    diffs = list(cmp["per_seed_diff"].values())
    mean = sum(diffs) / len(diffs)
    unit = "PPL" if cmp["metric"].endswith("ppl_sliding") else "points"
    seed = _ci_text(cmp.get("seed_ci")) if len(diffs) > 1 else "n/a, one seed"
    pooled = (cmp.get("bootstrap") or {}).get("pooled")
    return (f"{cmp['what']} {mean:+.2f} {unit} ({direction(cmp, cmp['higher'])}; seed interval {seed}, "
            f"example interval {_ci_text(pooled)})")


def _sparse_clause(res: Dict[str, Any]) -> str:
    models = (res.get("sparsity") or {}).get("models") or {}
    if not models:
        return "No RPC model recorded S activity."
    parts = []
    for m in models.values():
        fracs = [float(b.get("frac_nonzero") or 0.0) for r in m["runs"].values() for b in (r.get("blocks") or [])]
        share = f" (up to {100 * max(fracs):.3g} % of S entries non-zero)" if fracs and max(fracs) > 0 else ""
        parts.append(f"{m['label']}: {m['verdict']}{share}")
    return "PAP's sparse step: " + "; ".join(parts) + "."


def _model_clauses(res: Dict[str, Any]) -> List[str]:
    by_model: Dict[str, List[Dict[str, Any]]] = {}
    for cmp in res.get("comparisons") or []:
        by_model.setdefault(cmp["rpc"], []).append(cmp)
    out = []
    for key, cmps in by_model.items():
        label = res["models"].get(key, {}).get("label", key)
        base = res["models"].get(cmps[0]["baseline"], {}).get("label", cmps[0]["baseline"])
        n = len(cmps[0]["seeds"])
        out.append(f"Against {base}, {label} ({n} seed{'s' if n != 1 else ''}): "
                   + "; ".join(_change(c) for c in cmps) + ".")
    return out


def _claims_clause(res: Dict[str, Any]) -> str:
    claims = res.get("claims") or []
    if not claims:
        return ""
    groups = [(REPRODUCED, "supported at this scale"), (NOT_REPRODUCED, "not reproduced"),
              (INCONCLUSIVE, "inconclusive"), (NOT_MEASURED, NOT_MEASURED)]
    parts = []
    for v, words in groups:
        titles = [c["title"] for c in claims if c["verdict"] == v]
        if titles:
            parts.append(f"{words}: {', '.join(titles)}")
    return "The paper's claims, by the verdict rules: " + "; ".join(parts) + "."


def lead_paragraph(res: Dict[str, Any]) -> str:
    """One paragraph answering "what did PAP do, and does it help?" from ``res`` (``results.json``)."""
    parts = [_sparse_clause(res)] + _model_clauses(res) + [_claims_clause(res)]
    return " ".join(p for p in parts if p)
