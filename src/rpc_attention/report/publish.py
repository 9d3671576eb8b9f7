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

from ..files import atomic_write_bytes, atomic_write_json, atomic_write_text
from .recompute import examples_path

RESULTS_DIR = Path("docs") / "results"
DOC_FILES = ("README.md", "docs/*.md")
_BLOCK = re.compile(r"<!-- results (?P<name>[\w.-]+) (?P<view>[\w:.,-]+) -->\n(?P<body>.*?)<!-- /results -->",
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


Loader = Callable[[str], Dict[str, Any]]


@dataclass(frozen=True)
class Context:
    """What a view may need beyond its results: the name they are published under, and the other
    published results by name (``drift:NAME`` reads them)."""

    name: str = "these"
    load: Optional[Loader] = None


def _view_table(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .render import task_table

    tname, _, suites = arg.partition(":")
    table = (res.get("tables") or {}).get(tname)
    if table is None:
        raise PublishError(f"view table:{arg}: the results have no {tname!r} table "
                           f"(they have: {', '.join(res.get('tables') or {}) or 'none'})")
    if not suites:
        return task_table(res, tname)
    # table:vision:ood,sparse: only the columns of those suites (and the paper's numbers for them)
    wanted = suites.split(",")
    have = [c["key"].partition(":")[0] for c in table["columns"]]
    missing = [s for s in wanted if s not in have]
    if missing:
        raise PublishError(f"view table:{arg}: the {tname!r} table has no column of suite(s) {', '.join(missing)} "
                           f"(its suites: {', '.join(dict.fromkeys(have))})")
    keys = [c["key"] for c in table["columns"] if c["key"].partition(":")[0] in wanted]
    paper = {side: {k: v for k, v in (table.get("paper") or {}).get(side, {}).items() if k in keys}
             for side in ("baseline", "rpc")}
    sub = dict(table, columns=[c for c in table["columns"] if c["key"] in keys], paper=paper)
    return task_table(dict(res, tables={tname: sub}), tname)


def _view_verdicts(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .families import family_tables

    claims = res.get("claims") or []
    if arg:  # verdicts:primary: that family only
        families = sorted({c.get("family", "secondary") for c in claims})
        if arg not in families:
            raise PublishError(f"view verdicts:{arg}: the results have no {arg!r} claims "
                               f"(their families: {', '.join(families) or 'none'})")
        claims = [c for c in claims if c.get("family", "secondary") == arg]
    return family_tables(claims)


def _view_power(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .families import power_section

    lines = power_section(res)[2:]  # without its heading: the document has its own
    if not lines:
        raise PublishError("view power: the results have no primary claim with numbers")
    return lines


def _view_run(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .render import run_summary

    return [run_summary(res), ""]


def _view_cost(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .render import stage_cost_table

    lines = stage_cost_table(res)
    if not lines:
        raise PublishError("view cost: the results have no finished stages")
    return lines


def _suite_of(res: Dict[str, Any], suite: str, view: str) -> None:
    if not ((res.get("evals") or {}).get(suite)):
        raise PublishError(f"view {view}: the results have no {suite!r} evaluations "
                           f"(they have: {', '.join(res.get('evals') or {}) or 'none'})")


def _view_eps(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .render import eps_table

    _suite_of(res, arg, f"eps:{arg}")
    return eps_table(res, arg)


def _view_corruptions(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .render import corruption_table

    _suite_of(res, "corruptions", "corruptions")
    return corruption_table(res, protocol=False)  # the protocol names the baseline run's folder on that machine


def _view_sparse(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .sparsity import render_sparse_corruption

    _suite_of(res, "sparse", "sparse")
    return render_sparse_corruption(res)


def _view_sparsity(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .sparsity import render_sparsity

    models = (res.get("sparsity") or {}).get("models") or {}
    if arg:  # sparsity:rpc_pcp,rpc6: those models only
        missing = [k for k in arg.split(",") if k not in models]
        if missing:
            raise PublishError(f"view sparsity:{arg}: no S-activity record of {', '.join(missing)} "
                               f"(models: {', '.join(models) or 'none'})")
        models = {k: v for k, v in models.items() if k in arg.split(",")}
    return render_sparsity(dict(res, sparsity=dict(res.get("sparsity") or {}, models=models)))[2:]


def _view_drift(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .drift import drift_lines

    name, _, mode = arg.partition(":")  # drift:NAME, or drift:NAME:summary for the one line of largest changes
    if not name or ctx.load is None:
        raise PublishError("view drift needs the other results' name: drift:NAME (docs/results/NAME.json)")
    if mode not in ("", "summary"):
        raise PublishError(f"view drift:{arg}: after the name only ':summary' is accepted")
    other = ctx.load(name)
    if other.get("study") != res.get("study"):
        raise PublishError(f"view drift:{arg}: {name} is the {other.get('study')!r} study, these results the "
                           f"{res.get('study')!r} study; drift compares two runs of one study")
    return drift_lines(res, other, ctx.name, name, summary=mode == "summary")


def _view_frontier(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .frontier import SUITE, frontier_table

    suite = arg or SUITE
    _suite_of(res, suite, f"frontier{':' + arg if arg else ''}")
    return frontier_table(res, suite)


def _view_variants(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .frontier import SUITE, variant_table

    if arg and not arg.isdigit():
        raise PublishError(f"view variants:{arg}: the argument is the number of patches (variants:1, variants:2)")
    _suite_of(res, SUITE, f"variants{':' + arg if arg else ''}")
    return variant_table(res, SUITE, patches=int(arg or 1))


def _view_scorecard(res: Dict[str, Any], arg: str, ctx: Context) -> List[str]:
    from .scorecard import has_scorecard, scorecard_lines

    if not has_scorecard(res):
        raise PublishError("view scorecard: the results test none of the paper's claims")
    if arg not in ("", "table", "count"):
        raise PublishError(f"view scorecard:{arg}: only 'scorecard', 'scorecard:table' (without the count and lead) "
                           f"or 'scorecard:count' (the count line alone)")
    elsewhere = None if res.get("plan") else "the confirmatory run (docs/results/paper.json)"
    lines = scorecard_lines(res, elsewhere)
    return lines[4:] if arg == "table" else lines[:1] if arg == "count" else lines


VIEWS: Dict[str, Callable[..., List[str]]] = {
    "scorecard": _view_scorecard,  # one row per claim of the paper, the count line and the lead (scorecard:table;
                                   # scorecard:count: the count line alone)
    "table": _view_table,        # table:vision, table:lm: a task table (mean +- std over seeds, paper rows);
                                 # table:vision:ood,sparse: the columns of those suites only
    "verdicts": _view_verdicts,  # the claims' verdict tables, one per family, each under its rule (verdicts:own: one)
    "power": _view_power,        # the primary claims' minimum detectable effects against their targets
    "run": _view_run,            # one line: stages, wall and CPU time, machine, date
    "cost": _view_cost,          # the stages' estimated against measured time, per training / eval suite
    "eps": _view_eps,            # eps:fgsm, eps:pgd: top-1 at each eps per model
    "corruptions": _view_corruptions,  # top-1 error per corruption per model
    "sparse": _view_sparse,      # the sparse-corruption settings per model, and S's precision / recall on the keys
    "sparsity": _view_sparsity,  # PAP's S activity per block (sparsity:rpc_pcp: that model only)
    "drift": _view_drift,        # drift:NAME: these results against docs/results/NAME.json of the same study;
                                 # drift:NAME:summary: only the line of the largest changes
    "frontier": _view_frontier,  # clean vs patch top-1 per model, differences from the baseline (frontier:SUITE)
    "variants": _view_variants,  # variants:K: top-1 under each patch-attack variant alone and the worst case
}


def load_published(root: Path, name: str) -> Dict[str, Any]:
    path = Path(root) / RESULTS_DIR / f"{name}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PublishError(f"no published results {path} (rpc-attention publish STUDY_DIR --as {name})") from None
    except json.JSONDecodeError as exc:
        raise PublishError(f"{path} is not valid JSON ({exc})") from None


def render_view(res: Dict[str, Any], view: str, ctx: Context = Context()) -> str:
    """The Markdown text of ``view`` (``kind`` or ``kind:argument``) for the results ``res``; ``ctx`` names
    them and serves the views that read other published results (``drift:NAME``)."""
    kind, _, arg = view.partition(":")
    if kind not in VIEWS:
        raise PublishError(f"unknown results view {view!r}; views are {', '.join(VIEWS)}")
    return "\n".join(VIEWS[kind](res, arg, ctx)).rstrip() + "\n"


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


def _loader(root: Path, cache: Dict[str, Dict[str, Any]]) -> Loader:
    """Published results by name, each read once."""
    def load(name: str) -> Dict[str, Any]:
        if name not in cache:
            cache[name] = load_published(root, name)
        return cache[name]

    return load


def _rendered(root: Path, text: str, cache: Dict[str, Dict[str, Any]]) -> str:
    load = _loader(root, cache)

    def sub(m: re.Match) -> str:
        name = m["name"]
        return f"<!-- results {name} {m['view']} -->\n{render_view(load(name), m['view'], Context(name, load))}<!-- /results -->"

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
    load = _loader(root, {})
    out = []
    for b in find_blocks(root):
        if render_view(load(b.name), b.view, Context(b.name, load)) != b.body:
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
    res = strip_machine_paths(res)
    dest = Path(root) / RESULTS_DIR / f"{name}.json"
    old: Optional[Dict[str, Any]] = None
    if dest.exists():
        old = json.loads(dest.read_text(encoding="utf-8"))
    if old is not None and old != res and not force:
        raise PublishError(f"{dest} holds other results (study {old.get('study')!r}, generated "
                           f"{old.get('generated')}); --force replaces them")
    atomic_write_json(dest, res)
    examples = examples_path(src)
    if examples.exists():  # the records behind the example intervals (rpc-attention verify recomputes from them)
        atomic_write_bytes(examples_path(dest), examples.read_bytes())
    render_blocks(root)
    return dest


def strip_machine_paths(res: Dict[str, Any]) -> Dict[str, Any]:
    """Published results with the paths under their study directory (``res["out_dir"]``) relative to
    it (:func:`~rpc_attention.report.collect.relative_to_study`); results without one are returned as
    they are."""
    from .collect import relative_to_study

    out_dir = res.get("out_dir")
    if not out_dir or out_dir == ".":
        return res
    return relative_to_study(res, out_dir)


def relative_published_results(root: Path) -> List[Path]:
    """Rewrite every ``docs/results/*.json`` under ``root`` with :func:`strip_machine_paths` and
    re-render the blocks; returns the files that changed. Idempotent: results published (or merged)
    with machine paths are cleaned by running it again (``rpc-attention publish --relative-paths``)."""
    changed = []
    for path in sorted((Path(root) / RESULTS_DIR).glob("*.json")):
        res = json.loads(path.read_text(encoding="utf-8"))
        clean = strip_machine_paths(res)
        if clean != res:
            atomic_write_json(path, clean)
            changed.append(path)
    render_blocks(root)
    return changed
