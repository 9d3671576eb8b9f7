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


def _numbers(res: Dict[str, Any]) -> Dict[str, float]:
    """Every number a study prints, by where it sits: each task-table cell's mean, each claim's two arm
    means and its difference (the mean of the per-seed differences)."""
    out: Dict[str, float] = {}
    for tname, t in (res.get("tables") or {}).items():
        headers = {c["key"]: c["header"] for c in t.get("columns") or []}
        for r in t.get("rows") or []:
            for key, cell in r["cells"].items():
                if cell.get("n") and cell.get("mean") is not None:
                    out[f"{tname}: {r['label']}, {headers.get(key, key)}"] = float(cell["mean"])
    for c in res.get("claims") or []:
        for arm in ("baseline", "rpc"):
            vals = [v for v in (c.get(f"{arm}_values") or []) if v is not None]
            if vals:
                out[f"claim {c['id']}: {arm} mean"] = sum(vals) / len(vals)
        d, _ = _claim_diff(c)
        if d is not None:
            out[f"claim {c['id']}: RPC − baseline"] = d
    return out


def machine_label(res: Dict[str, Any]) -> str:
    """The CPU (or GPU) and the float32 kernels that made ``res``: ``AMD EPYC (AVX512 kernels, 2 CPUs)``."""
    setup = res.get("setup") or {}
    gpus = setup.get("gpus") or []
    if gpus:
        return f"{gpus[0]} ({len(gpus)} GPU{'s' if len(gpus) > 1 else ''})"
    isa = setup.get("cpu_capability") or "default"
    return f"{setup.get('cpu') or 'an unnamed CPU'} ({isa} kernels, {setup.get('cpu_count', '?')} CPUs)"


def agreement(run: Dict[str, Any], published: Dict[str, Any]) -> Dict[str, Any]:
    """How a run of a study agrees with its published results: verdicts equal, numbers that print the
    same digits, the largest difference and where it is, and both machines."""
    verdicts = [(c["id"], c.get("verdict")) for c in run.get("claims") or []]
    theirs = {c["id"]: c.get("verdict") for c in published.get("claims") or []}
    shared = [(cid, v) for cid, v in verdicts if cid in theirs]
    a, b = _numbers(run), _numbers(published)
    both = [k for k in a if k in b]
    same = [k for k in both if fmt(a[k]) == fmt(b[k])]
    worst = max(both, key=lambda k: abs(a[k] - b[k]), default=None)
    return {"verdicts": len(shared), "verdicts_equal": sum(v == theirs[cid] for cid, v in shared),
            "verdicts_differ": [cid for cid, v in shared if v != theirs[cid]],
            "numbers": len(both), "numbers_equal": len(same),
            "largest": (abs(a[worst] - b[worst]), worst, a[worst], b[worst]) if worst else None,
            "run_machine": machine_label(run), "published_machine": machine_label(published)}


def agreement_lines(run: Dict[str, Any], published: Dict[str, Any], name: str) -> List[str]:
    """The few lines ``make demo`` ends with: this run against the published ``name``."""
    if run.get("study") != published.get("study"):
        raise ValueError(f"these results are the {run.get('study')!r} study and {name} the "
                         f"{published.get('study')!r} study: compare two runs of one study")
    g = agreement(run, published)
    verdicts = (f"verdicts: {g['verdicts_equal']} of {g['verdicts']} equal"
                + (f" (differ: {', '.join(g['verdicts_differ'])})" if g["verdicts_differ"] else ""))
    numbers = f"numbers: {g['numbers_equal']} of {g['numbers']} print the same digits"
    if g["largest"]:
        change, where, x, y = g["largest"]
        numbers += f"; largest difference {fmt(change)} ({where}: {fmt(x)} here, {fmt(y)} published)"
    return [f"This run against the published `{name}` ({published.get('generated')}):",
            f"- {verdicts}", f"- {numbers}",
            f"- this run: {g['run_machine']}; published: {g['published_machine']}"]
