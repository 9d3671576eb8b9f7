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

PLAN_FORMAT = 1
FAMILY = "paper"
PLANNED, UNDERPOWERED, NOT_RUN = "planned", "under-powered at this budget", "not run"
MARGIN_SHARE = 0.25
# the paper's row whose relative improvement a finding without numbers takes
FALLBACK_ROW = "clean"
# settings a first-format plan does not hold (their defaults reproduce the first format's runs)
SETTINGS_SINCE_2 = ("subset_seed", "test_offset", "seg_data_seed", "kpca_limit")
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
    if not isinstance(plan, dict) or plan.get("format") not in (PLAN_FORMAT, 2) or plan.get("study") != "paper":
        raise StudyError(f"--set plan={path}: not a paper-study plan of format {PLAN_FORMAT} or 2 "
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
    from .paper_data import PAPER
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


def plan_commit(path) -> Optional[Dict[str, Any]]:
    """The git commit that last changed the plan file and whether the file still has those bytes (``{"commit",
    "date", "clean"}``), or None outside a git checkout: the history that shows the plan came before the run."""
    import subprocess

    p = Path(str(path)).expanduser().resolve()
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%H %cI", "--", p.name], cwd=p.parent, capture_output=True,
                             text=True, timeout=20)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", p.name], cwd=p.parent, capture_output=True,
                               text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    commit, date = out.stdout.split()
    return {"commit": commit, "date": date, "clean": dirty.returncode == 0 and not dirty.stdout.strip()}


def plan_summary(plan: Dict[str, Any]) -> Dict[str, Any]:
    """What a run's results say of its plan: path, SHA-256, when it was written and committed, its seed base
    and rule."""
    return {"path": plan["_path"], "sha256": plan["_sha256"], "created": plan.get("created"),
            "git": plan_commit(plan["_path"]),
            "seed_base": plan["seed_base"], "rule": plan["rule"], "budget": plan.get("budget"),
            "notes": list(plan.get("notes") or []),
            "pilot": {k: v for k, v in (plan.get("pilot") or {}).items() if k != "figures"},
            "claims": [{k: c.get(k) for k in ("id", "status", "target", "margin", "examples", "power", "mde", "gain")}
                       | {"seeds": len(c.get("seeds") or [])} for c in plan["claims"]]}


# ------------------------------------------------------------------------------------------- planning
# the most test examples each suite can take (the test split, or the OOD set's 1,797 digits per side; the
# Segmenter's composed test scenes); None: the suite scores the whole split and has no limit
MAX_EXAMPLES = {"clean": 10000, "corruptions": 10000, "ood": None, "fgsm": 10000, "pgd": 10000, "autoattack": 10000,
                "square": 10000, "seg": 500, "seg-corruptions": 500, "ppl": None, "wordswap": None}
# suites whose examples a plan keeps at the pilot's setting (OOD: its limit counts each side, and the OOD side
# has 1,797 digits at most)
FIXED_EXAMPLES = {"ood": "ood_limit"}
EXAMPLE_STEPS = (0.5, 1.0, 2.0, 4.0, 8.0, 20.0)   # multiples of the pilot's examples a plan considers


def pilot_figures(claim: Dict[str, Any]) -> Dict[str, Any]:
    """What a pilot's claim (a ``results.json`` claim) tells a plan: seeds, delta, the sd of the oriented
    per-seed differences, our baseline's mean, the examples of the pooled bootstrap and the two parts of the
    example variance (shared by every seed, and each seed's own), from the per-seed and pooled intervals."""
    from ..report.intervals import example_se
    from ..report.verdict import mean_std

    iv = claim.get("intervals") or {}
    sign = 1.0 if claim.get("higher", True) else -1.0
    d = [sign * x for x in (iv.get("per_seed_diff") or {}).values()]
    boot = iv.get("bootstrap") or {}
    pooled = boot.get("pooled")
    n0 = len(d)
    out = {"n": n0, "delta": sum(d) / n0 if d else None, "sd": mean_std(d)[2],
           "baseline_mean": (claim.get("effect") or {}).get("baseline_mean"),
           "examples": (pooled or {}).get("n_examples"), "var_shared": 0.0, "var_seed": 0.0}
    if pooled:
        vp = example_se(pooled) ** 2
        per = [example_se(b) ** 2 for b in (boot.get("per_seed") or {}).values() if b]
        v1 = sum(per) / len(per) if per else vp
        spec = max(0.0, (v1 - vp) * n0 / (n0 - 1)) if n0 > 1 else 0.0
        out["var_seed"], out["var_shared"] = spec, max(0.0, vp - spec / max(n0, 1))
    return out


