"""The performance targets, evaluated on a run's results (a target whose measurement is missing is
reported as not measured, never as met).

Each :class:`Target` names the rows it reads by their case (shape, mode, kind, iterations, option) or by
their model key, never by a table label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple


def op_row(results: dict, shape: str, mode: str, kind: str, n: int, option: Optional[str] = None) -> Optional[dict]:
    """The operator row of one case, or None when the run did not measure it."""
    for g in results.get("ops", []):
        if g["shape"] == shape and g["mode"] == mode:
            for r in g["rows"]:
                if (r["kind"], r["n"], r.get("option")) == (kind, n, option):
                    return r
    return None


def model_row(results: dict, family: str, key: str) -> Optional[dict]:
    """The model row of ``key`` in ``family``, or None."""
    for fam in results.get("models", []):
        if fam["family"] == family:
            return next((r for r in fam["rows"] if r["key"] == key), None)
    return None


def _ratio(row: Optional[dict], name: str) -> Optional[float]:
    """A ratio of a row: the median of a round-by-round summary, or a plain number."""
    value = (row or {}).get("ratios", {}).get(name)
    return value.get("median") if isinstance(value, dict) else value


@dataclass(frozen=True)
class Target:
    """``name`` with ``goal`` (as shown), the row it reads (``find(results)``, first found of the
    alternatives), the ratio of that row, and whether a value meets the goal. ``{row}`` in the name is
    the row's case or model label (``missing`` when the run has no such row); ``applies`` says whether
    the run measured what the target is about at all."""

    name: str
    goal: str
    find: Callable[[dict], Optional[dict]]
    ratio: str
    met: Callable[[float], bool]
    missing: str = "-"
    applies: Callable[[dict], bool] = lambda results: True

    def evaluate(self, results: dict) -> dict:
        row = self.find(results)
        value = _ratio(row, self.ratio)
        label = (row.get("case") or row.get("model")) if row else self.missing
        return {"target": self.name.format(row=label), "goal": self.goal, "measured": value,
                "met": None if value is None else bool(self.met(value))}


def _first(*finders: Callable[[dict], Optional[dict]]) -> Callable[[dict], Optional[dict]]:
    return lambda res: next((r for r in (f(res) for f in finders) if r is not None), None)


def _op(shape: str, kind: str, n: int, option: Optional[str] = None) -> Callable[[dict], Optional[dict]]:
    return lambda res: op_row(res, shape, "fwd+bwd", kind, n, option)


def _op_targets() -> List[Target]:
    out = [Target(f"PAP {n} iter fwd+bwd / ({n} x SDPA), DeiT-tiny B=8", "<= 1.3", _op("deit-b8", "pap", n),
                  "vs_n_sdpa", lambda x: x <= 1.3) for n in (2, 6)]
    out += [Target(f"speed-up over official, fwd+bwd, {shape} ({{row}})", ">= 1.8",
                   _first(_op(shape, "official", 6), _op(shape, "official", 2)), "official_over_pap",
                   lambda x: x >= 1.8) for shape in ("deit-b8", "long-1024")]
    out += [Target(f"backward peak memory PAP / official, {shape} ({{row}})", "<= 0.5",
                   _first(_op(shape, "official", 2), _op(shape, "official", 6)), "pap_peak_over_official",
                   lambda x: x <= 0.5) for shape in ("long-1024", "long-4096")]
    out += [Target("saved-for-backward of {row} / pap 1, N=4096", "close to 1 (ckpt)", _op("long-4096", "pap", 6, opt),
                   "saved_vs_pap1", lambda x: x <= 2.0, missing=label) for opt, label in ((None, "pap 6"),
                                                                                       ("ckpt", "pap 6 ckpt"))]
    return out


def _ran_vision(results: dict) -> bool:
    return any(f["family"] == "vision" for f in results.get("models", []))


def _model_targets(goals: Sequence[Tuple[str, float]], ratio: str = "train_vs_base",
                   what: str = "train step") -> List[Target]:
    return [Target(f"{{row}} {what} / SymViT-tiny", f"<= {goal}", lambda res, key=key: model_row(res, "vision", key),
                   ratio, lambda x, goal=goal: x <= goal, missing=key, applies=_ran_vision)
            for key, goal in goals]


# The robust PAP (docs/method.md#robust-variants) is to cost what SymViT costs: within 10 %.
TARGETS: Tuple[Target, ...] = tuple(_op_targets() + _model_targets([("rpc6_layer1", 1.25), ("rpc2_all", 2.2),
                                                                    ("rpc_robust", 1.1)])
                                    + _model_targets([("rpc_robust", 1.1)], "infer_vs_base", "inference"))


def targets(results: dict) -> List[dict]:
    """Every target of :data:`TARGETS` on ``results``: target, goal, measured value, met (None: not measured)."""
    return [t.evaluate(results) for t in TARGETS if t.applies(results)]
