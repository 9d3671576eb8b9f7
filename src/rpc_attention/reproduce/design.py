"""The second plan format (``format`` 2): targets on each metric's natural scale, power from an upper confidence
bound of the measured spread, one cost model for the plan, ``--dry-run`` and the cost view, and seeds and test
examples spent where they decide a claim.

**Targets** (:func:`natural_target`, one rule for every claim). The paper's effect is carried to our baseline on
the scale on which the metric moves naturally, so a target can always be reached:

- a percentage bounded by 0 and 100 (top-1, AUPR, mIoU): the paper's change of the log-odds,
  ``logit(rpc) - logit(baseline)``, added to the log-odds of our baseline's mean; the target is the difference
  that makes in our units (near a ceiling the same log-odds step is a few points, never past 100);
- a ratio-scale error (mCE, perplexity): the paper's change of the logarithm, i.e. its relative change, times our
  baseline's mean;
- a finding without numbers (Scaled Attention beats the asymmetric ViT) takes the clean top-1 row's step;
- the kernel-PCA claims of the paper's section 2, which give no numbers: J_proj after training lower than at
  initialisation by a tenth of its initial magnitude (``K1_SHARE``); the learned values equal to the centred-Gram
  eigenvectors, i.e. the alignment at its maximum, 1, against its chance level: target ``1 - chance`` (K2).

The margin is ``MARGIN_SHARE`` of the target, as in the first format.

**Spread.** Each claim's per-seed sd is the upper ``SD_LEVEL`` one-sided confidence bound of the measured sd
(chi-square on n - 1 df), so that a design sized from a few seeds is not sized from a small sd by chance.

**Cost model** (:class:`CostModel`): CPU seconds of each model's training and of each (suite, model) evaluation
stage at a number of test examples, from measured stages (linear in the examples above a fixed part); the plan
records it, and a run of the plan takes every stage's estimate from it.

**Allocation** (:func:`allocate`). A claim is *decided* when its verdict is reproduced, contradicted, equivalent
or smaller than the paper's effect. For a design (seeds of each model, seeds and examples of each evaluation)
the probability that a claim is decided is computed with the first run's effect as the truth, its se from the sd
bound and the example variance, at Holm's strictest per-test levels over the family (a normal approximation; the
plan says so). Starting from ``FLOOR`` seeds per model, the step that adds the most decided claims per CPU second
(more seeds of a model group, more seeds or examples of an expensive evaluation) is taken while the budget lasts.
Cheap evaluations run on every seed of their models (``CHEAP``); the others on the seeds the allocation gives them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .specs import StudyError

PLAN_FORMAT_2 = 2
MARGIN_SHARE = 0.25
SD_LEVEL = 0.80
K1_SHARE = 0.10
FLOOR = 3
MAX_SEEDS = 200
# suites evaluated on every seed of their models: seconds per model against minutes for the attacks
CHEAP = ("clean", "corruptions", "fgsm", "ood", "kpca", "ppl", "wordswap", "seg")
EXAMPLE_STEPS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
SCALE_OF_METRIC = {"mCE": "log", "test_ppl_sliding": "log", "test_attacked_ppl_sliding": "log"}


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def natural_target(row: Mapping[str, Any], scale: str, baseline_mean: float) -> Dict[str, Any]:
    """``{"gain", "target", "margin", "scale", "derivation"}`` of a claim whose paper row is ``row`` (its
    baseline, RPC and direction) on ``scale`` (``logit`` for percentages, ``log`` for ratio-scale errors),
    at our baseline's mean; the target is oriented (> 0: the paper's direction) and in our units."""
    b, r, higher = float(row["baseline"]), float(row["rpc"]), bool(row.get("higher", True))
    ours = float(baseline_mean)
    if scale == "logit":
        if not (0.0 < b < 100.0 and 0.0 < r < 100.0 and 0.0 < ours < 100.0):
            raise ValueError(f"the log-odds rule needs percentages strictly between 0 and 100 (paper {b} -> {r}, "
                             f"ours {ours})")
        step = _logit(r / 100.0) - _logit(b / 100.0)
        step = step if higher else -step
        target = 100.0 * _expit(_logit(ours / 100.0) + step) - ours
        how = (f"log-odds step of the paper's {b:g} -> {r:g} ({step:+.4f}) from our baseline {ours:.4g}: "
               f"{ours:.4g} -> {ours + target:.4g}")
    elif scale == "log":
        step = math.log(b / r) if not higher else math.log(r / b)
        target = ours * (1.0 - math.exp(-step))
        how = (f"relative change of the paper's {b:g} -> {r:g} ({100 * (1 - math.exp(-step)):.3g} %) of our "
               f"baseline {ours:.4g}")
    else:
        raise ValueError(f"unknown scale {scale!r}")
    if target <= 0:
        raise ValueError(f"the paper's row {row} shows no improvement; it cannot set a target")
    return {"gain": step, "target": target, "margin": MARGIN_SHARE * target, "scale": scale, "derivation": how}


def kpca_target(kind: str, pilot_baseline_mean: float) -> Dict[str, Any]:
    """The kernel-PCA rows' targets: ``k1`` (J_proj lower after training by ``K1_SHARE`` of |J_proj at
    initialisation|, our pilot's mean) or ``k2`` (the alignment at its maximum 1 against the chance level, our
    pilot's mean chance)."""
    b = float(pilot_baseline_mean)
    if kind == "k1":
        target = K1_SHARE * abs(b)
        how = f"{K1_SHARE:g} x |J_proj at initialisation| ({b:.4g}; the paper states the direction, not a size)"
    elif kind == "k2":
        target = 1.0 - b
        how = f"values equal to the eigenvectors: alignment 1 against the chance level {b:.4g}"
    else:
        raise ValueError(f"unknown kernel-PCA row kind {kind!r}")
    if target <= 0:
        raise ValueError(f"the {kind} rule gives no positive target at {b}")
    return {"gain": None, "target": target, "margin": MARGIN_SHARE * target, "scale": kind, "derivation": how}


