"""Numbers in the README and docs, generated from committed study results.

A study's ``results.json`` is published as ``docs/results/<name>.json``; a Markdown file marks the places
that show its numbers with a pair of comments::

    <!-- results quick table:vision -->
    (generated; do not edit)
    <!-- /results -->

:func:`render_blocks` rewrites the text between the markers from the published results (the same
renderers the report uses), and :func:`stale_blocks` lists the blocks whose text differs from what the
results give, which a test turns into a failure: a number typed by hand, or results republished
without re-rendering, cannot land.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..files import atomic_write_json, atomic_write_text

RESULTS_DIR = Path("docs") / "results"
DOC_FILES = ("README.md", "docs/*.md")
_BLOCK = re.compile(r"<!-- results (?P<name>[\w.-]+) (?P<view>[\w:.-]+) -->\n(?P<body>.*?)<!-- /results -->",
                    re.DOTALL)


class PublishError(ValueError):
    """Missing or unreadable results, an unknown view, or a publication that would overwrite others."""


@dataclass(frozen=True)
class Block:
    """One marked block: the file, the published results it shows, the view and its current text."""

    path: Path
    name: str
    view: str
    body: str


def _view_table(res: Dict[str, Any], arg: str) -> List[str]:
    from .render import task_table

    if arg not in (res.get("tables") or {}):
        raise PublishError(f"view table:{arg}: the results have no {arg!r} table "
                           f"(they have: {', '.join(res.get('tables') or {}) or 'none'})")
    return task_table(res, arg)


def _view_verdicts(res: Dict[str, Any], arg: str) -> List[str]:
    from .families import family_tables

    claims = res.get("claims") or []
    if arg:  # verdicts:primary: that family only
        families = sorted({c.get("family", "secondary") for c in claims})
        if arg not in families:
            raise PublishError(f"view verdicts:{arg}: the results have no {arg!r} claims "
                               f"(their families: {', '.join(families) or 'none'})")
        claims = [c for c in claims if c.get("family", "secondary") == arg]
    return family_tables(claims)


def _view_power(res: Dict[str, Any], arg: str) -> List[str]:
    from .families import power_section

    return power_section(res)[2:]  # without its heading: the document has its own


def _view_run(res: Dict[str, Any], arg: str) -> List[str]:
    from .render import run_summary

    return [run_summary(res), ""]


def _view_frontier(res: Dict[str, Any], arg: str, ctx: Any = None) -> List[str]:
    from .frontier import SUITE, frontier_table

    suite = arg or SUITE
    lines = frontier_table(res, suite)
    if not lines:
        raise PublishError(f"view frontier{':' + arg if arg else ''}: the results have no {suite!r} evaluations")
    return lines


VIEWS: Dict[str, Callable[[Dict[str, Any], str], List[str]]] = {
    "table": _view_table,        # table:vision, table:lm: a task table (mean +- std over seeds, paper rows)
    "verdicts": _view_verdicts,  # the claims' verdict tables, one per family, each under its rule (verdicts:own: one)
    "power": _view_power,        # the primary claims' minimum detectable effects against their targets
    "run": _view_run,            # one line: stages, wall and CPU time, machine, date
    "frontier": _view_frontier,  # clean vs patch top-1 per model, differences from the baseline (frontier:SUITE)
}


def load_published(root: Path, name: str) -> Dict[str, Any]:
    path = Path(root) / RESULTS_DIR / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PublishError(f"no published results {path} (rpc-attention publish STUDY_DIR --as {name})") from None
    except json.JSONDecodeError as exc:
        raise PublishError(f"{path} is not valid JSON ({exc})") from None


def render_view(res: Dict[str, Any], view: str) -> str:
    """The Markdown text of ``view`` (``kind`` or ``kind:argument``) for the results ``res``."""
    kind, _, arg = view.partition(":")
    if kind not in VIEWS:
        raise PublishError(f"unknown results view {view!r}; views are {', '.join(VIEWS)}")
    return "\n".join(VIEWS[kind](res, arg)).rstrip() + "\n"


def doc_paths(root: Path) -> List[Path]:
    root = Path(root)
    out: List[Path] = []
    for pattern in DOC_FILES:
        out += sorted(root.glob(pattern))
    return out


def find_blocks(root: Path) -> List[Block]:
    """Every marked block of the README and docs under ``root``."""
    return [Block(p, m["name"], m["view"], m["body"]) for p in doc_paths(root)
            for m in _BLOCK.finditer(p.read_text(encoding="utf-8"))]


def _rendered(root: Path, text: str, cache: Dict[str, Dict[str, Any]]) -> str:
    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in cache:
            cache[name] = load_published(root, name)
        return f"<!-- results {name} {m['view']} -->\n{render_view(cache[name], m['view'])}<!-- /results -->"

    return _BLOCK.sub(sub, text)


def render_blocks(root: Path) -> List[Path]:
    """Rewrite every marked block from the published results; the files that changed."""
    cache: Dict[str, Dict[str, Any]] = {}
    changed = []
    for p in doc_paths(root):
        text = p.read_text(encoding="utf-8")
        new = _rendered(root, text, cache)
        if new != text:
            atomic_write_text(p, new)
            changed.append(p)
    return changed


def stale_blocks(root: Path) -> List[str]:
    """``"FILE: NAME VIEW"`` of every block whose text is not what its published results render."""
    cache: Dict[str, Dict[str, Any]] = {}
    out = []
    for b in find_blocks(root):
        if b.name not in cache:
            cache[b.name] = load_published(root, b.name)
        if render_view(cache[b.name], b.view) != b.body:
            out.append(f"{b.path.relative_to(root)}: {b.name} {b.view}")
    return out


def publish_results(study_dir: Path, root: Path, name: str, force: bool = False) -> Path:
    """Copy ``study_dir/results.json`` to ``root/docs/results/<name>.json`` (refusing to replace other
    results without ``force``) and re-render the blocks; the path written."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise PublishError(f"--as {name!r}: use letters, digits, '.', '-' or '_'")
    src = Path(study_dir) / "results.json"
    try:
        res = json.loads(src.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PublishError(f"{src} not found: run the study (rpc-attention reproduce) first") from None
    except json.JSONDecodeError as exc:
        raise PublishError(f"{src} is not valid JSON ({exc})") from None
    dest = Path(root) / RESULTS_DIR / f"{name}.json"
    old: Optional[Dict[str, Any]] = None
    if dest.exists():
        old = json.loads(dest.read_text(encoding="utf-8"))
    if old is not None and old != res and not force:
        raise PublishError(f"{dest} holds other results (study {old.get('study')!r}, generated "
                           f"{old.get('generated')}); --force replaces them")
    atomic_write_json(dest, res)
    render_blocks(root)
    return dest
