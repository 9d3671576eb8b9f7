"""Study reports: ``results.json`` (every number), ``report.md`` and ``report.html`` (same content,
figures inlined), figures under ``figures/``; verdicts per claim by the one rule in
:mod:`rpc_attention.report.verdict`.

>>> from rpc_attention.report import build_report     # called by the study's "report" stage
"""

from __future__ import annotations

from ..extras import require

require('rpc_attention.report', 'report')  # one line naming the missing extra, before any import that needs it

from pathlib import Path
from typing import Dict

from .verdict import (
    CONTRADICTED,
    EQUIVALENT,
    INCONCLUSIVE,
    NOT_MEASURED,
    REPRODUCED,
    RULES_TEXT,
    UNRESOLVED,
    claim_verdict,
)

__all__ = ["build_report", "claim_verdict", "RULES_TEXT", "REPRODUCED", "CONTRADICTED", "EQUIVALENT", "INCONCLUSIVE",
           "UNRESOLVED", "NOT_MEASURED"]


def build_report(out_dir, study, pipeline) -> Dict[str, Path]:
    """Collect, draw, render and write the report of the study in ``out_dir`` (atomically)."""
    from ..files import atomic_write_json, atomic_write_text
    from .collect import collect_results
    from .figures import make_figures
    from .recompute import examples_path, write_examples
    from .render import render_html, render_markdown

    out_dir = Path(out_dir)
    res = collect_results(out_dir, study, pipeline)
    per_example = res.pop("_per_example", None) or {}
    res["figures"] = make_figures(res, out_dir)
    md = render_markdown(res)
    paths = {"results": out_dir / "results.json", "markdown": out_dir / "report.md", "html": out_dir / "report.html",
             "examples": examples_path(out_dir / "results.json")}
    write_examples(paths["examples"], per_example)
    atomic_write_json(paths["results"], res)
    atomic_write_text(paths["markdown"], md)
    atomic_write_text(paths["html"], render_html(md, out_dir, title=f"rpc-attention: {study.name} study"))
    return paths