def example_var(fig: Dict[str, Any], n: int, examples: Optional[int]) -> float:
    """The example part's variance at n seeds and ``examples`` examples (each part scales as 1 / examples;
    each seed's own part also as 1 / n)."""
    if not fig.get("examples") or not examples:
        return fig["var_shared"] + fig["var_seed"] / max(n, 1)
    return (fig["var_shared"] + fig["var_seed"] / max(n, 1)) * fig["examples"] / examples


def stage_costs(res: Dict[str, Any]) -> Dict[str, Any]:
    """CPU seconds per training of each model and per evaluated example of each (suite, model), from a pilot's
    stage table (the process CPU time of each stage, which other jobs on the machine do not inflate)."""
    train: Dict[str, List[float]] = {}
    per_example: Dict[str, List[float]] = {}
    for st in res.get("stages") or []:
        secs = st.get("cpu_s") or st.get("seconds")
        if st.get("status") != "done" or not secs:
            continue
        parts = st["name"].split(".")
        if parts[0] == "train":
            train.setdefault(parts[1].rsplit("-s", 1)[0], []).append(float(secs))
        elif parts[0] == "eval" and len(parts) >= 3:
            model, seed = parts[1].rsplit("-s", 1)
            suite = ".".join(parts[2:])
            n = ((res.get("evals") or {}).get(suite, {}).get(model, {}).get(seed) or {}).get("n_examples")
            per_example.setdefault(f"{suite}:{model}", []).append(float(secs) / (n or 1))
    return {"train": {k: sum(v) / len(v) for k, v in train.items()},
            "per_example": {k: sum(v) / len(v) for k, v in per_example.items()}}


def _options(claim, fig, costs, family: int, target: float, margin: float):
    """``(n, examples)`` choices of one claim that reach 80 % power at its target, cheapest per seed first."""
    from ..report.power import seeds_needed

    n0 = fig["examples"]
    cap = MAX_EXAMPLES.get(claim["suite"])
    steps = [None] if not n0 or cap is None else sorted({min(cap, max(1, int(round(n0 * k)))) for k in EXAMPLE_STEPS})
    out = []
    for N in steps:
        # the example part depends on n through each seed's own part: solve n by fixed point from above
        n = seeds_needed(target, fig["sd"], margin, family=family,
                         se_examples=math.sqrt(example_var(fig, 1000, N)), max_seeds=400)
        if n is None:
            continue
        while True:
            need = seeds_needed(target, fig["sd"], margin, family=family,
                                se_examples=math.sqrt(example_var(fig, n, N)), max_seeds=400)
            if need is None or need <= n:
                break
            n = need
        if need is None:
            continue
        per_seed = sum(costs["per_example"].get(f"{claim['suite']}:{m}", 0.0) * (N or fig["examples"] or 1)
                       for m in (claim["baseline"], claim["rpc"]))
        out.append((n, N, per_seed))
    return out


