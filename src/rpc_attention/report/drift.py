"""How much a study's numbers move between two runs of it (another CPU, other float32 kernels).

:func:`drift_lines` compares two ``results.json`` of the same study: per claim, both differences (RPC -
baseline, mean of the per-seed differences, with the seed interval), the absolute change of the
difference and both verdicts; per task table, how many cells have a mean in both, how many print the
same digits, and the largest absolute change of a cell's mean with its row and column. The last line
gives, per task table (the units its claims and cells share), the largest changes: the figure a sentence
like "on another CPU the numbers move by at most X" needs.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..markdown import markdown_table
from .render import fmt, kernels_label


def _claim_diff(c: Dict[str, Any]) -> Tuple[Optional[float], str]:
    iv = c.get("intervals") or {}
    diffs = list((iv.get("per_seed_diff") or {}).values())
    if not diffs:
        return None, "—"
    d = sum(diffs) / len(diffs)
    ci = iv.get("seed_ci") or {}
    seed = f"[{ci['lo']:+.2f}, {ci['hi']:+.2f}]" if len(diffs) > 1 and ci.get("lo") is not None else "(one seed)"
    return d, f"{d:+.2f} {seed}"


def claim_rows(a: Dict[str, Any], b: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per claim of ``a`` that ``b`` also has (by id): both differences and verdicts, |change|."""
    other = {c["id"]: c for c in b.get("claims") or [] if "id" in c}
    rows = []
    for c in a.get("claims") or []:
        if c.get("id") not in other:
            continue
        (da, ta), (db, tb) = _claim_diff(c), _claim_diff(other[c["id"]])
        rows.append({"id": c["id"], "title": c["title"], "table": c.get("table"), "a": ta, "b": tb,
                     "change": abs(da - db) if da is not None and db is not None else None,
                     "verdict_a": c.get("verdict"), "verdict_b": other[c["id"]].get("verdict")})
    return rows


def table_rows(a: Dict[str, Any], b: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per task table in both: cells with a mean in both (matched by row label and column key), those that
    print alike, and the largest |change| of a mean with the row and column it is in."""
    out = []
    for tname, ta in (a.get("tables") or {}).items():
        tb = (b.get("tables") or {}).get(tname)
        if not tb:
            continue
        rows_b = {r["label"]: r["cells"] for r in tb.get("rows") or []}
        headers = {c["key"]: c["header"] for c in ta.get("columns") or []}
        n = same = 0
        worst: Tuple[float, str] = (-1.0, "—")
        for r in ta.get("rows") or []:
            for key, ca in r["cells"].items():
                cb = (rows_b.get(r["label"]) or {}).get(key) or {}
                if not ca.get("n") or not cb.get("n"):
                    continue
                n += 1
                same += fmt(ca["mean"]) == fmt(cb["mean"])
                change = abs(ca["mean"] - cb["mean"])
                if change > worst[0]:
                    worst = (change, f"{r['label']}, {headers.get(key, key)}")
        out.append({"table": tname, "cells": n, "same": same, "max_change": worst[0] if n else None,
                    "where": worst[1]})
    return out


def _largest(rows: List[Dict[str, Any]], key: str) -> Optional[float]:
    xs = [r[key] for r in rows if r[key] is not None]
    return max(xs) if xs else None


def _summary(claims: List[Dict[str, Any]], tables: List[Dict[str, Any]]) -> str:
    """The largest changes per task table (its claims' differences and its cells' means share its units)."""
    names = list(dict.fromkeys([t["table"] for t in tables] + [c["table"] for c in claims if c["table"]]))
    parts = [f"{name}: {fmt(_largest([c for c in claims if c['table'] == name], 'change'))} in a claim's "
             f"difference, {fmt(_largest([t for t in tables if t['table'] == name], 'max_change'))} in a cell's mean"
             for name in names]
    moved = sum(r["verdict_a"] != r["verdict_b"] for r in claims)
    return f"Largest |change|, {'; '.join(parts) or 'nothing compared'}; verdicts that differ: {moved} of {len(claims)}."


def drift_lines(a: Dict[str, Any], b: Dict[str, Any], name_a: str, name_b: str, summary: bool = False) -> List[str]:
    """Markdown: results ``a`` (published as ``name_a``) against ``b`` (``name_b``) of the same study; with
    ``summary`` only the line of the largest changes."""
    def who(res: Dict[str, Any], name: str) -> str:
        setup = res.get("setup") or {}
        return f"`{name}` ({setup.get('cpu')}{kernels_label(setup)}, generated {res.get('generated')})"

    claims, tables = claim_rows(a, b), table_rows(a, b)
    if summary:
        return [f"{who(a, name_a)} against {who(b, name_b)}. {_summary(claims, tables)}", ""]
    L = [f"{who(a, name_a)} against {who(b, name_b)}, `{a.get('study')}` study.", ""]
    L += markdown_table(["claim", f"RPC − baseline, `{name_a}`", f"RPC − baseline, `{name_b}`", "|change|",
                         "verdicts"],
                        [[r["title"], r["a"], r["b"], fmt(r["change"]),
                          r["verdict_a"] if r["verdict_a"] == r["verdict_b"] else f"{r['verdict_a']} → {r['verdict_b']}"]
                         for r in claims]) + [""]
    L += markdown_table(["table", "cells in both", "same printed digits", "largest |change| of a mean", "in"],
                        [[t["table"], t["cells"], t["same"], fmt(t["max_change"]), t["where"]] for t in tables]) + [""]
    return L + [_summary(claims, tables), ""]
