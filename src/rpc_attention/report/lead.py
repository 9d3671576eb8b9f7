"""The report's lead paragraph: the study's answer, written by fixed rules from the collected numbers
(``results.json``): whether PAP's sparse step fired in each RPC model, and, for each RPC model, each
claim's metric against its baseline with the numbers and the verdict word of the verdict table (the
same metric, the same intervals, the same word: the lead never applies a rule of its own).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .verdict import CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, REPRODUCED, UNRESOLVED

__all__ = ["LEAD_RULE", "lead_paragraph"]

LEAD_RULE = ("Each change is a claim of the verdict table: RPC - baseline (mean of the per-seed differences, in "
             "the metric's units), its 95 % seed interval (t interval over the per-seed differences), its 95 % "
             "example interval (paired bootstrap over test examples, seeds pooled), its Holm-adjusted p, and the "
             "table's verdict.")


def _ci_text(ci: Optional[Dict[str, Any]]) -> str:
    return f"[{ci['lo']:+.2f}, {ci['hi']:+.2f}]" if ci else "n/a"


def _change(c: Dict[str, Any]) -> str:
    iv = c.get("intervals") or {}
    diffs = list((iv.get("per_seed_diff") or {}).values())
    if not diffs:
        return f"{c['suite']} {c['metric']}: {c['verdict']}"
    mean = sum(diffs) / len(diffs)
    seed = _ci_text(iv.get("seed_ci")) if len(diffs) > 1 else "n/a, one seed"
    pooled = (iv.get("bootstrap") or {}).get("pooled")
    p = iv.get("p_holm")
    p_text = f", p (Holm) {p:.3g}" if p is not None else ""
    return (f"{c['suite']} {c['metric']} {mean:+.2f} ({c['verdict']}; seed interval {seed}, "
            f"example interval {_ci_text(pooled)}{p_text})")


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
    by_model: Dict[tuple, List[Dict[str, Any]]] = {}
    for c in res.get("claims") or []:
        by_model.setdefault((c["rpc"], c["baseline"]), []).append(c)
    out = []
    for (key, base_key), claims in by_model.items():
        label = res["models"].get(key, {}).get("label", key)
        base = res["models"].get(base_key, {}).get("label", base_key)
        n = max(len((c.get("intervals") or {}).get("seeds") or []) for c in claims)
        out.append(f"Against {base}, {label} ({n} seed{'s' if n != 1 else ''}): "
                   + "; ".join(_change(c) for c in claims) + ".")
    return out


def _claims_clause(res: Dict[str, Any]) -> str:
    claims = res.get("claims") or []
    if not claims:
        return ""
    parts = []
    for v in (REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNRESOLVED, NOT_MEASURED):
        titles = [c["title"] for c in claims if c["verdict"] == v]
        if titles:
            parts.append(f"{v}: {', '.join(titles)}")
    return "The paper's claims, by the verdict rule: " + "; ".join(parts) + "."


def lead_paragraph(res: Dict[str, Any]) -> str:
    """One paragraph answering "what did PAP do, and does it help?" from ``res`` (``results.json``)."""
    parts = [_sparse_clause(res)] + _model_clauses(res) + [_claims_clause(res)]
    return " ".join(p for p in parts if p)
