"""The report's first screen and its power section, from ``results.json``'s claims.

- :func:`family_tables`: one table per pre-registered family (claim, RPC - baseline with its one interval
  over seeds and examples, verdict), each under its rule;
- :func:`power_rows` / :func:`power_section`: per claim, delta / sd of the per-seed differences, the two
  parts of the standard error (seeds, examples), the minimum detectable effect (MDE) at 80 % power for the
  claim's family (Holm's strictest step), and the seeds the claim's target effect needs at its examples
  (:mod:`rpc_attention.report.power`). The same rows feed ``rpc-attention reproduce --power DIR``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from ..markdown import markdown_table
from .intervals import example_se
from .power import POWER, mde, seeds_needed
from .verdict import FAMILIES


def by_family(claims: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """The claims grouped by family, in :data:`~rpc_attention.report.verdict.FAMILIES` order."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for name in list(FAMILIES) + sorted({c.get("family", "secondary") for c in claims} - set(FAMILIES)):
        members = [c for c in claims if c.get("family", "secondary") == name]
        if members:
            out[name] = members
    return out


def _iv(ci: Optional[Dict[str, Any]]) -> str:
    return f"[{ci['lo']:+.2f}, {ci['hi']:+.2f}]" if ci and ci.get("lo") is not None else "—"


def _difference(c: Dict[str, Any]) -> str:
    iv = c.get("intervals") or {}
    diffs = list((iv.get("per_seed_diff") or {}).values())
    if not diffs:
        return "—"
    both = _iv((iv.get("tests") or {}).get("interval")) if len(diffs) > 1 else "one seed"
    return f"{sum(diffs) / len(diffs):+.2f} {both}"


def family_tables(claims: List[Dict[str, Any]]) -> List[str]:
    """One table per family: claim, RPC - baseline (mean of the per-seed differences, metric units) with
    its 95 % interval over seeds and examples, the example interval alone, the margin and the verdict; the
    family's rule below."""
    L: List[str] = []
    for name, members in by_family(claims).items():
        fam = FAMILIES.get(name)
        L += [f"### {fam.title if fam else name}", ""]
        rows = [[c["title"], f"{c['suite']}: {c['metric']} ({'higher' if c['higher'] else 'lower'} better)",
                 _difference(c), _iv(((c.get("intervals") or {}).get("bootstrap") or {}).get("pooled")),
                 f"{c['margin']:.3g}" if c.get("margin") is not None else "—", f"**{c['verdict']}**"]
                for c in members]
        L += markdown_table(["claim", "metric", "RPC − baseline [95 % interval, seeds and examples]",
                             "95 % example interval", "margin", "verdict"], rows) + [""]
        if fam:
            L += [f"*Rule: {fam.rule}.*", ""]
    return L


def _oriented_sd(c: Dict[str, Any]) -> tuple:
    diffs = list(((c.get("intervals") or {}).get("per_seed_diff") or {}).values())
    sign = 1.0 if c.get("higher", True) else -1.0
    d = [sign * x for x in diffs]
    if len(d) < 2:
        return d, None
    m = sum(d) / len(d)
    return d, math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))


def power_rows(res: Dict[str, Any], targets: Optional[Dict[str, float]] = None) -> List[Dict[str, Any]]:
    """Per claim with numbers: n seeds, delta, sd and delta / sd of the oriented per-seed differences, the
    standard error's seed and example parts, the family size m, the MDE at 80 % power (Holm's first step,
    alpha / m, on the one interval), the target and the seeds it needs at these examples. ``targets``
    ({claim id: effect}) override the claims'."""
    rows = []
    for fam, members in by_family(res.get("claims") or []).items():
        size = max(1, max((c.get("intervals") or {}).get("family") or 0 for c in members))
        for c in members:
            d, sd = _oriented_sd(c)
            if not d:
                continue
            delta = sum(d) / len(d)
            target = (targets or {}).get(c["id"], c.get("target"))
            se_ex = example_se(((c.get("intervals") or {}).get("bootstrap") or {}).get("pooled"))
            m = mde(sd, len(d), c["margin"], family=size, se_examples=se_ex) if sd is not None else None
            rows.append({"id": c["id"], "title": c["title"], "family": fam, "n": len(d), "delta": delta, "sd": sd,
                         "delta_over_sd": delta / sd if sd else None, "m": size, "margin": c["margin"],
                         "target": target, "se_seeds": sd / math.sqrt(len(d)) if sd is not None else None,
                         "se_examples": se_ex, "mde": m,
                         "seeds_needed": seeds_needed(target, sd, c["margin"], family=size, se_examples=se_ex)
                         if target and sd is not None else None,
                         "meets_target": None if target is None or m is None else m <= target})
    return rows


def _f(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _verdict_of_target(r: Dict[str, Any]) -> str:
    if r["target"] is None:
        return "no target"
    if r["mde"] is None:
        return "no noise figure (one seed)"
    if r["meets_target"]:
        return f"meets it ({r['mde']:.2f} <= {r['target']:.3g})"
    return f"misses it by {r['mde'] - r['target']:.2f}"


def _seeds_text(r: Dict[str, Any]) -> str:
    if r["seeds_needed"] is None:
        return "more than 1000 seeds at these examples"
    return f"{r['seeds_needed']} seeds"


def power_text(rows: List[Dict[str, Any]]) -> List[str]:
    """The power table (markdown lines) of :func:`power_rows`."""
    table = [[r["title"], r["family"], r["n"], _f(r["delta"]), _f(r["sd"]), _f(r["se_seeds"]), _f(r["se_examples"]),
              r["m"], _f(r["margin"], ".3g"), _f(r["mde"]), _f(r["target"], ".3g"), _verdict_of_target(r),
              _f(r["seeds_needed"], "d")] for r in rows]
    return markdown_table(["claim", "family", "seeds", "delta", "sd", "se, seeds", "se, examples", "m", "margin",
                           "MDE", "target", "MDE against target", "seeds for the target"], table)


def power_section(res: Dict[str, Any]) -> List[str]:
    """The report's power section: every primary claim's MDE at 80 % power against its target."""
    rows = [r for r in power_rows(res) if r["family"] in ("primary", "paper")]
    if not rows:
        return []
    title = "the paper's claims" if any(r["family"] == "paper" for r in rows) else "the primary claims"
    L = [f"## Power of {title}", ""] + power_text(rows) + [""]
    L += [f"delta, sd: mean and sd of the per-seed differences (oriented: > 0 = RPC better); se, seeds = sd / "
          f"sqrt(n); se, examples: the example bootstrap's standard error. MDE: the effect called reproduced with "
          f"{100 * POWER:.0f} % power at Holm's strictest step (alpha / m, m = the family's claims with a p) on the one "
          "interval over seeds and examples (exact noncentral t). Target: the paper's own improvement in our units "
          "(docs/reproduce.md#deciding-claims); seeds for the target: what 80 % power at the target needs at this sd "
          "and these examples. `rpc-attention reproduce --power DIR` prints this for every claim.", ""]
    missed = [r for r in rows if r["meets_target"] is False]
    if missed:
        L += ["Misses: " + "; ".join(f"{r['title']}: MDE {r['mde']:.2f} against a target of {r['target']:.3g} "
                                     f"(needs {_seeds_text(r)})" for r in missed)
              + ". `rpc-attention reproduce --study decide` is sized for them.", ""]
    return L
