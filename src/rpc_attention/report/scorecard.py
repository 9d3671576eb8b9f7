"""The scorecard: one row per claim of the paper, in the paper's order, with its verdict at this scale.

Each row: the paper's baseline -> RPC, ours (the means over seeds), RPC - baseline with its one 95 % interval
over seeds and examples, the MDE at 80 % power and the verdict; a claim the study did not run keeps its row,
marked "not run" (with why, the command that runs it and its cost where the study says). Above the table one
count line ("14 claims: X reproduced, ..."), and a lead of at most three short sentences, both written by
rules from the rows (so they cannot disagree with the table).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..markdown import markdown_table
from .paper import KPCA_ROWS, PAPER_ROWS, SCORECARD, SHORT
from .verdict import CONTRADICTED, EQUIVALENT, INCONCLUSIVE, NOT_MEASURED, REPRODUCED, SMALLER, UNRESOLVED

NOT_RUN = "not run"
_ORDER = (REPRODUCED, CONTRADICTED, EQUIVALENT, SMALLER, INCONCLUSIVE, NOT_RUN, UNRESOLVED, NOT_MEASURED)


def _official(res: Dict[str, Any], cid: str) -> Optional[Dict[str, Any]]:
    """The study's claim on the paper's row ``cid`` itself (not a variant model's claim on the same row)."""
    return next((c for c in res.get("claims") or [] if c["id"] == cid and not c.get("paper_id")), None)


def has_scorecard(res: Dict[str, Any]) -> bool:
    """Whether the study tests any of the paper's claims."""
    return any(_official(res, cid) for cid in SCORECARD) or bool(res.get("not_run"))


def scorecard_ids(res: Dict[str, Any]) -> tuple:
    """The rows of ``res``'s scorecard: the paper's 14, then K1/K2 where the study tests any of them."""
    return SCORECARD + (KPCA_ROWS if any(_official(res, cid) for cid in KPCA_ROWS) else ())


def _paper_text(cid: str) -> str:
    row = PAPER_ROWS.get(cid) or {}
    if row.get("paper_text"):
        return row["paper_text"]
    if row.get("baseline") is None:
        return "beats the baseline (no numbers)"
    return f"{row['baseline']:.2f} → {row['rpc']:.2f}"


def scorecard_rows(res: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per claim of the paper (:data:`~rpc_attention.report.paper.SCORECARD`, then
    :data:`~rpc_attention.report.paper.KPCA_ROWS` where the study tests them): ``{"id", "claim", "paper", "ours",
    "difference", "mde", "verdict", "note"}``."""
    not_run = {c["id"]: c for c in res.get("not_run") or []}
    rows = []
    for cid in scorecard_ids(res):
        row = PAPER_ROWS.get(cid) or {}
        c = _official(res, cid)
        out = {"id": cid, "claim": f"{SHORT.get(cid, cid)} ({row.get('change', '')})",
               "paper": _paper_text(cid), "ours": "—", "difference": "—", "mde": "—", "verdict": NOT_RUN, "note": ""}
        if c is not None:
            e, iv = c.get("effect") or {}, c.get("intervals") or {}
            out["claim"] = c["title"]
            if e.get("baseline_mean") is not None and e.get("rpc_mean") is not None:
                out["ours"] = f"{e['baseline_mean']:.2f} → {e['rpc_mean']:.2f}"
            diffs = list((iv.get("per_seed_diff") or {}).values())
            inter = (iv.get("tests") or {}).get("interval")
            nb, nr = e.get("n_baseline"), e.get("n_rpc")
            if out["ours"] != "—" and diffs and nb and nr and not nb == nr == len(diffs):
                # the group means average every seed of each model; the difference pairs only common seeds
                out["ours"] += f" (means of {nb} / {nr} seeds; the difference pairs {len(diffs)})"
            if diffs:
                out["difference"] = (f"{sum(diffs) / len(diffs):+.2f}"
                                     + (f" [{inter['lo']:+.2f}, {inter['hi']:+.2f}]" if inter else " (one seed)"))
            if iv.get("min_detectable") is not None:
                out["mde"] = f"{iv['min_detectable']:.2f}"
            out["verdict"] = c["verdict"]
            out["n"] = len(diffs)
            out["smaller"] = bool(c.get("smaller"))
        elif cid in not_run:
            nr = not_run[cid]
            out["claim"] = nr.get("title") or out["claim"]
            out["note"] = "; ".join(x for x in (nr.get("reason"), f"command: `{nr['command']}`" if nr.get("command")
                                                 else None, f"cost: {nr['cost']}" if nr.get("cost") else None) if x)
        else:
            out["note"] = "not in this study"
        rows.append(out)
    return rows


def count_line(rows: List[Dict[str, Any]]) -> str:
    """``"14 claims: X reproduced, Y contradicted, Z equivalent, W inconclusive, V not run"``, with ``U smaller
    than the paper's effect`` before the inconclusive count where the study registered that verdict (and any
    other verdict that occurs, e.g. unresolved (one seed), counted after them)."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in _ORDER}
    registered = any(r.get("smaller") for r in rows) or counts[SMALLER] > 0
    main = [f"{counts[v]} {v}" for v in _ORDER[:6] if v != SMALLER or registered]
    extra = [f"{counts[v]} {v}" for v in _ORDER[6:] if counts[v]]
    return f"{len(rows)} claims: " + ", ".join(main + extra)


def _names(rows: List[Dict[str, Any]], verdict: str) -> List[str]:
    return [SHORT.get(r["id"], r["id"]) for r in rows if r["verdict"] == verdict]


def scorecard_lead(res: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    """At most three short sentences: what was tested and how, what reproduced, what went against the paper."""
    ran = [r for r in rows if r["verdict"] != NOT_RUN]
    plan = res.get("plan") or {}
    seeds = sorted({int(s) for m in (res.get("models") or {}).values() for s in m.get("seeds") or []})
    how = (f"on fresh seeds {seeds[0]}-{seeds[-1]} from the plan {plan['sha256'][:12]}" if plan.get("sha256") and seeds
           else f"on {max((r.get('n', 0) for r in ran), default=0)} seeds, a pilot scale that decides little")
    first = f"The `{res.get('study')}` study tested {len(ran)} of the paper's {len(rows)} claims {how}."
    good = _names(rows, REPRODUCED)
    bad = _names(rows, CONTRADICTED)
    second = f"Reproduced: {', '.join(good)}." if good else "No claim reproduced."
    third = f"Contradicted: {', '.join(bad)}." if bad else "No claim was contradicted."
    return " ".join((first, second, third))


def scorecard_lines(res: Dict[str, Any], elsewhere: Optional[str] = None) -> List[str]:
    """The count line, the lead and the table (markdown lines); ``elsewhere`` names where the claims this study
    did not run are decided (e.g. the published confirmatory results)."""
    rows = scorecard_rows(res)
    table = [[r["claim"], r["paper"], r["ours"], r["difference"], r["mde"],
              f"**{r['verdict']}**" + (f" ({r['note']})" if r["note"] else "")] for r in rows]
    return ([f"**{count_line(rows)}.**", "", scorecard_lead(res, rows), ""]
            + markdown_table(["claim", "paper: baseline → RPC", "ours: baseline → RPC",
                              "RPC − baseline [95 % interval]", "MDE (80 %)", "verdict"], table) + [""]
            + ([f"Claims not in this study are decided in {elsewhere}.", ""]
               if elsewhere and any(r["note"] == "not in this study" for r in rows) else []))