def allocate(claims: List[Dict[str, Any]], figures: Dict[str, Dict[str, Any]], costs: Dict[str, Any],
             budget_s: float, family: int, floor: int = 3) -> Dict[str, Any]:
    """Seeds and examples per claim within ``budget_s`` CPU seconds (see the module's docstring). Every claim
    first gets ``floor`` seeds at its pilot's examples; then claims are upgraded to a design with 80 % power
    at their target by marginal cost (models already trained for another claim cost nothing more), cheapest
    first, while the budget lasts; a claim left over keeps the floor (or the seeds its models get anyway,
    where evaluating them fits) and is under-powered."""
    def pilot_n(c):
        return None if MAX_EXAMPLES.get(c["suite"]) is None else figures[c["id"]]["examples"]

    def per_seed(c, N):
        return sum(costs["per_example"].get(f"{c['suite']}:{m}", 0.0) * (N or figures[c["id"]]["examples"] or 1)
                   for m in (c["baseline"], c["rpc"]))

    seeds_of: Dict[str, int] = {}
    design = {c["id"]: (floor, pilot_n(c)) for c in claims}

    def total():
        trained: Dict[str, int] = {}
        for c in claims:
            for m in (c["baseline"], c["rpc"]):
                trained[m] = max(trained.get(m, 0), design[c["id"]][0])
        return (sum(n * costs["train"].get(m, 0.0) for m, n in trained.items())
                + sum(design[c["id"]][0] * per_seed(c, design[c["id"]][1]) for c in claims)), trained

    spent, seeds_of = total()
    if spent > budget_s:
        raise StudyError(f"the budget ({budget_s / 3600:.1f} CPU hours) cannot run every claim at {floor} seeds "
                         f"({spent / 3600:.1f} CPU hours): raise --budget-hours")
    status = {c["id"]: UNDERPOWERED for c in claims}
    pending = {c["id"]: c for c in claims}
    while pending:
        best = None
        for cid, c in pending.items():
            for n, N, _ in _options(c, figures[cid], costs, family, c["target"], c["margin"]):
                old = design[cid]
                design[cid] = (max(n, floor), N)
                cost = total()[0] - spent
                design[cid] = old
                if best is None or cost < best[0]:
                    best = (cost, cid, max(n, floor), N)
        if best is None or spent + best[0] > budget_s:
            break
        cost, cid, n, N = best
        pending.pop(cid)
        design[cid], status[cid] = (n, N), PLANNED
        spent, seeds_of = total()
    for cid, c in pending.items():   # under-powered: the seeds their models get anyway, where that fits
        n = max(floor, min(seeds_of.get(m, 0) for m in (c["baseline"], c["rpc"])))
        old = design[cid]
        design[cid] = (n, old[1])
        if total()[0] > budget_s:
            design[cid] = old
        spent, seeds_of = total()
    return {"claims": {cid: {"n": design[cid][0], "examples": design[cid][1], "status": status[cid]}
                       for cid in design},
            "models": seeds_of, "cost_s": spent}


RULE_TEXT = (
    "target = the paper's relative improvement of the claim's row, |RPC - baseline| / baseline in the paper's "
    f"direction, times |our baseline's mean in the pilot| (a finding without numbers takes the {FALLBACK_ROW!r} "
    f"row's); margin = {MARGIN_SHARE:g} x target; seeds and examples: 80 % power at the target under the report's "
    "rule (one interval over seeds and examples, Holm's first step over the confirmatory family), from the pilot's "
    "per-seed sd and example variance; claims funded cheapest first within the budget, the rest run at the seeds "
    "their models get anyway and are labelled under-powered at this budget")


def _pilot_claims(sources: Sequence[tuple]) -> tuple:
    """``(claims with their targets, pilot figures by claim, the source of each)`` of the claims a plan runs:
    each claim's figures from the first source that names it (or has it, when it names none)."""
    from .paper_data import PAPER_CLAIMS, PAPER_NOT_RUN

    figures, claims, origin = {}, [], {}
    for c in PAPER_CLAIMS:
        if c.id in PAPER_NOT_RUN or c.since > PLAN_FORMAT:
            continue
        for path, res, ids in sources:
            if ids is not None and c.id not in ids:
                continue
            found = next((x for x in res.get("claims") or [] if x["id"] == c.id), None)
            if found and len((found.get("intervals") or {}).get("per_seed_diff") or {}) >= 2:
                figures[c.id], origin[c.id] = pilot_figures(found), str(path)
                break
        if c.id not in figures:
            raise StudyError(f"no pilot has claim {c.id!r} with two or more seeds")
        fig = figures[c.id]
        if fig["baseline_mean"] is None or fig["sd"] is None:
            raise StudyError(f"the pilot of claim {c.id!r} has no baseline mean or no spread")
        rule = target_for(c.id, fig["baseline_mean"])
        claims.append({"id": c.id, "title": f"{c.subject} {c.says}", "suite": c.suite, "metric": c.metric,
                       "baseline": c.baseline, "rpc": c.rpc, "higher": c.higher, **rule})
    return claims, figures, origin


