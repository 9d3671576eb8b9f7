"""The files of ``rpc-attention robustness``: a Markdown table, the JSON result and a PNG of the
dose-response lines (one panel per key source and density), written atomically into one folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from ..files import atomic_savefig, atomic_write_json, atomic_write_text
from ..markdown import markdown_table

__all__ = ["OUTPUT_FILES", "robustness_markdown", "write_robustness"]

OUTPUT_FILES = ("robustness.md", "robustness.json", "robustness.png")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _source_table(source: Dict[str, Any]) -> List[str]:
    methods = list(source["clean_deviation"])
    head = ["pattern", "density", "std", *methods]
    rows = []
    for cell in source["cells"]:
        row = [cell.get("pattern", "entries"), f"{100 * cell['density']:g} %", f"{cell['magnitude']:g}"]
        for name in methods:
            m = cell["methods"][name]
            others = f" [{m['r_others']:.3f}]" if "r_others" in m else ""
            extra = f" (P {m['precision']:.2f} / R {m['recall']:.2f})" if "precision" in m else ""
            row.append(_fmt(m["r"]) + others + extra)
        rows.append(row)
    rows.append(["clean", "", "deviation from symmetric", *[_fmt(source["clean_deviation"][n]) for n in methods]])
    return markdown_table(head, rows, align="lll" + "r" * len(methods))


def robustness_markdown(result: Dict[str, Any]) -> str:
    """Every source's table: r per method and cell (for token corruption also r over the uncorrupted
    tokens, in brackets), S precision / recall for PAP variants, and the clean-key deviation from
    symmetric attention in the last row."""
    lines = ["# Layer-level robustness to sparse key corruption", "",
             "r = ||A(k + s) - A(k)|| / ||A(k)|| (float64, fixed values; lower is more robust); [x]: r over the "
             "tokens that were not corrupted (token corruption). P / R: precision and recall of supp(S) against "
             "the corrupted entries. Patterns: entries (scattered), tokens (whole key rows, every head), features "
             "(whole key columns). "
             f"Controls: symmetric attention, clip (median +- {result['clip']:g} x 1.4826 MAD), drop (tokens whose "
             f"key row is {result.get('drop', 6.0):g} robust deviations out masked as keys), oracle (the corrupted "
             "entries replaced by the per-feature median of the others). "
             f"Seed {result['seed']}.", ""]
    for spec in result["variants"]:
        lines.append(f"- `{spec['name']}`: {spec['describe']}")
    for source in result["sources"]:
        lines += ["", f"## {source['label']}", "", *_source_table(source)]
    return "\n".join(lines) + "\n"


def _figure(result: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = result.get("patterns", ["entries"])
    panel_rows = [(s, p) for s in result["sources"] for p in patterns]
    densities = sorted(result["densities"])
    fig, axes = plt.subplots(len(panel_rows), len(densities), figsize=(4.2 * len(densities), 3.4 * len(panel_rows)),
                             squeeze=False)
    for i, (source, pattern) in enumerate(panel_rows):
        for ax, dens in zip(axes[i], densities):
            cells = [c for c in source["cells"] if c["density"] == dens and c.get("pattern", "entries") == pattern]
            mags = [c["magnitude"] for c in cells]
            for name in source["clean_deviation"]:
                style = "--" if name in ("symmetric", "clip", "drop", "oracle") else "-"
                ax.plot(mags, [c["methods"][name]["r"] for c in cells], style, marker="o", label=name)
            ax.set_xscale("log")
            ax.set_xlabel("corruption (key std)")
            ax.set_title(f"{source['label'][:40]}, {pattern} {100 * dens:g} %", fontsize=8)
        axes[i][0].set_ylabel("relative output change r")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=80)
    plt.close(fig)


def write_robustness(result: Dict[str, Any], out_dir, force: bool = False) -> List[Path]:
    """Write the three files into ``out_dir``; FileExistsError when one exists and not ``force``."""
    out = Path(out_dir)
    existing = [name for name in OUTPUT_FILES if (out / name).exists()]
    if existing and not force:
        raise FileExistsError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "robustness.json", result)
    atomic_write_text(out / "robustness.md", robustness_markdown(result))
    _figure(result, out / "robustness.png")
    return [out / name for name in OUTPUT_FILES]
