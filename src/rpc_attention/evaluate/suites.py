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
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..files import atomic_write_json, atomic_write_text  # atomic_write_text: re-exported
from ..markdown import markdown_table
from ..overrides import parse_assignments, parse_number, unknown_key

__all__ = [
    "Suite", "register_suite", "get_suite", "list_suites", "COMMON_DEFAULTS", "parse_eps_list",
    "parse_sets", "parse_value", "resolve_options", "run_suite", "write_result", "render_markdown", "atomic_write_text",
]

# Options every suite receives (``--set batch_size=64`` or ``--limit N``).
COMMON_DEFAULTS: Dict[str, Any] = {"limit": None, "batch_size": 128, "seed": 0, "device": "cpu"}


@dataclass
class Suite:
    name: str
    fn: Callable[..., Dict[str, Any]]
    tasks: Tuple[str, ...] = ("classification",)
    defaults: Optional[Dict[str, Any]] = None  # None: accept any option (no validation)
    description: str = ""
    check: Optional[Callable[[Mapping[str, Any], Dict[str, Any]], None]] = None  # early validation
    module: str = field(default="")


_SUITES: Dict[str, Suite] = {}
_BUILTINS_REGISTERED = False


def register_suite(
    name: str,
    fn: Callable[..., Dict[str, Any]],
    tasks: Sequence[str] = ("classification",),
    defaults: Optional[Mapping[str, Any]] = None,
    description: str = "",
    check: Optional[Callable[[Mapping[str, Any], Dict[str, Any]], None]] = None,
) -> Suite:
    """Register suite ``name`` (re-registering the same name replaces it).

    ``defaults`` declares the suite's options and their types (list of floats for eps sweeps, int,
    float, bool, str, None for free-form); ``--set name.key=value`` then parses ``value`` like the
    default and unknown keys are rejected.  ``check(cfg, opts)`` runs before any suite starts and
    raises ``ValueError``/``FileNotFoundError`` for bad input (missing data, ...).
    """
    if not name or any(c in name for c in " ,=/"):
        raise ValueError(f"invalid suite name {name!r}")
    suite = Suite(name, fn, tuple(tasks), dict(defaults) if defaults is not None else None, description,
                  check, getattr(fn, "__module__", ""))
    _SUITES[name] = suite
    return suite


def _register_builtin_suites() -> None:
    """Import the built-in suite modules (each registers its suites on import); idempotent."""
    global _BUILTINS_REGISTERED
    if _BUILTINS_REGISTERED:
        return
    _BUILTINS_REGISTERED = True
    from . import classification, corruptions, lm, ood, segmentation, sparse  # noqa: F401


def list_suites(task: Optional[str] = None) -> List[str]:
    _register_builtin_suites()
    return sorted(n for n, s in _SUITES.items() if task is None or task in s.tasks)


def get_suite(name: str) -> Suite:
    _register_builtin_suites()
    if name not in _SUITES:
        import difflib

        close = difflib.get_close_matches(name, list_suites(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
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


def _typed_like(key: str, raw: Any, default: Any) -> Any:
    """A YAML-parsed (non-string) ``raw`` checked against the type of ``default``."""
    if raw is None or default is None:
        return raw
    if isinstance(default, bool) and not isinstance(raw, bool):
        raise ValueError(f"{key}={raw}: expected true or false")
    if isinstance(default, int) and not isinstance(default, bool) and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise ValueError(f"{key}={raw}: expected an integer")
    if isinstance(default, float) and not isinstance(raw, bool) and isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(default, list) and not isinstance(raw, list):
        return parse_eps_list(raw) if not (default and isinstance(default[0], str)) else [raw]
    return raw


def parse_value(key: str, raw: Any, default: Any) -> Any:
    """Parse ``raw`` (a ``--set`` value: a string, or a number/bool/list YAML already read) to the type of ``default``."""
    if not isinstance(raw, str):
        if key == "eps" or key.endswith("_eps"):
            return raw if raw is None else parse_eps_list(raw)
        return _typed_like(key, raw, default)
    text = raw.strip()
    try:
        if key == "limit":
            return None if text.lower() in ("", "none", "all") else int(text)
        if key == "eps" or key.endswith("_eps") or isinstance(default, list):
            if isinstance(default, list) and default and isinstance(default[0], str):
                return [p.strip() for p in text.split(",") if p.strip()]
            return parse_eps_list(text)
        if isinstance(default, bool):
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true/false, got {text!r}")
        if isinstance(default, int):
            if not text.lstrip("+-").isdigit():
                raise ValueError(f"expected an integer, got {text!r}")
            return int(text)
        if isinstance(default, float):
            return _parse_number(text)
    except ValueError as exc:
        raise ValueError(f"{key}={raw}: {exc}") from None
    if text.lower() in ("none", "null"):
        return None
    return text


def resolve_options(suite: Suite, sets: Mapping[str, Any], limit: Optional[int] = None) -> Dict[str, Any]:
    """Merge common defaults, the suite's defaults and the ``--set`` values that concern ``suite``.

    ``sets`` keys are ``option`` (applies to every selected suite that declares it, and to the common
    options) or ``suite.option`` (this suite only).  Returns the resolved options.
    """
    opts: Dict[str, Any] = dict(COMMON_DEFAULTS)
    declared = dict(suite.defaults or {})
    opts.update(declared)
    for key, raw in sets.items():
        target, dot, option = key.partition(".")
        if dot:
            if target != suite.name:
                continue
        else:
            option = key
            if option not in opts and suite.defaults is not None:
                continue  # a global key another suite declares; validated by check_set_keys
        if suite.defaults is not None and option not in opts:
            raise unknown_key(key, [f"{suite.name}.{o}" for o in opts], f"option of suite {suite.name!r}")
        try:
            opts[option] = parse_value(option, raw, opts.get(option))
        except ValueError as exc:
            raise ValueError(f"--set {key}={raw}: {str(exc).split(': ', 1)[-1]}") from None
    if "eps" in opts and opts["eps"] is not None:
        opts["eps"] = parse_eps_list(opts["eps"])
    if "space" in opts and opts["space"] not in ("pixel", "official"):
        raise ValueError(f"--set space={opts['space']}: choose pixel or official")
    if limit is not None:
        opts["limit"] = int(limit)
    if opts.get("limit") is not None and int(opts["limit"]) <= 0:
        raise ValueError(f"--limit must be positive, got {opts['limit']}")
    if int(opts.get("batch_size") or 0) <= 0:
        raise ValueError(f"batch_size must be positive, got {opts.get('batch_size')}")
    return opts


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
            if suite.defaults is not None and option not in suite.defaults and option not in COMMON_DEFAULTS:
                known = [f"{target}.{o}" for o in list(COMMON_DEFAULTS) + list(suite.defaults)]
                raise unknown_key(key, known, f"option of suite {target!r}")
            continue
        if key in COMMON_DEFAULTS:
            continue
        if not any(s.defaults is None or key in s.defaults for s in suites):
            known = set(COMMON_DEFAULTS).union(*(s.defaults or {} for s in suites))
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
