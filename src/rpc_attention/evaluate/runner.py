"""Run evaluation suites on one model and write ``<out>/<suite>.json/.md``: what ``rpc-attention eval``
does, as a function a study stage calls too.

Where the model comes from is an argument: a *loader* ``load(device) -> (model, cfg, run_dir, source)``
(``rpc_attention.train.run_loader`` for a training run; ``rpc-attention eval-external`` passes its own
for timm / Hugging Face models or test-time RPC). ``run_dir`` may be ``None`` and ``source`` is the
JSON-able description recorded in every result.

A result already in the output folder is replaced only when it was computed with the same options on
the same model (rerunning gives the same numbers); one with other options or from another model is
kept and the call refused, unless ``replace=True`` (``--force``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import suites as S

__all__ = ["ModelLoader", "select_suites", "evaluate_model"]

ModelLoader = Callable[[str], Tuple[Any, Mapping[str, Any], Optional[str], Dict[str, Any]]]


def select_suites(names: Sequence[str], sets: Mapping[str, Any],
                  limit: Optional[int] = None) -> Tuple[List[S.Suite], Dict[str, Dict[str, Any]]]:
    """The suites called ``names`` (duplicates dropped) and their resolved options; raises ValueError
    for an unknown suite, an empty selection, a ``--set`` key no selected suite has or a bad value."""
    if not names:
        raise ValueError("no suite selected")
    if limit is not None and limit <= 0:
        raise ValueError(f"--limit must be positive, got {limit}")
    suites = [S.get_suite(n) for n in dict.fromkeys(names)]
    S.check_set_keys(suites, sets)
    return suites, {s.name: S.resolve_options(s, sets, limit) for s in suites}


_NOT_COMPARED = ("device",)  # options that do not change what a result means


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))  # as the result file stores it


def _check_replaceable(name: str, opts: Mapping[str, Any], source: Mapping[str, Any], out_dir: str) -> None:
    """ValueError if ``out_dir/<name>.json`` holds a result with other options or from another model."""
    path = os.path.join(out_dir, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return
    before = old.get("options", old.get("settings")) or {}
    now = _plain(dict(opts))
    changed = [k for k in sorted(now) if k not in _NOT_COMPARED and before.get(k) != now[k]]
    diff = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in changed[:4])
    other = {k: v for k, v in (old.get("source") or {}).items() if k != "run_dir"}
    if other != {k: v for k, v in _plain(dict(source)).items() if k != "run_dir"}:
        diff = "another model" + (f"; {diff}" if diff else "")
    if diff:
        raise ValueError(f"{path} holds a {name} result with other settings ({diff}); give --out DIR for this one, "
                         f"or --force to replace it")


def _with_suite_name(suite: S.Suite, exc: Exception) -> Exception:
    return type(exc)(f"{suite.name}: {exc}")


def evaluate_model(names: Sequence[str], load: ModelLoader, sets: Optional[Mapping[str, str]] = None,
                   limit: Optional[int] = None, out_dir: Optional[str] = None,
                   log: Callable[[str], None] = lambda msg: None,
                   on_result: Callable[[Dict[str, Any], str], None] = lambda record, path: None,
                   replace: bool = False,
                   before_run: Callable[[List[S.Suite], Dict[str, Dict[str, Any]], Any, Mapping[str, Any]], None]
                   = lambda suites, opts, model, cfg: None) -> List[str]:
    """Run the suites ``names`` on the model ``load`` gives and write each result once it succeeded.

    ``sets`` are the suite options (``{"pgd.eps": "1:6/255", "device": "cuda"}``), ``limit`` the number
    of examples, ``out_dir`` the output folder (default ``<run_dir>/eval``). Every check (options, task,
    the suites' own ``check`` of data and settings) runs before the first suite starts. ``log`` gets
    progress lines, ``on_result(record, json_path)`` each finished result, ``before_run(suites, opts, model,
    cfg)`` is called once every check passed (the CLI prints its cost estimates there). A result in
    ``out_dir`` with other options or from another model is an error unless ``replace``. Returns the JSON paths.
    Raises ValueError / FileNotFoundError (prefixed with the suite's name where one suite is at fault).
    """
    suites, opts = select_suites(names, dict(sets or {}), limit)
    device = next(iter(opts.values()))["device"]
    model, cfg, run_dir, source = load(device)
    task = str(cfg.get("task") or "classification")
    for s in suites:
        if task not in s.tasks:
            raise ValueError(f"suite {s.name!r} does not apply to task {task!r} (it handles: {', '.join(s.tasks)})")
        if s.check is not None:
            try:
                s.check(cfg, opts[s.name])
            except (ValueError, FileNotFoundError) as exc:
                raise _with_suite_name(s, exc) from exc
    if out_dir is None:
        if run_dir is None:
            raise ValueError("no output directory: give out_dir (--out DIR)")
        out_dir = os.path.join(run_dir, "eval")
    if not replace:
        for s in suites:
            _check_replaceable(s.name, opts[s.name], source, out_dir)
    before_run(suites, opts, model, cfg)
    paths = []
    for s in suites:
        log(f"[eval] {s.name} ...")
        try:
            record = S.run_suite(s, model, cfg, run_dir, opts[s.name], source=source)
        except (ValueError, FileNotFoundError) as exc:
            raise _with_suite_name(s, exc) from exc
        record.setdefault("options", _plain(opts[s.name]))  # what the next call compares with
        jpath, _ = S.write_result(record, out_dir)  # written only once the suite has succeeded
        on_result(record, jpath)
        log(f"[eval] {s.name}: {record['wall_time_s']:.1f} s -> {jpath}")
        paths.append(jpath)
    return paths