def _merged_costs(papers: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Each stage's cost from the first paper pilot that ran it."""
    costs: Dict[str, Dict[str, float]] = {"train": {}, "per_example": {}}
    for res in papers:
        for kind, got in stage_costs(res).items():
            costs[kind] = dict(got, **costs[kind])
    return costs


def make_plan(sources: Sequence[tuple], budget_hours: float, jobs: int = 2, seed_base: int = 1000,
              created: Optional[str] = None, notes: Sequence[str] = ()) -> Dict[str, Any]:
    """A plan for the paper study from pilot results. ``sources``: ``(path, results dict, claim ids or None)``
    in priority order (a claim's figures come from the first source that names it, or has it when it names
    none); the settings come from the first source that ran the paper study, each stage's cost from the first
    that ran it. ``notes``: the planner's reasons for choices the plan cannot show (kept in the plan). ``budget_hours``: the cap on
    the run's wall time at ``jobs`` stages at once (CPU seconds = hours x 3600 x jobs)."""
    from ..report.paper import PAPER_ROWS
    from ..report.power import POWER, mde, power
    from .paper_data import PAPER, PAPER_CLAIMS, PAPER_NOT_RUN
    from .specs import settings_dict

    papers = [res for _, res, _ in sources if res.get("study") == "paper"]
    if not papers:
        raise StudyError("a plan needs a pilot of the paper study among --pilot (its stage costs and settings)")
    paper_src, costs = papers[0], _merged_costs(papers)   # the plan's settings are the first paper pilot's
    claims, figures, origin = _pilot_claims(sources)
    settings = {k: v for k, v in settings_dict(PAPER).items() if k not in ("plan", "seeds") + SETTINGS_SINCE_2}
    settings.update({k: v for k, v in (paper_src.get("settings") or {}).items()
                     if k in settings and k not in ("plan", "seeds", "plan_sha256")})
    family = len(claims)
    budget_s = float(budget_hours) * 3600.0 * int(jobs)
    alloc = allocate(claims, figures, costs, budget_s, family)
    out_claims = []
    for c in PAPER_CLAIMS:
        if c.since > PLAN_FORMAT:
            continue
        if c.id in PAPER_NOT_RUN:
            out_claims.append({"id": c.id, "title": f"{c.subject} {c.says}", "status": NOT_RUN,
                               "paper": PAPER_ROWS[c.id], **PAPER_NOT_RUN[c.id]})
            continue
        spec = next(x for x in claims if x["id"] == c.id)
        a, fig = alloc["claims"][c.id], figures[c.id]
        se_ex = math.sqrt(example_var(fig, a["n"], a["examples"]))
        fixed = FIXED_EXAMPLES.get(spec["suite"])
        out_claims.append({
            **spec, "status": a["status"], "paper": PAPER_ROWS[c.id],
            "seeds": list(range(seed_base, seed_base + a["n"])),
            "examples": int(settings[fixed]) if fixed else a["examples"],
            "power": power(spec["target"], fig["sd"], a["n"], spec["margin"], family=family, se_examples=se_ex),
            "mde": mde(fig["sd"], a["n"], spec["margin"], family=family, target_power=POWER, se_examples=se_ex),
            "pilot": {"source": origin[c.id], **fig}})
    pilot_seeds = sorted({int(s) for _, res, _ in sources for m in (res.get("models") or {}).values()
                          for s in m.get("seeds") or []})
    return {
        "format": PLAN_FORMAT, "study": "paper", "created": created,
        "rule": {"text": RULE_TEXT, "margin_share": MARGIN_SHARE, "fallback_row": FALLBACK_ROW, "alpha": 0.05,
                 "power": POWER, "family": FAMILY, "family_size": family},
        "budget": {"cap_hours": float(budget_hours), "jobs": int(jobs), "cpu_s": budget_s,
                   "estimate_cpu_s": alloc["cost_s"], "estimate_hours": alloc["cost_s"] / 3600.0 / int(jobs),
                   "note": "CPU seconds of the pilot's stages; wall time at `jobs` stages at once on an idle machine"},
        "seed_base": int(seed_base), "notes": list(notes),
        "pilot": {"sources": [{"path": str(p), "study": res.get("study"), "generated": res.get("generated"),
                               "claims": sorted(ids) if ids is not None else None} for p, res, ids in sources],
                  "seeds": pilot_seeds, "costs": costs},
        "settings": settings,
        "models": {k: {"seeds": n} for k, n in alloc["models"].items()},
        "claims": out_claims,
    }


def write_plan(plan: Dict[str, Any], path, force: bool = False) -> str:
    """Write ``plan`` (sorted keys, two-space indent, one trailing newline: the bytes its hash is of) and
    return its SHA-256. An existing plan is kept unless ``force``."""
    from ..files import atomic_write_text

    p = Path(path)
    if p.exists() and not force:
        raise StudyError(f"{p} exists: a plan is not rewritten once written (a confirmatory run may have started "
                         f"from it); give another path, or --force if no run has used it")
    text = json.dumps(plan, indent=2, sort_keys=True, default=float) + "\n"
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, text)
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------- the second format
RULE_TEXT_2 = (
    "target = the paper's effect carried to our baseline's mean on the metric's natural scale: for a percentage "
    "(top-1, AUPR, mIoU) the paper's change of the log-odds, for a ratio-scale error (mCE, perplexity) its relative "
    "change (a finding without numbers takes the 'clean' row's); the kernel-PCA rows: J_proj lower after training "
    "by a tenth of its magnitude at initialisation (K1), the alignment of the learned values with the centred-Gram "
    "eigenvectors at its maximum 1 against its chance level (K2); margin = 0.25 x target; the per-seed sd of each "
    "claim is the upper 80 % confidence bound of the first run's (or its pilot's); seeds and examples: each step "
    "that adds the most expected decided claims per CPU second (decided: reproduced, contradicted, equivalent or "
    "smaller than the paper's effect, with the first run's effect as the truth, at Holm's strictest levels) while "
    "the budget lasts, cheap evaluations on every seed of their models; a claim whose MDE stays above its target "
    "is labelled so, with the cheapest design that would reach it")
