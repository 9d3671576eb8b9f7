"""The parts a study is made of: the models it trains, the evaluations and claims, and its typed
settings. The studies themselves are data (:mod:`rpc_attention.reproduce.study_data`); the builder
(:mod:`rpc_attention.reproduce.studies`) turns settings into a :class:`Study`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Sequence, get_type_hints

from ..overrides import parse_assignments, typed_value, unknown_key


class StudyError(ValueError):
    """A user error in choosing or configuring a study (unknown setting, missing data path)."""


@dataclass(kw_only=True)
class ModelSpec:
    """One model of a study, trained once per seed (run folders ``runs/<key>-s<seed>``)."""

    key: str                    # short id
    label: str                  # as printed in tables ("RPC-SymViT 6iter/layer1")
    preset: str                 # trainer preset (src/rpc_attention/presets/<preset>.yaml)
    overrides: List[str] = field(default_factory=list)   # trainer --set overrides
    family: str = "vision"      # vision | fan | lm | seg | scaled
    role: str = "baseline"      # baseline | rpc | variant
    seeds: List[int] = field(default_factory=lambda: [0])
    train_samples: int = 0      # samples seen in training (for the time estimate)
    cost: float = 1.0           # relative cost per sample (PAP iterations)
    callbacks: List[str] = field(default_factory=list)   # trainer epoch-end callbacks (e.g. jproj)
    # a model that is not trained: the trained runs of the model ``base`` (same seeds) evaluated with these
    # model keywords set on top of theirs (options without weights, e.g. a key control)
    base: Optional[str] = None
    model_kwargs: Dict[str, Any] = field(default_factory=dict)

    def runs(self) -> List[str]:
        return [f"{self.key}-s{s}" for s in self.seeds]


@dataclass(kw_only=True)
class EvalSpec:
    """One suite run on some models (every seed of each, or the listed ``seeds`` of each)."""

    suite: str
    models: List[str]
    sets: List[str] = field(default_factory=list)   # eval --set options
    limit: Optional[int] = None
    n_eps: Optional[int] = None                     # for the estimate of sweeps
    steps: Optional[int] = None                     # attack steps per eps (estimate of PGD sweeps)
    copies: int = 1                                 # corrupted copies per example (estimate)
    baseline_model: Optional[str] = None            # corruptions: normalise by this model's run (same seed)
    seeds: Optional[List[int]] = None               # None: every seed of each model; else only these

    def runs_of(self, model: ModelSpec) -> List[tuple]:
        """``(seed, run)`` of ``model`` this evaluation runs on."""
        return [(s, r) for s, r in zip(model.seeds, model.runs()) if self.seeds is None or s in self.seeds]


@dataclass(frozen=True, kw_only=True)
class ClaimSpec:
    """A claim tested by one comparison: ``rpc`` against ``baseline`` on a suite's metric.

    The title is ``subject`` (the RPC model as the claim names it) followed by ``says``. ``family`` is
    the pre-registered family the claim is decided in (``rpc_attention.report.verdict.FAMILIES``: Holm's
    adjustment runs within it); ``target`` the effect the study is powered for (the paper's own
    improvement in our units; None: no power target); ``smaller`` whether the plan registered the test
    that the effect is below that target (the verdict "smaller than the paper's effect").
    """

    id: str                 # key into rpc_attention.report.paper.PAPER_ROWS, or our own id
    subject: str            # "RPC (6 iters, layer 1)"
    says: str               # "raises clean top-1"
    table: str              # the task table it belongs to: vision | fan | lm | seg | scaled
    suite: str
    metric: str             # a metric name the suite defines
    baseline: str           # model key
    rpc: str                # model key
    higher: bool = True
    margin: float = 1.0
    relative: bool = False  # margin is a fraction of the baseline value
    paper_id: Optional[str] = None  # the paper's row this claim is compared with (default: id)
    family: str = "secondary"
    target: Optional[float] = None  # oriented effect (metric units) the design is powered for
    smaller: bool = False   # the plan registered the "smaller than the paper's effect" test against target
    # the baseline's metric where it is not ``metric`` (a claim within one model, paired per seed: a
    # trained model against its own initialisation, or a measured alignment against its chance level)
    baseline_metric: Optional[str] = None

    def __post_init__(self) -> None:
        from ..report.verdict import FAMILIES

        if self.family not in FAMILIES:
            raise ValueError(f"claim {self.id!r}: family {self.family!r} is not one of {', '.join(FAMILIES)}")
        if self.target is not None and self.target <= self.margin:
            raise ValueError(f"claim {self.id!r}: target {self.target} must exceed the margin {self.margin}")
        if self.smaller and self.target is None:
            raise ValueError(f"claim {self.id!r}: the test against the paper's effect needs a target")

    @property
    def title(self) -> str:
        return f"{self.subject} {self.says}"

    def variant(self, suffix: str, subject: str, rpc: str) -> ClaimSpec:
        """The same claim for another RPC model, compared with the same paper row."""
        return replace(self, id=f"{self.id}_{suffix}", subject=subject, rpc=rpc, paper_id=self.paper_id or self.id)


@dataclass
class Study:
    name: str
    description: str
    models: List[ModelSpec]
    evals: List[EvalSpec] = field(default_factory=list)
    analyses: List[Dict[str, Any]] = field(default_factory=list)   # {"model": key, "sets": ["limit=8", ...]}
    compare: Optional[Dict[str, Any]] = None                        # {"models": [keys], "metrics": [...], "split": "val"}
    claims: List[ClaimSpec] = field(default_factory=list)
    settings: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    device: str = "cpu"
    # claims the study keeps a row for without running them: {"id", "title", "reason", "command", "cost"}
    not_run: List[Dict[str, Any]] = field(default_factory=list)
    plan: Optional[Dict[str, Any]] = None   # the pre-registered plan the study follows ({"path", "sha256", ...})
    cost_model: Optional[Any] = None        # the plan's cost model (design.CostModel): every stage's estimate
    seed_major: bool = False                # stages ordered by seed (studies.build_stages)

    def model(self, key: str) -> ModelSpec:
        for m in self.models:
            if m.key == key:
                return m
        raise KeyError(key)


# --------------------------------------------------------------------------------------- settings
def setting(default: Any = None, key: Optional[str] = None) -> Any:
    """A field of a settings dataclass; ``key`` is its ``--set`` name where that is not the field's
    name (``data.imagenet``); list defaults are copied per instance."""
    meta = {"key": key} if key else {}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def setting_key(f) -> str:
    return f.metadata.get("key", f.name)


def settings_dict(values: Any) -> Dict[str, Any]:
    """``{--set name: value}`` of a settings dataclass, in field order (what the report records)."""
    return {setting_key(f): copy.deepcopy(getattr(values, f.name)) for f in fields(values)}


def parse_settings(items: Optional[Sequence[str]], defaults: Any, study: str) -> Dict[str, Any]:
    """``["seeds=0,1", "eval_limit=300"]`` on top of ``defaults`` (a settings dataclass), in the
    package's one ``KEY=VALUE`` grammar; each value is checked against its field's type (any
    setting may be ``null``). Unknown keys and values of the wrong type are StudyErrors."""
    hints = get_type_hints(type(defaults))
    by_key = {setting_key(f): f for f in fields(defaults)}
    values: Dict[str, Any] = {}
    try:
        for key, value in parse_assignments(items, "--set"):
            if key not in by_key:
                raise unknown_key(key, by_key, f"setting of study {study!r}")
            name = by_key[key].name
            values[name] = None if value is None else typed_value(key, value, hints[name])
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    return settings_dict(replace(defaults, **values))
