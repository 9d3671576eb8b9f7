"""The report's lead: at most five sentences answering the study's question, written by fixed rules from
the collected numbers (``results.json``): whether PAP's sparse step fired in each RPC model, then the
paper's claims (the primary family one by one, the secondary family counted) and the library's own
claims apart, then the language model; each change with the verdict word of the family tables (the same
metric, the same word: the lead never applies a rule of its own).
"""

from __future__ import annotations

from typing import Any, Dict, List

from .verdict import CONTRADICTED, EQUIVALENT, INCONCLUSIVE, NOT_MEASURED, REPRODUCED, SMALLER, UNRESOLVED

__all__ = ["LEAD_RULE", "lead_paragraph", "MAX_SENTENCES"]

MAX_SENTENCES = 5
LEAD_RULE = ("Each change: RPC − baseline, the mean of the per-seed differences in the metric's units, with the "
             "verdict of the tables above (their intervals and rules there).")


def _change(c: Dict[str, Any]) -> str:
    diffs = list(((c.get("intervals") or {}).get("per_seed_diff") or {}).values())
    label = c.get("rpc_label", c.get("rpc", ""))
    if not diffs:
        return f"{label} {c['suite']} {c['metric']}: {c['verdict']}"
    return f"{label} {c['suite']} {c['metric']} {sum(diffs) / len(diffs):+.2f} ({c['verdict']})"


def _sparse_sentence(res: Dict[str, Any]) -> str:
    models = (res.get("sparsity") or {}).get("models") or {}
    if not models:
        return "No RPC model recorded S activity."
    parts = []
    for m in models.values():
        fracs = [float(b.get("frac_nonzero") or 0.0) for r in m["runs"].values() for b in (r.get("blocks") or [])]
        share = f" (up to {100 * max(fracs):.3g} % of S entries non-zero)" if fracs and max(fracs) > 0 else ""
        parts.append(f"{m['label']}: {m['verdict']}{share}")
    return "PAP's sparse step: " + "; ".join(parts) + "."


def _counts(claims: List[Dict[str, Any]]) -> str:
    parts = []
    for v in (REPRODUCED, CONTRADICTED, EQUIVALENT, SMALLER, INCONCLUSIVE, UNRESOLVED, NOT_MEASURED):
        n = sum(c["verdict"] == v for c in claims)
        if n:
            parts.append(f"{n} {v}")
    return ", ".join(parts)


def _family(claims: List[Dict[str, Any]], name: str) -> List[Dict[str, Any]]:
    return [c for c in claims if c.get("family", "secondary") == name]


def _paper_sentence(claims: List[Dict[str, Any]]) -> str:
    primary, secondary = _family(claims, "primary"), _family(claims, "secondary")
    parts = []
    if primary:
        parts.append("primary (powered): " + "; ".join(_change(c) for c in primary))
    if secondary:
        n = len(secondary)
        parts.append(f"secondary (exploratory, {n} claim{'s' if n != 1 else ''}): {_counts(secondary)}")
    return ("The paper's claims, " + "; ".join(parts) + ".") if parts else ""


def _one_seed_sentence(claims: List[Dict[str, Any]]) -> str:
    seeded = [c for c in claims if len((c.get("intervals") or {}).get("per_seed_diff") or {}) >= 2]
    if claims and not seeded:
        return ("Every model has one seed, so no claim can be decided: the differences are descriptive only "
                "(a single run cannot separate an effect from run-to-run noise).")
    return ""


def lead_paragraph(res: Dict[str, Any]) -> str:
    """At most :data:`MAX_SENTENCES` sentences from ``res`` (``results.json``)."""
    claims = res.get("claims") or []
    own, lm = _family(claims, "own"), _family(claims, "lm")
    sentences = [_sparse_sentence(res), _one_seed_sentence(claims), _paper_sentence(claims),
                 ("The library's own claims (not the paper's): " + "; ".join(_change(c) for c in own) + ".")
                 if own else "",
                 ("Language model (the paper's claims): " + "; ".join(_change(c) for c in lm) + ".") if lm else ""]
    sentences = [s for s in sentences if s]
    if len(sentences) > MAX_SENTENCES:  # the one-seed warning outranks the S-activity sentence
        sentences = sentences[1:]
    return " ".join(sentences)