MDE_ABOVE = "MDE above the target at this budget"
# Fashion-MNIST's test split, the Segmenter's composed test scenes; None: a fixed set (OOD's digits, the LM's
# test text, the kernel-PCA probe)
MAX_EXAMPLES_2 = {"clean": 10000, "corruptions": 10000, "fgsm": 10000, "pgd": 10000, "autoattack": 10000,
                  "square": 10000, "seg": 500, "seg-corruptions": 500}
FMNIST_SUITES = ("clean", "corruptions", "fgsm", "pgd", "autoattack", "square", "ood")
# models trained on the same seeds (a pair whose claims are paired per seed grows together)
GROUPS = {"vision": ("symvit", "rpc6"), "rpc5": ("rpc5",), "rpc2all": ("rpc2all",),
          "scaled": ("vit", "scaled_s", "scaled_alpha"), "seg": ("seg_symvit", "seg_rpc4", "seg_rpc6"),
          "lm": ("symlm", "rpc_symlm")}


def registers_smaller(plan: Optional[Dict[str, Any]]) -> bool:
    """Whether a plan registered the verdict "smaller than the paper's effect" (the second format does)."""
    return bool(plan) and int(plan.get("format", 1)) >= 2 and bool((plan.get("rule") or {}).get("smaller"))


def _target_2(c, fig: Dict[str, Any]) -> Dict[str, Any]:
    from ..report.paper import PAPER_ROWS
    from .design import SCALE_OF_METRIC, kpca_target, natural_target

    if c.kpca:
        return kpca_target(c.kpca, fig["baseline_mean"])
    row = PAPER_ROWS[TARGET_ROW.get(c.id, c.id)]
    return natural_target(row, SCALE_OF_METRIC.get(c.metric, "logit"), fig["baseline_mean"])


