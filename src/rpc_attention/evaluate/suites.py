"""Registry of evaluation suites.

A suite is a function ``fn(model, cfg, run_dir, opts) -> result`` registered with
:func:`register_suite`.  ``model`` is a plain ``nn.Module`` in eval mode (for classification: a
classifier taking *normalised* images, as trained), ``cfg`` the resolved run config (the suites read
``cfg["data"]`` and ``cfg["model"]``), ``run_dir`` the run directory (or ``None``) and ``opts`` the
suite's options (its declared defaults overridden by ``--set``) plus the common options ``limit``,
``batch_size``, ``seed``, ``device``.

The result is a dict with at least ``metrics`` (flat ``{name: float}``) and optionally ``rows``
(list of dicts, rendered as the markdown table), ``data`` (what was evaluated), ``protocol`` (one
sentence) and ``settings`` (resolved settings worth recording beyond ``opts``).  The runner
(:func:`run_suite`) adds the model description, every option, the seed, number of examples and wall
time, and :func:`write_result` writes ``<out>/<suite>.json`` and ``<out>/<suite>.md`` atomically.

The built-in suite modules are listed in :func:`_register_builtin_suites` and imported on first use of
the registry; each registers its suites on import.  A new suite module is one more name in that list
(or a ``register_suite`` call of your own).  Keep heavy imports (torchattacks, imagecorruptions, ...)
inside the suite functions.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    get_args,
    get_origin,
    get_type_hints,
)

from ..files import atomic_write_json, atomic_write_text  # atomic_write_text: re-exported
from ..markdown import markdown_table
from ..overrides import parse_assignments, parse_number, typed_value, unknown_key
from ..overrides import parse_value as read_value

__all__ = [
    "Suite", "register_suite", "get_suite", "list_suites", "COMMON_DEFAULTS", "parse_eps_list",
    "parse_sets", "option_value", "resolve_options", "run_suite", "write_result", "render_markdown", "atomic_write_text",
]

@dataclass(frozen=True)
class CommonOptions:
    """Options every suite receives (``--set batch_size=64`` or ``--limit N``); a suite's options are a
    frozen dataclass derived from this one (a field redeclared there changes that suite's default)."""

    limit: Optional[int] = None
    batch_size: int = 128
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.limit is not None and int(self.limit) <= 0:
            raise ValueError(f"--limit must be positive, got {self.limit}")
        if int(self.batch_size or 0) <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")


def eps_option(sweep: str) -> Any:
    """A field holding an eps list, with ``sweep`` (``"1:6/255"``) as its default."""
    return field(default_factory=lambda: parse_eps_list(sweep))


def list_option(items: Sequence[Any]) -> Any:
    """A field holding a list, with a copy of ``items`` as its default."""
    return field(default_factory=lambda: list(items))


COMMON_DEFAULTS: Dict[str, Any] = {f.name: f.default for f in fields(CommonOptions)}


@dataclass(frozen=True)
class Cost:
    """What one example costs the suite, for time estimates (``reproduce --dry-run``).

    ``forward`` / ``backward`` count forward and forward+backward passes per example at the suite's
    defaults. A sweep suite (``per_eps`` set) runs one clean pass plus ``per_eps`` gradient steps per
    budget, so a study that sets the number of budgets or steps gets ``n_eps + 1`` forward and
    ``n_eps * steps`` backward passes. ``corrupts``: every copy of an example is corrupted first (that
    time is added). ``full_split_s``: the suite is timed as a whole (seconds for a split of 10,000
    examples or more) instead of per pass. ``per_step``: a suite without budgets whose work grows with
    its steps (the patch attack): a study that sets ``steps`` gets ``per_step * steps`` backward passes.
    """

    forward: int = 2
    backward: int = 0
    per_eps: Optional[int] = None
    corrupts: bool = False
    full_split_s: Optional[float] = None
    per_step: Optional[float] = None

    def passes(self, n_eps: Optional[int] = None, steps: Optional[int] = None) -> Tuple[int, int]:
        """``(forward, backward)`` passes per example for ``n_eps`` budgets of ``steps`` steps each."""
        if self.per_step is not None and steps is not None and self.per_eps is None:
            return self.forward, int(round(self.per_step * int(steps)))
        if self.per_eps is None or (n_eps is None and steps is None):
            return self.forward, self.backward
        n = 6 if n_eps is None else int(n_eps)
        per = int(steps) if steps is not None else self.per_eps
        return n + 1, per * n


@dataclass(frozen=True)
class Column:
    """One column of a report table: ``table`` (vision, fan, scaled, lm, seg), the suite's ``metric``,
    its ``header``, whether higher is better, the paper's row it is compared with (if any) and its
    ``position`` in the table (columns are sorted by it; a new suite's come last by default)."""

    table: str
    metric: str
    header: str
    higher: bool = True
    paper: Optional[str] = None
    position: int = 1000


@dataclass(frozen=True)
class StudyUse:
    """How a reproduction study asks for the suite: which study settings feed it.

    ``limit``: the study setting holding its number of examples (unset: the study's ``eval_limit``).
    ``sweep``: it takes the study's ``eps`` sweep; ``steps``: ``<suite>.steps`` from the study setting
    ``<suite>_steps`` when set. ``names``: a study setting listing what it runs (passed as
    ``<suite>.names``); each name costs ``copies`` copies of an example (``all_names`` when the list is
    empty). ``extra_sets``: a study setting of further ``--set`` items. ``baseline``: the metric it
    normalises by the baseline model's run of the same seed (that model scores 100 on it by
    definition), or None. ``models``: a study setting listing the model keys it runs on (unset: every
    vision model of the study).
    """

    limit: str = "eval_limit"
    sweep: bool = False
    steps: bool = False
    names: Optional[str] = None
    all_names: int = 0
    copies: int = 1
    extra_sets: Optional[str] = None
    baseline: Optional[str] = None
    models: Optional[str] = None


@dataclass
class Suite:
    name: str
    fn: Callable[..., Dict[str, Any]]
    tasks: Tuple[str, ...] = ("classification",)
    defaults: Dict[str, Any] = field(default_factory=dict)  # its own options' defaults (from ``options``)
    description: str = ""
    check: Optional[Callable[[Mapping[str, Any], Dict[str, Any]], None]] = None  # early validation
    module: str = field(default="")
    metrics: Tuple[str, ...] = ()          # the names of its summary metrics (constants of its module)
    cost: Cost = Cost()
    columns: Tuple[Column, ...] = ()       # its columns in the report's task tables
    curve: bool = False                    # plotted in the report's accuracy-vs-budget figure
    study: StudyUse = StudyUse()
    options: type = CommonOptions          # its options: a frozen dataclass derived from CommonOptions


_SUITES: Dict[str, Suite] = {}
_BUILTINS_REGISTERED = False
# suites of a floor above this one, registered by that floor (their modules cannot be imported from here)
_OWNED_BY_KPCA = ("kpca",)


def register_suite(
    name: str,
    fn: Callable[..., Dict[str, Any]],
    tasks: Sequence[str] = ("classification",),
    options: type = CommonOptions,
    description: str = "",
    check: Optional[Callable[[Mapping[str, Any], Dict[str, Any]], None]] = None,
    *,
    metrics: Sequence[str] = (),
    cost: Cost = Cost(),
    columns: Sequence[Column] = (),
    curve: bool = False,
    study: StudyUse = StudyUse(),
) -> Suite:
    """Register suite ``name`` (re-registering the same name replaces it).

    ``options`` is a frozen dataclass derived from :class:`CommonOptions` declaring the suite's options,
    their types and defaults (``List[float]``: an eps list, ``List[str]``: a comma list, ``Optional[str]``:
    a path or None); ``--set name.key=value`` then reads ``value`` as that type and unknown keys are
    rejected.  ``check(cfg, opts)`` runs before any suite starts and
    raises ``ValueError``/``FileNotFoundError`` for bad input (missing data, ...). ``metrics``,
    ``cost``, ``columns``, ``curve`` and ``study`` are what the estimates, the report and the studies
    read about the suite (:class:`Cost`, :class:`Column`, :class:`StudyUse`).
    """
    if not name or any(c in name for c in " ,=/"):
        raise ValueError(f"invalid suite name {name!r}")
    if not (isinstance(options, type) and issubclass(options, CommonOptions)):
        raise TypeError(f"suite {name!r}: options must be a dataclass derived from CommonOptions")
    base = options()
    own = {f.name: getattr(base, f.name) for f in fields(options)
           if f.name not in COMMON_DEFAULTS or getattr(base, f.name) != COMMON_DEFAULTS[f.name]}
    suite = Suite(name, fn, tuple(tasks), own, description, check, getattr(fn, "__module__", ""), tuple(metrics),
                  cost, tuple(columns), curve, study, options)
    _SUITES[name] = suite
    return suite


def _register_builtin_suites() -> None:
    """Import the built-in suite modules (each registers its suites on import); idempotent. The flag is set
    after the imports, so a failing import is retried (and reported) at the next lookup."""
    global _BUILTINS_REGISTERED
    if _BUILTINS_REGISTERED:
        return
    from . import certify, classification, corruptions, lm, ood, patch, segmentation, sparse  # noqa: F401
    _BUILTINS_REGISTERED = True


def list_suites(task: Optional[str] = None) -> List[str]:
    _register_builtin_suites()
    return sorted(n for n, s in _SUITES.items() if task is None or task in s.tasks)


def all_suites() -> List[Suite]:
    """Every registered suite, in the order of registration (the report's column order)."""
    _register_builtin_suites()
    return list(_SUITES.values())


def get_suite(name: str) -> Suite:
    _register_builtin_suites()
    if name not in _SUITES:
        import difflib

        close = difflib.get_close_matches(name, list_suites(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        if name in _OWNED_BY_KPCA:
            hint = "rpc_attention.kpca.register_suites() registers it; "
        raise ValueError(f"unknown suite {name!r}; {hint}available: {', '.join(list_suites())}")
    return _SUITES[name]


# ---------------------------------------------------------------------------------------------
# option parsing


def _parse_number(text: str) -> float:
    """``"0.01"``, ``"1/255"``, ``"2.5/255"``, ``"2e-3"`` -> float (the package's one number parser)."""
    if not str(text).strip():
        raise ValueError("empty number")
    try:
        return parse_number(str(text))
    except ValueError:
        raise ValueError(f"{str(text).strip()!r} is not a number (use e.g. 0.01, 1/255 or 2.5/255)") from None


def parse_eps_list(value: Any) -> List[float]:
    """Parse an eps sweep: ``"1/255,2/255"``, ``"0.01"``, ``"1:6/255"`` (= 1/255..6/255) or a list."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [float(value)]
    elif isinstance(value, (list, tuple)):
        items = [float(_parse_number(str(v))) for v in value]
    elif isinstance(value, str):
        items = []
        for part in value.split(","):
            part = part.strip()
            if ":" in part:  # "a:b/den" -> a/den, ..., b/den
                rng, _, den = part.partition("/")
                lo, _, hi = rng.partition(":")
                try:
                    lo_i, hi_i = int(lo), int(hi)
                    den_f = float(Fraction(den)) if den else 1.0
                except (ValueError, ZeroDivisionError):
                    raise ValueError(f"cannot parse eps range {part!r} (expected e.g. 1:6/255)") from None
                if hi_i < lo_i or den_f <= 0:
                    raise ValueError(f"empty eps range {part!r}")
                items.extend(i / den_f for i in range(lo_i, hi_i + 1))
            else:
                items.append(_parse_number(part))
    else:
        raise ValueError(f"cannot parse eps list {value!r}")
    if not items:
        raise ValueError("empty eps list")
    for e in items:
        if not (e >= 0 and e < float("inf")):
            raise ValueError(f"eps must be finite and >= 0, got {e}")
    return items


def parse_sets(items: Optional[Iterable[str]]) -> Dict[str, Any]:
    """``["pgd.eps=1:6/255", "batch_size=64"]`` -> ``{"pgd.eps": "1:6/255", "batch_size": 64}`` (the
    package's one ``KEY=VALUE`` grammar, :func:`rpc_attention.overrides.parse_assignments`)."""
    return dict(parse_assignments(items, "--set"))


def option_value(key: str, raw: Any, kind: Any) -> Any:
    """``raw`` (a ``--set`` value: text, or a value YAML already read) as the option type ``kind``.

    Text is read as YAML first (the one settings grammar); ``List[float]`` takes eps lists
    (``1:6/255``, ``0.01,2/255``), ``List[str]`` comma lists, ``Optional[...]`` also ``none`` (and
    ``all``, for ``limit``); the rest is checked by :func:`rpc_attention.overrides.typed_value`.
    """
    value = read_value(raw) if isinstance(raw, str) else raw
    if get_origin(kind) is not None and type(None) in get_args(kind):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "all", "")):
            return None
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is list and get_args(kind) == (float,):
        return parse_eps_list(value)
    if get_origin(kind) is list and get_args(kind) == (str,):
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return typed_value(key, value, kind)


def resolve_options(suite: Suite, sets: Mapping[str, Any], limit: Optional[int] = None) -> Dict[str, Any]:
    """The suite's options (:attr:`Suite.options`) with the ``--set`` values that concern ``suite``.

    ``sets`` keys are ``option`` (applies to every selected suite that declares it, and to the common
    options) or ``suite.option`` (this suite only).  Returns the resolved options as a dict, in the
    order of the dataclass's fields.
    """
    kinds = get_type_hints(suite.options)
    values: Dict[str, Any] = {}
    for key, raw in sets.items():
        target, dot, option = key.partition(".")
        if not dot:
            option = key
            if option not in kinds:
                continue  # a global key another suite declares; validated by check_set_keys
        elif target != suite.name:
            continue
        elif option not in kinds:
            raise unknown_key(key, [f"{suite.name}.{o}" for o in kinds], f"option of suite {suite.name!r}")
        try:
            values[option] = option_value(option, raw, kinds[option])
        except ValueError as exc:
            raise ValueError(f"--set {key}={raw}: {str(exc).split(': ', 1)[-1]}") from None
    if limit is not None:
        values["limit"] = int(limit)
    opts = suite.options(**values)
    return {f.name: getattr(opts, f.name) for f in fields(opts)}


def check_set_keys(suites: Iterable[Suite], sets: Mapping[str, Any]) -> None:
    """Reject ``--set`` keys that no selected suite (nor the common options) understands."""
    suites = list(suites)
    names = {s.name: s for s in suites}
    for key in sets:
        target, dot, option = key.partition(".")
        if dot:
            if target not in names:
                # keys for suites that are not selected are an error too: almost surely a typo
                raise ValueError(f"--set {key}: suite {target!r} is not selected (selected: {', '.join(names)})")
            suite = names[target]
            if option not in suite.defaults and option not in COMMON_DEFAULTS:
                known = [f"{target}.{o}" for o in list(COMMON_DEFAULTS) + list(suite.defaults)]
                raise unknown_key(key, known, f"option of suite {target!r}")
            continue
        if key in COMMON_DEFAULTS:
            continue
        if not any(key in s.defaults for s in suites):
            known = set(COMMON_DEFAULTS).union(*(s.defaults for s in suites))
            raise unknown_key(key, known, "option (no selected suite has it)")


# ---------------------------------------------------------------------------------------------
# running and writing


def _describe_model(model, cfg: Mapping[str, Any], run_dir: Optional[str]) -> Dict[str, Any]:
    info: Dict[str, Any] = {"class": type(model).__name__}
    try:
        info["params"] = int(sum(p.numel() for p in model.parameters()))
    except Exception:  # pragma: no cover - exotic modules
        pass
    mcfg = cfg.get("model") if isinstance(cfg, Mapping) else None
    if isinstance(mcfg, Mapping):
        info["name"] = mcfg.get("name")
        info["config"] = dict(mcfg)
    if run_dir is not None:
        info["run_dir"] = os.path.abspath(str(run_dir))
    return info


def _environment() -> Dict[str, Any]:
    import platform

    import torch

    from .. import __version__

    env: Dict[str, Any] = {"rpc_attention": __version__, "torch": torch.__version__,
                           "python": platform.python_version(), "threads": torch.get_num_threads()}
    try:
        env["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        pass
    return env


def run_suite(suite: Suite, model, cfg: Mapping[str, Any], run_dir: Optional[str], opts: Dict[str, Any],
              source: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Run one suite (seeded) and return the full result record."""
    import torch

    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(opts.get("seed") or 0))
        out = suite.fn(model, cfg, run_dir, dict(opts))
    wall = time.perf_counter() - t0
    if not isinstance(out, Mapping) or "metrics" not in out:
        raise TypeError(f"suite {suite.name!r} must return a dict with 'metrics'")
    record: Dict[str, Any] = {
        "suite": suite.name,
        "description": suite.description,
        "model": _describe_model(model, cfg, run_dir),
        "source": dict(source or {}),
        "data": dict(out.get("data") or {}),
        "protocol": out.get("protocol", suite.description),
        "settings": {**{k: v for k, v in opts.items()}, **dict(out.get("settings") or {})},
        "seed": opts.get("seed"),
        "n_examples": out.get("n_examples", (out.get("data") or {}).get("n_examples")),
        "metrics": dict(out["metrics"]),
        "rows": list(out.get("rows") or []),
        "wall_time_s": round(wall, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": _environment(),
    }
    for key, value in out.items():  # suite-specific extras (e.g. raw per-setting errors)
        if key not in record and key not in ("rows", "metrics"):
            record[key] = value
    return record


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 100 or v == 0:
            return f"{v:.2f}"
        if abs(v) < 0.01:
            return f"{v:.2e}" if abs(v) < 1e-3 else f"{v:.4f}"
        return f"{v:.4g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


def render_markdown(record: Mapping[str, Any]) -> str:
    """A short markdown report: header, settings line and the rows (or metrics) as a table."""
    model = record.get("model", {})
    lines = [f"### {record['suite']}: {model.get('name') or model.get('class', '')}", ""]
    if record.get("protocol"):
        lines.append(str(record["protocol"]))
        lines.append("")
    settings = record.get("settings", {})
    shown = ", ".join(f"{k}={_fmt(v) if not isinstance(v, list) else ','.join(_fmt(x) for x in v)}"
                      for k, v in settings.items() if v is not None)
    data = record.get("data", {})
    lines.append(f"- data: {', '.join(f'{k}={v}' for k, v in data.items())}")
    lines.append(f"- settings: {shown}")
    lines.append(f"- examples: {record.get('n_examples')}, seed: {record.get('seed')}, "
                 f"wall time: {record.get('wall_time_s')} s")
    lines.append("")
    rows = record.get("rows") or [{"metric": k, "value": v} for k, v in record.get("metrics", {}).items()]
    if rows:
        cols: List[str] = []
        for r in rows:
            for k in r:
                if k not in cols:
                    cols.append(k)
        lines += markdown_table(cols, [[_fmt(r.get(c, "")) for c in cols] for r in rows])
    if record.get("rows"):
        lines.append("")
        lines.append("Summary: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in record["metrics"].items()))
    return "\n".join(lines) + "\n"


def write_result(record: Mapping[str, Any], out_dir: str) -> Tuple[str, str]:
    """Write ``<out_dir>/<suite>.json`` and ``.md`` atomically; returns both paths."""
    name = record["suite"]
    jpath = os.path.join(out_dir, f"{name}.json")
    mpath = os.path.join(out_dir, f"{name}.md")
    atomic_write_json(jpath, record, sort_keys=False, default=str)
    atomic_write_text(mpath, render_markdown(record))
    return jpath, mpath
