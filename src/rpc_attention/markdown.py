"""Markdown tables: the one helper behind every table the package writes (reports, benchmarks, CLI),
and :func:`format_seconds`, the one way the package writes a duration.

A dozen lines cover what the tables need (escaped cells, optional column alignment), so this is ours
rather than a ``tabulate`` dependency.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

__all__ = ["markdown_cell", "markdown_table", "format_seconds"]

# The one spelling of a verdict or cell with no number behind it (a stage skipped or failed).
NOT_MEASURED = "not measured"

_ALIGN_RULES = {"l": "---", "r": "---:", "c": ":---:"}


def markdown_cell(value: Any) -> str:
    """``value`` as one table cell: ``None`` -> empty, ``|`` escaped, line breaks -> spaces."""
    if value is None:
        return ""
    return str(value).replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: Optional[str] = None) -> List[str]:
    """A GitHub-flavoured Markdown table as a list of lines (no blank line after it).

    ``align``: one letter per column, ``l`` (default), ``r`` or ``c``. Every row must have as many
    cells as the header.
    """
    width = len(header)
    if width == 0:
        raise ValueError("a Markdown table needs at least one column")
    align = align or "l" * width
    if len(align) != width or set(align) - set(_ALIGN_RULES):
        raise ValueError(f"align={align!r}: give one of l/r/c for each of the {width} columns")
    lines = ["| " + " | ".join(markdown_cell(h) for h in header) + " |",
             "|" + "|".join(_ALIGN_RULES[a] for a in align) + "|"]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"table row {i} has {len(row)} cells, the header {width}: {list(row)!r}")
        lines.append("| " + " | ".join(markdown_cell(c) for c in row) + " |")
    return lines


def format_seconds(s: Optional[float]) -> str:
    """``42s``, ``3m05s``, ``2h07m``; ``-`` for None (stage timings, estimates, training progress)."""
    if s is None:
        return "-"
    s = float(s)
    if s < 59.5:
        return f"{s:.0f}s"
    whole = int(round(s))  # rounded once, so 3599.6 s reads 1h00m, not 59m60s
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = int(round(s / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"
