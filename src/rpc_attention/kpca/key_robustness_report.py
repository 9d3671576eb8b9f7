"""The files of ``rpc-attention robustness``: a Markdown table, the JSON result and a PNG of the
dose-response lines (one panel per key source and density), written atomically into one folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from ..files import atomic_savefig, atomic_write_json, atomic_write_text
from ..markdown import markdown_table

OUTPUT_FILES = ("robustness.md", "robustness.json", "robustness.png")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _source_table(source: Dict[str, Any]) -> List[str]:
    methods = list(source["clean_deviation"])
    head = ["density", "std", *methods]
    rows = []
    for cell in source["cells"]:
        row = [f"{100 * cell['density']:g} %", f"{cell['magnitude']:g}"]
        for name in methods:
            m = cell["methods"][name]
            extra = f" (P {m['precision']:.2f} / R {m['recall']:.2f})" if "precision" in m else ""
            row.append(_fmt(m["r"]) + extra)
        rows.append(row)
    rows.append(["clean", "deviation from symmetric", *[_fmt(source["clean_deviation"][n]) for n in methods]])
    return markdown_table(head, rows, align="ll" + "r" * len(methods))


def robustness_markdown(result: Dict[str, Any]) -> str:
    """Every source's table: r per method and cell, S precision / recall for PAP variants, and the
    clean-key deviation from symmetric attention in the last row."""
    lines = ["# Layer-level robustness to sparse key corruption", "",
             "r = ||A(k + s) - A(k)|| / ||A(k)|| (float64, fixed values; lower is more robust). "
             "P / R: precision and recall of supp(S) against the corrupted entries. "
             f"Controls: symmetric attention, clip (median +- {result['clip']:g} x 1.4826 MAD), oracle "
             "(the corrupted entries replaced by the per-feature median of the others). "
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

    panels = [(s, d) for s in result["sources"] for d in sorted({c["density"] for c in s["cells"]})]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (source, dens) in zip(axes[0], panels):
        cells = [c for c in source["cells"] if c["density"] == dens]
        mags = [c["magnitude"] for c in cells]
        for name in source["clean_deviation"]:
            style = "--" if name in ("symmetric", "clip", "oracle") else "-"
            ax.plot(mags, [c["methods"][name]["r"] for c in cells], style, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("corruption (key std)")
        ax.set_title(f"{source['label']}, {100 * dens:g} %", fontsize=9)
    axes[0][0].set_ylabel("relative output change r")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
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
