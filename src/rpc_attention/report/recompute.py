"""Recompute a published study's intervals and verdicts from its committed files alone.

A study's report writes ``results.json`` (every per-seed value and each claim's intervals and verdict) and
``examples.json.gz`` (the per-example records the example bootstrap resamples: which test example each
model got right, OOD scores, token-block NLLs, per-image segmentation counts). ``rpc-attention verify
docs/results/NAME.json`` reads both, recomputes every claim with the report's own code
(:func:`rpc_attention.report.collect.claims_of`: the bootstrap from the records, the one interval over
seeds and examples, Holm within each family, the verdict) and lists every number that differs. A study
published without its examples file is recomputed from its stored example intervals (the bootstrap itself
is then taken as published; everything after it is recomputed).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

EXAMPLES_SUFFIX = ".examples.json.gz"


def examples_path(results_path) -> Path:
    """``docs/results/NAME.json`` -> ``docs/results/NAME.examples.json.gz``; ``DIR/results.json`` ->
    ``DIR/examples.json.gz``."""
    p = Path(results_path)
    return p.with_name("examples.json.gz") if p.name == "results.json" else p.with_name(p.stem + EXAMPLES_SUFFIX)


def write_examples(path, per_example: Dict[str, Any]) -> Path:
    """The per-example records as gzipped JSON, byte-for-byte the same for the same records (sorted keys, no
    timestamp in the gzip header), written atomically."""
    from ..files import atomic_write_bytes

    raw = json.dumps(per_example, sort_keys=True, separators=(",", ":")).encode()
    return atomic_write_bytes(path, gzip.compress(raw, compresslevel=9, mtime=0))


def read_examples(path) -> Optional[Dict[str, Any]]:
    """The records of an examples file, or None when there is none; a corrupt file is a ValueError."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        return json.loads(gzip.decompress(p.read_bytes()))
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: not a gzipped JSON examples file ({exc})") from None


def _claim_spec(c: Dict[str, Any]) -> SimpleNamespace:
    """The claim a stored claim record was made from (its margin as the study set it)."""
    margin = c.get("margin_spec")
    if margin is None:
        margin = c.get("margin") or 0.0
        base = (c.get("effect") or {}).get("baseline_mean")
        if c.get("relative_margin") and base:
            margin = margin / abs(base)
    return SimpleNamespace(id=c["id"], title=c["title"], table=c["table"], suite=c["suite"], metric=c["metric"],
                           baseline=c["baseline"], rpc=c["rpc"], higher=c["higher"], margin=margin,
                           relative=bool(c.get("relative_margin")), family=c.get("family", "secondary"),
                           target=c.get("target"), paper_id=c.get("paper_id"), smaller=bool(c.get("smaller")),
                           baseline_metric=c.get("baseline_metric"))


def recompute_claims(res: Dict[str, Any], per_example: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Every claim of ``res`` recomputed by the report's rule from its per-seed values and ``per_example``
    (without records, from each claim's stored pooled example interval)."""
    from .collect import claims_of

    stored_claims = res.get("claims") or []
    specs = [_claim_spec(c) for c in stored_claims]
    refs: Dict[str, Optional[str]] = {}
    for c in stored_claims:
        ref = c.get("reference", c["baseline"] if c["suite"] == "corruptions" else None)
        if ref:
            refs[c["suite"]] = ref
    stored = None
    if not per_example:
        stored = {c["id"]: (c.get("intervals") or {}).get("bootstrap") for c in stored_claims}
    return claims_of(res, specs, refs, per_example or {}, stored)


def _close(a, b, tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def _fields(c: Dict[str, Any]) -> Dict[str, Any]:
    iv = c.get("intervals") or {}
    tests = iv.get("tests") or {}
    inter = tests.get("interval") or {}
    pooled = (iv.get("bootstrap") or {}).get("pooled") or {}
    return {"verdict": c.get("verdict"), "delta": (c.get("effect") or {}).get("delta"),
            "interval.lo": inter.get("lo"), "interval.hi": inter.get("hi"), "se": tests.get("se"),
            "p_holm": iv.get("p_holm"), "p_equivalence_holm": iv.get("p_equivalence_holm"),
            "p_smaller_holm": iv.get("p_smaller_holm"),
            "mde": iv.get("min_detectable"), "examples.lo": pooled.get("lo"), "examples.hi": pooled.get("hi")}


def claim_differences(stored: List[Dict[str, Any]], recomputed: List[Dict[str, Any]],
                      tol: float = 1e-9) -> List[Tuple[str, str, Any, Any]]:
    """``(claim id, field, stored, recomputed)`` of every number or verdict that differs (relative ``tol``)."""
    out = []
    new = {c["id"]: c for c in recomputed}
    for c in stored:
        r = new.get(c["id"])
        if r is None:
            out.append((c["id"], "claim", "present", "missing"))
            continue
        a, b = _fields(c), _fields(r)
        out += [(c["id"], k, a[k], b[k]) for k in a if not _close(a[k], b[k], tol)]
    return out


def provenance_problems(res: Dict[str, Any]) -> List[str]:
    """What the stage records say against a pre-registered run, one sentence each: a stage that started
    before the plan's commit, stages run by more than one code commit (or from changed files), a stage with
    no record of its commit. Empty for a study without a plan, and for a plan run published before stages
    recorded their commit (no stage carries one)."""
    git = ((res.get("plan") or {}).get("git")) or {}
    stages = [s for s in res.get("stages") or [] if s.get("status") == "done" and s.get("kind") != "report"]
    if not res.get("plan") or not any("commit" in s for s in stages):
        return []
    out = []
    if git.get("date"):
        from datetime import datetime

        planned = datetime.fromisoformat(git["date"]).timestamp()
        early = [s["name"] for s in stages if s.get("started") is not None and s["started"] < planned]
        if early:
            out.append(f"{len(early)} stages started before the plan's commit {str(git.get('commit'))[:12]} "
                       f"({git['date']}), the first {early[0]}")
    else:
        out.append("the plan's commit is not recorded (the plan file was not committed when the run started)")
    commits = sorted({s.get("commit") or "none" for s in stages})
    if len(commits) > 1:
        out.append(f"the stages ran from {len(commits)} code commits ({', '.join(c[:12] for c in commits)}), "
                   f"not one")
    dirty = [s["name"] for s in stages if s.get("commit_dirty")]
    if dirty:
        out.append(f"{len(dirty)} stages ran from source files that differed from their commit, the first "
                   f"{dirty[0]}")
    return out


def verify_results(path, write: bool = False) -> Dict[str, Any]:
    """Recompute the claims of the results file ``path`` (with its examples file where there is one):
    ``{"claims", "differences", "examples": bool, "provenance": [problems]}`` (:func:`provenance_problems`). ``write`` stores the recomputed claims, rule text and
    lead in the file (a study published under an earlier rule, brought to the current one)."""
    from ..files import atomic_write_json
    from .lead import LEAD_RULE, lead_paragraph
    from .verdict import RULES_TEXT

    p = Path(path)
    res = json.loads(p.read_text(encoding="utf-8"))
    per_example = read_examples(examples_path(p))
    claims = recompute_claims(res, per_example)
    diffs = claim_differences(res.get("claims") or [], claims)
    if write:
        res["claims"], res["rules"] = claims, RULES_TEXT
        res["lead"] = {"text": lead_paragraph(res), "rule": LEAD_RULE}
        atomic_write_json(p, res)
    return {"claims": claims, "differences": diffs, "examples": per_example is not None,
            "provenance": provenance_problems(res)}
