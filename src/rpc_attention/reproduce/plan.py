"""Pre-registered plans: what a confirmatory run of the ``paper`` study will do, fixed in a file before it starts.

A plan (``docs/plans/paper.json``, written by ``rpc-attention plan``) holds the claims and their
configurations, the family, each claim's target and margin, its seeds and test examples, the rule that
turned the paper's numbers into targets, the pilot figures it was sized from and the budget. The study
reads everything from it (``rpc-attention reproduce --study paper --set plan=docs/plans/paper.json``);
the run records the plan's SHA-256, and a plan whose bytes changed after its run started is refused in
that run's directory (an edited plan is a new plan: it runs in a new ``--out``).

**The target rule** (one rule for every claim, :func:`target_for`): the paper's relative improvement of
a row, ``|rpc - baseline| / baseline`` in the paper's direction, applied to our baseline's mean in the
pilot, so a target is in our units and scales with our numbers (a 2.3 % lower mCE is 2.3 points of our
SymViT = 100 scale; a 1.49 % higher top-1 is 1.49 % of our SymViT's top-1). A finding the paper states
without numbers (Scaled Attention beats the asymmetric ViT) takes the clean top-1 row's relative
improvement. The margin, the smallest effect a verdict is about, is ``MARGIN_SHARE`` of the target.

**Seeds and examples** (:func:`allocate`): for each claim, the cheapest (seeds, examples) at which the
claim reaches 80 % power at its target under the report's rule (the one interval over seeds and
examples, Holm's first step over the confirmatory family, :mod:`rpc_attention.report.power`), from its
pilot's per-seed sd and example standard error; the models a claim shares are trained on the union of
its claims' seeds. Claims are funded cheapest first while the budget lasts; one the cap cannot fund is
run at the seeds its models get anyway and labelled "under-powered at this budget" with its MDE.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .specs import StudyError

__all__ = ["FAMILY", "PLANNED", "UNDERPOWERED", "NOT_RUN", "MARGIN_SHARE", "FALLBACK_ROW", "target_for",
           "load_plan", "plan_claim", "study_settings", "plan_summary", "plan_sha256", "PLAN_FORMAT"]

PLAN_FORMAT = 1
FAMILY = "paper"
PLANNED, UNDERPOWERED, NOT_RUN = "planned", "under-powered at this budget", "not run"
MARGIN_SHARE = 0.25
# the paper's row whose relative improvement a finding without numbers takes
FALLBACK_ROW = "clean"
# the paper's rows each claim without a row of its own takes its relative improvement from
TARGET_ROW = {"scaled_s": FALLBACK_ROW, "scaled_alpha": FALLBACK_ROW}


def paper_gain(row: Dict[str, Any]) -> float:
    """The paper's relative improvement of a row, oriented (> 0: RPC better): (rpc - baseline) / baseline,
    sign-flipped where lower is better."""
    rel = (float(row["rpc"]) - float(row["baseline"])) / abs(float(row["baseline"]))
    return rel if row.get("higher", True) else -rel


def target_for(claim_id: str, baseline_mean: float) -> Dict[str, float]:
    """``{"gain", "target", "margin"}`` of a claim by the one rule: the paper's relative improvement of its row
    (or :data:`FALLBACK_ROW`'s for a finding without numbers) times |our baseline's mean|; margin
    ``MARGIN_SHARE`` x target."""
    from ..report.paper import PAPER_ROWS

    row = PAPER_ROWS[TARGET_ROW.get(claim_id, claim_id)]
    gain = paper_gain(row)
    if gain <= 0:
        raise ValueError(f"the paper's row {claim_id!r} shows no improvement; it cannot set a target")
    target = gain * abs(float(baseline_mean))
    return {"gain": gain, "target": target, "margin": MARGIN_SHARE * target}


def plan_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_plan(path) -> Dict[str, Any]:
    """The plan in ``path`` with its ``_path`` and ``_sha256``; a missing, unreadable or malformed plan is a
    :class:`StudyError` naming what is wrong."""
    p = Path(str(path)).expanduser()
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise StudyError(f"--set plan={path}: cannot read the plan ({exc.strerror or exc})") from None
    try:
        plan = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StudyError(f"--set plan={path}: not a JSON plan ({exc})") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or plan.get("study") != "paper":
        raise StudyError(f"--set plan={path}: not a paper-study plan of format {PLAN_FORMAT} "
                         f"(write one with `rpc-attention plan`)")
    for key in ("settings", "claims", "seed_base", "rule"):
        if key not in plan:
            raise StudyError(f"--set plan={path}: the plan has no {key!r}")
    for c in plan["claims"]:
        need = ("id", "status") + (("seeds", "examples", "target", "margin") if c.get("status") != NOT_RUN else ())
        lacking = [k for k in need if k not in c]
        if lacking:
            raise StudyError(f"--set plan={path}: claim {c.get('id')!r} lacks {', '.join(lacking)}")
        if c.get("status") != NOT_RUN and (len(c["seeds"]) < 2 or any(int(x) < int(plan["seed_base"]) for x in c["seeds"])):
            raise StudyError(f"--set plan={path}: claim {c['id']!r} needs two or more seeds from seed_base "
                             f"{plan['seed_base']} on")
    pilot = set(int(x) for x in (plan.get("pilot") or {}).get("seeds") or [])
    used = {int(x) for c in plan["claims"] for x in c.get("seeds") or []}
    shared = sorted(pilot & used)
    if shared:
        raise StudyError(f"--set plan={path}: confirmatory seeds {shared} were used by a pilot")
    plan["_path"], plan["_sha256"] = str(path), hashlib.sha256(raw).hexdigest()
    return plan


def plan_claim(plan: Dict[str, Any], claim_id: str) -> Optional[Dict[str, Any]]:
    return next((c for c in plan["claims"] if c["id"] == claim_id), None)


def study_settings(plan: Dict[str, Any], given: Dict[str, Any]) -> Dict[str, Any]:
    """The study settings of a plan run: the plan's settings, its path and its hash. A setting given beside
    ``plan`` (other than the plan itself) is an error: the plan fixes them all."""
    from .study_data import PAPER
    from .specs import settings_dict

    defaults = settings_dict(PAPER)
    other = sorted(k for k, v in given.items() if k != "plan" and v != defaults.get(k))
    if other:
        raise StudyError(f"--set {other[0]}: a plan fixes every setting of the study ({plan['_path']} sets "
                         f"{other[0]}={plan['settings'].get(other[0])!r}); write a new plan to change it")
    unknown = sorted(set(plan["settings"]) - set(defaults))
    if unknown:
        raise StudyError(f"--set plan={plan['_path']}: unknown settings {', '.join(unknown)} in the plan")
    out = dict(defaults, **plan["settings"])
    out["plan"], out["plan_sha256"] = plan["_path"], plan["_sha256"]
    return out


def plan_summary(plan: Dict[str, Any]) -> Dict[str, Any]:
    """What a run's results say of its plan: path, SHA-256, when it was written, its seed base and rule."""
    return {"path": plan["_path"], "sha256": plan["_sha256"], "created": plan.get("created"),
            "seed_base": plan["seed_base"], "rule": plan["rule"], "budget": plan.get("budget"),
            "pilot": {k: v for k, v in (plan.get("pilot") or {}).items() if k != "figures"},
            "claims": [{k: c.get(k) for k in ("id", "status", "target", "margin", "examples", "power", "mde", "gain")}
                       | {"seeds": len(c.get("seeds") or [])} for c in plan["claims"]]}