def sd_upper(sd: float, n: int, level: float = SD_LEVEL) -> float:
    """The upper one-sided ``level`` confidence bound of a normal sd measured as ``sd`` on n values."""
    from scipy import stats

    if n < 2:
        raise ValueError("an sd bound needs two or more values")
    return float(sd) * math.sqrt((n - 1) / stats.chi2.ppf(1.0 - level, n - 1))


# ------------------------------------------------------------------------------------------ cost model
def _stage_key(name: str) -> Tuple[str, str, Optional[str]]:
    """``(kind, model, suite)`` of a stage name ``train.<model>-s<seed>`` / ``eval.<model>-s<seed>.<suite>``."""
    parts = name.split(".")
    model = parts[1].rsplit("-s", 1)[0] if len(parts) > 1 else ""
    return parts[0], model, ".".join(parts[2:]) or None


@dataclass
class CostModel:
    """CPU seconds per stage: ``train[model]``; ``evals["suite:model"] = {"s", "examples"}``, the seconds of a
    stage at ``examples`` test examples (None: a suite that scores a fixed set), scaled linearly in the examples
    above ``fixed_s``; ``cpu`` the CPU the figures are for, ``sources`` where they came from."""

    train: Dict[str, float] = field(default_factory=dict)
    evals: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    fixed_s: float = 2.0
    cpu: str = ""
    sources: List[str] = field(default_factory=list)

    def train_s(self, model: str) -> float:
        if model not in self.train:
            raise StudyError(f"the cost model has no training time of model {model!r}")
        return float(self.train[model])

    def eval_s(self, suite: str, model: str, examples: Optional[int] = None) -> float:
        e = self.evals.get(f"{suite}:{model}")
        if e is None:
            raise StudyError(f"the cost model has no time of {suite} on model {model!r}")
        s, n0 = float(e["s"]), e.get("examples")
        if not n0 or not examples:
            return s
        fixed = min(self.fixed_s, s)
        return fixed + (s - fixed) * float(examples) / float(n0)

    def as_dict(self) -> Dict[str, Any]:
        return {"train": dict(sorted(self.train.items())), "evals": dict(sorted(self.evals.items())),
                "fixed_s": self.fixed_s, "cpu": self.cpu, "sources": list(self.sources)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostModel:
        return cls(dict(d.get("train") or {}), {k: dict(v) for k, v in (d.get("evals") or {}).items()},
                   float(d.get("fixed_s", 2.0)), str(d.get("cpu") or ""), list(d.get("sources") or []))


def measured_costs(res: Mapping[str, Any]) -> Tuple[Dict[str, List[float]], Dict[str, List[Tuple[float, int]]]]:
    """``({model: [cpu s]}, {"suite:model": [(cpu s, examples)]})`` of a results file's finished stages, examples
    from each evaluation's record (None where the suite scores a fixed set)."""
    train: Dict[str, List[float]] = {}
    evals: Dict[str, List[Tuple[float, int]]] = {}
    for st in res.get("stages") or []:
        secs = st.get("cpu_s")
        if st.get("status") != "done" or not secs or st.get("resumed"):
            continue
        kind, model, suite = _stage_key(st["name"])
        if kind == "train":
            train.setdefault(model, []).append(float(secs))
        elif kind == "eval" and suite:
            seed = st["name"].split(".")[1].rsplit("-s", 1)[1]
            rec = ((res.get("evals") or {}).get(suite, {}).get(model, {}).get(seed) or {})
            evals.setdefault(f"{suite}:{model}", []).append((float(secs), rec.get("n_examples")))
    return train, evals


def build_cost_model(sources: Sequence[Tuple[str, Mapping[str, Any]]], reference: Optional[Tuple[str, Mapping]] = None,
                     fixed_examples: Sequence[str] = ("ood", "ppl", "wordswap", "kpca")) -> CostModel:
    """The cost model from measured stages. ``sources``: ``(path, results)`` on the CPU the plan is for, first
    first; ``reference``: a larger run on another CPU, whose stages fill in what the sources lack, each scaled by
    the ratio of the two CPUs' times of the same stages (per suite where both ran it, else the median ratio of
    its kind)."""
    import statistics

    train: Dict[str, float] = {}
    evals: Dict[str, Dict[str, Any]] = {}
    names, cpu = [], ""
    for path, res in sources:
        names.append(str(path))
        cpu = cpu or str((res.get("setup") or {}).get("cpu") or "")
        t, e = measured_costs(res)
        for m, xs in t.items():
            train.setdefault(m, statistics.mean(xs))
        for k, xs in e.items():
            suite = k.split(":")[0]
            n = None if suite in fixed_examples else (xs[0][1] or None)
            evals.setdefault(k, {"s": statistics.mean(x for x, _ in xs), "examples": n})
    if reference is not None:
        path, res = reference
        names.append(f"{path} (scaled to this CPU)")
        t, e = measured_costs(res)
        rt = [train[m] / statistics.mean(xs) for m, xs in t.items() if m in train]
        per_suite: Dict[str, List[float]] = {}
        for k, xs in e.items():
            if k in evals:
                mine = evals[k]
                ref_n = xs[0][1]
                ref_s = statistics.mean(x for x, _ in xs)
                scaled = CostModel(evals={k: mine}).eval_s(*k.split(":"), ref_n) if mine["examples"] else mine["s"]
                per_suite.setdefault(k.split(":")[0], []).append(scaled / ref_s)
        train_ratio = statistics.median(rt) if rt else 1.0
        eval_ratio = statistics.median([r for v in per_suite.values() for r in v]) if per_suite else 1.0
        for m, xs in t.items():
            train.setdefault(m, train_ratio * statistics.mean(xs))
        for k, xs in e.items():
            if k in evals:
                continue
            suite = k.split(":")[0]
            ratio = statistics.median(per_suite[suite]) if suite in per_suite else eval_ratio
            n = None if suite in fixed_examples else (xs[0][1] or None)
            evals[k] = {"s": ratio * statistics.mean(x for x, _ in xs), "examples": n}
    return CostModel(train, evals, cpu=cpu, sources=names)


# ------------------------------------------------------------------------------------------ decisions
@functools.lru_cache(maxsize=4096)
def _critical(n: int, family: int, alpha: float) -> Tuple[float, float]:
    """``(c2, c1)``: t quantiles on n - 1 df at two-sided and one-sided alpha / family."""
    from scipy import stats

    return (float(stats.t.ppf(1.0 - alpha / (2 * family), n - 1)), float(stats.t.ppf(1.0 - alpha / family, n - 1)))


def decide_probability(delta: float, se: float, n: int, margin: float, target: float, family: int,
                       alpha: float = 0.05) -> float:
    """The probability that a claim of true oriented effect ``delta`` is decided (reproduced, contradicted,
    equivalent or smaller than ``target``) with standard error ``se`` on n - 1 df, at Holm's strictest per-test
    levels (two-sided alpha / family for a difference, one-sided alpha / family against the target), the mean
    taken as normal: 1 - P(target - c1 se <= mean <= margin + c2 se) (the contradicted and equivalent regions lie
    inside "below the target" when the target exceeds the margin)."""
    from scipy import stats

    if n < 2 or se <= 0:
        return 0.0
    c2, c1 = _critical(int(n), int(family), float(alpha))
    hi, lo = margin + c2 * se, target - c1 * se
    if lo >= hi:
        return 1.0
    return float(1.0 - (stats.norm.cdf((hi - delta) / se) - stats.norm.cdf((lo - delta) / se)))


@dataclass
class ClaimPlan:
    """One claim as the allocation sees it: its models, suite, pilot figures and target."""

    id: str
    suite: str
    baseline: str
    rpc: str
    delta: float            # the first run's oriented effect (the planning truth)
    sd: float               # the upper bound of the per-seed sd
    var_shared: float       # example variance every seed shares, at ``examples0``
    var_seed: float         # each seed's own example variance, at ``examples0``
    examples0: Optional[int]
    target: float
    margin: float
    max_examples: Optional[int] = None

    def se(self, n: int, examples: Optional[int]) -> float:
        scale = 1.0 if not self.examples0 or not examples else self.examples0 / examples
        return math.sqrt(self.sd ** 2 / n + (self.var_shared + self.var_seed / n) * scale)

    def example_options(self) -> List[Optional[int]]:
        if not self.examples0 or not self.max_examples:
            return [self.examples0]
        return sorted({min(self.max_examples, max(1, int(round(self.examples0 * k)))) for k in EXAMPLE_STEPS})


@dataclass
class Design:
    """Seeds of every model; seeds and examples of every claim's evaluation (``n`` at most its models' seeds)."""

    seeds: Dict[str, int]
    n: Dict[str, int]
    examples: Dict[str, Optional[int]]


def claim_n(c: ClaimPlan, d: Design) -> int:
    both = min(d.seeds[c.baseline], d.seeds[c.rpc]) if c.baseline != c.rpc else d.seeds[c.rpc]
    return both if c.suite in CHEAP else min(d.n[c.id], both)


def design_cost(claims: Sequence[ClaimPlan], d: Design, costs: CostModel) -> float:
    total = sum(n * costs.train_s(m) for m, n in d.seeds.items())
    runs: Dict[Tuple[str, str], Tuple[int, Optional[int]]] = {}
    for c in claims:
        n = claim_n(c, d)
        for m in {c.baseline, c.rpc}:
            old = runs.get((c.suite, m), (0, None))
            ex = d.examples[c.id]
            runs[(c.suite, m)] = (max(old[0], n), ex if old[1] is None or (ex or 0) > old[1] else old[1])
    return total + sum(n * costs.eval_s(suite, m, ex) for (suite, m), (n, ex) in runs.items())


def decided(claims: Sequence[ClaimPlan], d: Design, family: int) -> Dict[str, float]:
    return {c.id: decide_probability(c.delta, c.se(claim_n(c, d), d.examples[c.id]), claim_n(c, d), c.margin,
                                     c.target, family) for c in claims}


def allocate(claims: Sequence[ClaimPlan], costs: CostModel, budget_s: float, family: int,
             groups: Mapping[str, Sequence[str]]) -> Tuple[Design, float]:
    """The design (see the module's docstring): model ``groups`` (models trained on the same seeds, e.g. the
    SymViT and its RPC model) grow together; returns ``(design, its CPU seconds)``."""
    seeds = {m: FLOOR for ms in groups.values() for m in ms}
    d = Design(seeds, {c.id: FLOOR for c in claims}, {c.id: c.examples0 for c in claims})
    spent = design_cost(claims, d, costs)
    if spent > budget_s:
        raise StudyError(f"the budget ({budget_s / 3600:.1f} CPU hours) cannot run every claim at {FLOOR} seeds "
                         f"({spent / 3600:.1f} CPU hours): raise --budget-hours")
    score = sum(decided(claims, d, family).values())
    while True:
        best = None
        for move in _moves(claims, d, groups):
            cost = design_cost(claims, move, costs) - spent
            if spent + cost > budget_s or cost <= 0:
                continue
            gain = sum(decided(claims, move, family).values()) - score
            if gain > 1e-4 and (best is None or gain / cost > best[0]):
                best = (gain / cost, move, cost, gain)
        if best is None:
            return d, spent
        _, d, cost, gain = best
        spent, score = spent + cost, score + gain


def _moves(claims: Sequence[ClaimPlan], d: Design, groups: Mapping[str, Sequence[str]]):
    """Designs one step from ``d``: a model group's seeds up by 1, 3 or 10; an expensive evaluation's seeds up by
    1, 3 or 10 (within its models' seeds); a claim's examples one step up."""
    for ms in groups.values():
        for k in (1, 3, 10):
            if d.seeds[ms[0]] + k <= MAX_SEEDS:
                yield Design({**d.seeds, **{m: d.seeds[m] + k for m in ms}}, d.n, d.examples)
    for c in claims:
        both = min(d.seeds[c.baseline], d.seeds[c.rpc])
        if c.suite not in CHEAP:
            for k in (1, 3, 10):
                if d.n[c.id] + k <= both:
                    yield Design(d.seeds, {**d.n, c.id: d.n[c.id] + k}, d.examples)
        opts = c.example_options()
        cur = d.examples[c.id]
        up = [x for x in opts if x is not None and cur is not None and x > cur]
        if up:
            yield Design(d.seeds, d.n, {**d.examples, c.id: up[0]})


def cheapest_to_target(c: ClaimPlan, costs: CostModel, family: int) -> Optional[Dict[str, Any]]:
    """The cheapest (seeds, examples) at which this claim's MDE reaches its target, alone (its models' training
    and its evaluations), or None if no design up to 1,000 seeds does."""
    from ..report.power import seeds_needed

    best = None
    for ex in c.example_options():
        n = FLOOR
        while n <= 1000:
            need = seeds_needed(c.target, c.sd, c.margin, family=family,
                                se_examples=math.sqrt(max(0.0, c.se(n, ex) ** 2 - c.sd ** 2 / n)), max_seeds=1000)
            if need is None:
                break
            if need <= n:
                break
            n = need
        if need is None or n > 1000:
            continue
        models = {c.baseline, c.rpc}
        cost = sum(n * (costs.train_s(m) + costs.eval_s(c.suite, m, ex)) for m in models)
        if best is None or cost < best["cpu_s"]:
            best = {"seeds": n, "examples": ex, "cpu_s": cost}
    return best