def _settings_2(sources: Sequence[tuple], settings: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The study settings of a second-format plan: the defaults, then the first paper source's, then ``settings``."""
    from .paper_data import PAPER
    from .specs import settings_dict

    base = next((res for _, res, _ in sources if res.get("study") == "paper"), None)
    if base is None:
        raise StudyError("a plan needs a run of the paper study among the sources (its settings)")
    s = {k: v for k, v in settings_dict(PAPER).items() if k not in ("plan", "seeds")}
    s.update({k: v for k, v in (base.get("settings") or {}).items() if k in s})
    for k, v in (settings or {}).items():
        if k not in s:
            raise StudyError(f"--set {k}: not a setting of the paper study")
        s[k] = v
    return s


def _claim_plans_2(sources: Sequence[tuple], s: Dict[str, Any]) -> tuple:
    """``(claim plans, figures, origin, specs)`` by claim id: each run claim's figures from the first source
    that names it (or has it), its target by the rule, its sd's upper bound and its examples' cap."""
    from . import design as G
    from .paper_data import PAPER_CLAIMS, PAPER_NOT_RUN

    claims, figs, origin, specs = [], {}, {}, {}
    for c in PAPER_CLAIMS:
        if c.id in PAPER_NOT_RUN:
            continue
        for path, res, ids in sources:
            if ids is not None and c.id not in ids:
                continue
            found = next((x for x in res.get("claims") or [] if x["id"] == c.id), None)
            if found and len((found.get("intervals") or {}).get("per_seed_diff") or {}) >= 2:
                figs[c.id], origin[c.id] = pilot_figures(found), str(path)
                break
        if c.id not in figs:
            raise StudyError(f"no source has claim {c.id!r} with two or more seeds")
        fig = figs[c.id]
        if fig["baseline_mean"] is None or fig["sd"] is None:
            raise StudyError(f"the source of claim {c.id!r} has no baseline mean or no spread")
        rule = _target_2(c, fig)
        cap = MAX_EXAMPLES_2.get(c.suite)
        if cap and c.suite in FMNIST_SUITES:
            cap -= int(s.get("test_offset") or 0)
        sd_hi = G.sd_upper(fig["sd"], fig["n"])
        cp = G.ClaimPlan(c.id, c.suite, c.baseline, c.rpc, fig["delta"], sd_hi, fig["var_shared"], fig["var_seed"],
                         fig["examples"] if cap else None, rule["target"], rule["margin"], cap)
        if cp.examples0 and cp.max_examples and cp.examples0 > cp.max_examples:
            # the pilot's examples may exceed what the test split leaves
            k = cp.examples0 / cp.max_examples
            cp.examples0, cp.var_shared, cp.var_seed = cp.max_examples, cp.var_shared * k, cp.var_seed * k
        claims.append(cp)
        specs[c.id] = (c, rule, sd_hi)
    return claims, figs, origin, specs


def _claim_entry_2(c, cp, spec: tuple, d, p_dec: Dict[str, float], fig: Dict[str, Any], origin: str, costs,
                   family: int, seed_base: int) -> Dict[str, Any]:
    """A claim's row in a second-format plan: its target, seeds, examples, power, MDE and status."""
    from ..report.paper import PAPER_ROWS
    from ..report.power import POWER, mde, power
    from . import design as G

    _, rule, sd_hi = spec
    n, ex = G.claim_n(cp, d), d.examples[c.id]
    se_ex = math.sqrt(max(0.0, cp.se(n, ex) ** 2 - sd_hi ** 2 / n))
    m = mde(sd_hi, n, rule["margin"], family=family, target_power=POWER, se_examples=se_ex)
    entry = {
        "id": c.id, "title": f"{c.subject} {c.says}", "suite": c.suite, "metric": c.metric,
        "baseline_metric": c.baseline_metric, "baseline": c.baseline, "rpc": c.rpc, "higher": c.higher,
        **rule, "paper": PAPER_ROWS.get(TARGET_ROW.get(c.id, c.id)),
        "status": PLANNED if m is not None and m <= rule["target"] else MDE_ABOVE,
        "seeds": list(range(seed_base, seed_base + n)), "examples": ex,
        "power": power(rule["target"], sd_hi, n, rule["margin"], family=family, se_examples=se_ex),
        "mde": m, "p_decided": p_dec[c.id], "se": cp.se(n, ex),
        "pilot": {"source": origin, **fig, "sd_upper": sd_hi}}
    if entry["status"] == MDE_ABOVE:
        entry["to_target"] = G.cheapest_to_target(cp, costs, family)
    return entry


def _source_seeds(sources: Sequence[tuple], cost_sources: Sequence[tuple], reference: Optional[tuple]) -> List[int]:
    """Every model seed any source of the plan ran."""
    runs = [res for _, res, _ in sources] + [res for _, res in list(cost_sources) + ([reference] if reference else [])]
    return sorted({int(x) for res in runs for mm in (res.get("models") or {}).values() for x in mm.get("seeds") or []})


def make_plan_2(sources: Sequence[tuple], cost_sources: Sequence[tuple], reference: Optional[tuple],
                budget_hours: float, jobs: int = 2, seed_base: int = 2000, settings: Optional[Dict[str, Any]] = None,
                created: Optional[str] = None, notes: Sequence[str] = (), load_factor: float = 1.0) -> Dict[str, Any]:
    """A plan of the second format (:mod:`rpc_attention.reproduce.design`). ``sources``: ``(path, results, claim
    ids or None)`` giving each claim's figures (the first that names it); ``cost_sources``: ``(path, results)``
    measured on the CPU the plan is for, ``reference``: ``(path, results)`` of a larger run whose stages fill in
    the rest, scaled to that CPU; ``settings``: the study settings that differ from the first source's;
    ``load_factor``: the wall time per CPU second of a stage under the expected load (1: an idle machine)."""
    from ..report.paper import PAPER_ROWS
    from ..report.power import POWER
    from . import design as G
    from .paper_data import PAPER_CLAIMS, PAPER_NOT_RUN

    s = _settings_2(sources, settings)
    costs = G.build_cost_model(cost_sources, reference)
    claims, figs, origin, specs = _claim_plans_2(sources, s)
    family = len(claims)
    groups = {g: ms for g, ms in GROUPS.items() if any(m in (cp.baseline, cp.rpc) for cp in claims for m in ms)}
    budget_s = float(budget_hours) * 3600.0 * int(jobs) / float(load_factor)
    d, spent = G.allocate(claims, costs, budget_s, family, groups)
    p_dec = G.decided(claims, d, family)
    out_claims = []
    for c in PAPER_CLAIMS:
        if c.id in PAPER_NOT_RUN:
            out_claims.append({"id": c.id, "title": f"{c.subject} {c.says}", "status": NOT_RUN,
                               "paper": PAPER_ROWS.get(c.id), **PAPER_NOT_RUN[c.id]})
            continue
        cp = next(x for x in claims if x.id == c.id)
        out_claims.append(_claim_entry_2(c, cp, specs[c.id], d, p_dec, figs[c.id], origin[c.id], costs, family,
                                         seed_base))
    pilot_seeds = _source_seeds(sources, cost_sources, reference)
    clash = sorted(set(pilot_seeds) & set(range(seed_base, seed_base + G.MAX_SEEDS)))
    if clash:
        raise StudyError(f"--seed-base {seed_base}: seeds {clash[:5]} were used by a source")
    for k in FIXED_EXAMPLES.values():
        s[k] = int(s[k])
    expected = sum(p_dec.values())
    return {
        "format": G.PLAN_FORMAT_2, "study": "paper", "created": created,
        "rule": {"text": RULE_TEXT_2, "margin_share": G.MARGIN_SHARE, "sd_level": G.SD_LEVEL, "k1_share": G.K1_SHARE,
                 "alpha": 0.05, "power": POWER, "family": FAMILY, "family_size": family, "smaller": True,
                 "floor": G.FLOOR, "cheap": list(G.CHEAP)},
        "budget": {"cap_hours": float(budget_hours), "jobs": int(jobs), "cpu_s": budget_s,
                   "estimate_cpu_s": spent, "estimate_hours_idle": spent / 3600.0 / int(jobs),
                   "load_factor": float(load_factor),
                   "estimate_hours": spent * float(load_factor) / 3600.0 / int(jobs),
                   "expected_decided": expected, "claims": family,
                   "note": "CPU seconds from the cost model; wall time at `jobs` stages at once, times the load factor"},
        "cost_model": costs.as_dict(),
        "seed_base": int(seed_base), "notes": list(notes),
        "pilot": {"sources": [{"path": str(p), "study": res.get("study"), "generated": res.get("generated"),
                               "claims": sorted(ids) if ids is not None else None} for p, res, ids in sources],
                  "cost_sources": [str(p) for p, _ in cost_sources], "reference": str(reference[0]) if reference else None,
                  "seeds": pilot_seeds},
        "settings": s,
        "models": {k: {"seeds": v} for k, v in sorted(d.seeds.items())},
        "claims": out_claims,
    }
