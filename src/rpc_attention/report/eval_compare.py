"""Robustness side by side: the evaluation results (``rpc-attention eval``'s ``<suite>.json``) of several
runs in one table, with each run's difference from the first and, where both results keep per-example
records of the same examples, the 95 % paired bootstrap interval of that difference over examples
(:func:`rpc_attention.report.intervals.paired_comparison`, the study report's own machinery); and one
figure: top-1 against eps for every attack sweep, the error of every corruption. ``rpc-attention
compare`` calls :func:`compare_evals` for runs that have evaluation results.

A source is a run directory (its results in ``RUN/eval/``) or a folder of results itself
(``eval --out DIR``, ``eval-external``'s ``RUN/eval-rpc-.../``). Writes ``robustness.json``,
``robustness.md`` and ``robustness.png``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..markdown import markdown_table
from .compare import lower_is_better

CORRUPTIONS = "corruptions"


def _results_in(folder: Path) -> Dict[str, Dict[str, Any]]:
    """``{suite: record}`` of the suite results (JSON objects with ``suite`` and ``metrics``) in ``folder``."""
    out: Dict[str, Dict[str, Any]] = {}
    for f in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # not a suite result (each suite's file is written atomically)
        if isinstance(rec, dict) and isinstance(rec.get("suite"), str) and isinstance(rec.get("metrics"), dict):
            out[rec["suite"]] = rec
    return out


def eval_dir_of(source) -> Optional[Path]:
    """The folder holding ``source``'s results: ``source/eval`` for a run, ``source`` for a results folder."""
    p = Path(source)
    for folder in (p / "eval", p):
        if folder.is_dir() and _results_in(folder):
            return folder
    return None


def has_eval_results(source) -> bool:
    return eval_dir_of(source) is not None


def read_eval_results(source) -> Dict[str, Dict[str, Any]]:
    """``{suite: record}`` of ``source``'s results; FileNotFoundError (one line) when there are none."""
    folder = eval_dir_of(source)
    if folder is None:
        raise FileNotFoundError(f"{source}: no evaluation results (expected {Path(source) / 'eval'}/<suite>.json; "
                                f"run `rpc-attention eval --run {source}` first)")
    return _results_in(folder)


def corruption_metric(name: str) -> str:
    """The table's name of one corruption's error (mean over severities, percent)."""
    return f"error:{name}"


def _with_corruption_metrics(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A corruptions record with one metric per corruption (its error, mean over severities), in the
    metrics and, where kept, in the per-example record (the bits of that corruption's settings)."""
    rec = dict(rec, metrics=dict(rec["metrics"]))
    pe = rec.get("per_example")
    if pe and isinstance(pe.get("metrics"), dict):
        pe = rec["per_example"] = dict(pe, metrics=dict(pe["metrics"]))
    for row in rec.get("rows") or []:
        name = row.get("corruption")
        if name is None or not isinstance(row.get("mean_error"), (int, float)):
            continue
        rec["metrics"][corruption_metric(name)] = float(row["mean_error"])
        if isinstance(row.get("CE"), (int, float)):  # normalised by a baseline (corruptions.baseline) or AlexNet
            rec["metrics"][f"CE:{name}"] = float(row["CE"])
        if pe and isinstance(pe.get("metrics"), dict):
            settings = [s for s in (pe.get("correct") or {}) if s.startswith(f"{name}@")]
            if settings:
                pe["metrics"][corruption_metric(name)] = {"settings": settings, "error": True}
    return rec


def _interval(base: Dict[str, Any], other: Dict[str, Any], metric: str, resamples: int) -> Optional[Dict[str, Any]]:
    """The paired bootstrap of ``other - base`` on ``metric`` over the examples both kept, or None (no
    per-example records, different seeds so the corrupted / attacked examples differ, disjoint examples)."""
    from ..evaluate.per_example import example_data
    from .intervals import paired_comparison

    if base.get("seed") != other.get("seed"):
        return None
    a, b = example_data(base.get("per_example"), metric), example_data(other.get("per_example"), metric)
    if a is None or b is None:
        return None
    try:
        cmp = paired_comparison({"0": base["metrics"][metric]}, {"0": other["metrics"][metric]}, {"0": a}, {"0": b},
                                resamples=resamples)
    except ValueError:
        return None
    boot = (cmp.get("bootstrap") or {}).get("per_seed", {}).get("0")
    return None if boot is None else {k: boot[k] for k in ("diff", "lo", "hi", "n_examples", "level")}


def _rows(results: List[Dict[str, Dict[str, Any]]], labels: List[str], resamples: int) -> List[Dict[str, Any]]:
    suites = [s for s in results[0] if all(s in r for r in results[1:])]
    rows = []
    for suite in suites:
        recs = [r[suite] for r in results]
        if suite == CORRUPTIONS:
            recs = [_with_corruption_metrics(r) for r in recs]
        metrics = [m for m, v in recs[0]["metrics"].items()
                   if isinstance(v, (int, float)) and all(isinstance(r["metrics"].get(m), (int, float)) for r in recs)]
        for m in metrics:
            row = {"suite": suite, "metric": m, "lower_is_better": lower_is_better(m) or m.startswith(("error", "CE")),
                   "values": {lab: float(r["metrics"][m]) for lab, r in zip(labels, recs)}, "diffs": {}}
            for lab, r in zip(labels[1:], recs[1:]):
                row["diffs"][lab] = {"diff": float(r["metrics"][m]) - float(recs[0]["metrics"][m]),
                                     "interval": _interval(recs[0], r, m, resamples)}
            rows.append(row)
    return rows


def _cell(d: Dict[str, Any]) -> str:
    iv = d["interval"]
    return f"{d['diff']:+.2f}" + (f" [{iv['lo']:+.2f}, {iv['hi']:+.2f}]" if iv else "")


def _markdown(table: Dict[str, Any]) -> str:
    labels = [r["label"] for r in table["runs"]]
    head = ["suite", "metric", "better"] + labels + [f"{lab} - {labels[0]}" for lab in labels[1:]]
    body = [[r["suite"], r["metric"], "lower" if r["lower_is_better"] else "higher"]
            + [f"{r['values'][lab]:.2f}" for lab in labels] + [_cell(r["diffs"][lab]) for lab in labels[1:]]
            for r in table["rows"]]
    lines = [f"# Robustness side by side (differences: each run minus {labels[0]})", ""]
    lines += [f"- {r['label']}: {r['eval_dir']}" for r in table["runs"]] + [""]
    lines += markdown_table(head, body)
    lines += ["", "Values in percent. [lo, hi]: the 95 % paired bootstrap interval of the difference over the "
                  f"examples both runs were evaluated on ({table['resamples']} resamples of the examples, the same "
                  "for both runs); none where a result keeps no per-example record or the seeds differ."]
    return "\n".join(lines) + "\n"


def compare_evals(sources: Sequence, out_dir, labels: Optional[Sequence[str]] = None,
                  resamples: int = 2000) -> Dict[str, Any]:
    """Tabulate the evaluation results of ``sources`` (run directories or result folders) side by side;
    writes ``robustness.json``, ``robustness.md`` and ``robustness.png`` in ``out_dir`` and returns the table."""
    from ..files import atomic_write_json, atomic_write_text

    if labels is not None and len(labels) != len(sources):
        raise ValueError(f"{len(labels)} --label given for {len(sources)} runs")
    labels = list(labels) if labels else [Path(s).resolve().name for s in sources]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two runs share the label {sorted(lab for lab in labels if labels.count(lab) > 1)[0]!r}; "
                         f"name them with --label")
    results = [read_eval_results(s) for s in sources]
    rows = _rows(results, labels, resamples)
    if not rows:
        raise ValueError("the runs have no evaluation suite in common (rpc-attention eval --suite ... on each)")
    table = {"baseline": labels[0], "resamples": int(resamples), "rows": rows,
             "runs": [{"label": lab, "source": str(s), "eval_dir": str(eval_dir_of(s))}
                      for lab, s in zip(labels, sources)]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "robustness.json", table, sort_keys=False)
    atomic_write_text(out / "robustness.md", _markdown(table))
    _figure(results, labels, out / "robustness.png")
    return table


def _eps_value(label: str) -> Optional[float]:
    try:
        return float(Fraction(label))
    except (ValueError, ZeroDivisionError):
        return None


def eps_axis(settings: Mapping[str, Any]) -> Tuple[float, str]:
    """``(scale, label)`` of an attack sweep's eps axis: L-inf budgets on pixels in [0, 1] in units of
    1/255; any other norm, or budgets on the normalised input (``space=official``), as they are."""
    norm = str(settings.get("norm") or "Linf")
    units = str(settings.get("eps_units") or settings.get("space") or "pixel")
    if norm == "Linf" and units.startswith("pixel"):
        return 255.0, "eps (L-inf, x 1/255)"
    return 1.0, f"eps ({norm}, {units})"


def _sweeps(results, labels) -> Dict[str, List]:
    """``{suite: [(label, [(eps, top1), ...]), ...]}`` of the attack sweeps every run has."""
    out: Dict[str, List] = {}
    for suite in [s for s in results[0] if all(s in r for r in results[1:])]:
        lines = []
        for lab, r in zip(labels, results):
            pts = sorted((_eps_value(m.split("@", 1)[1]), v) for m, v in r[suite]["metrics"].items()
                         if m.startswith("top1@") and isinstance(v, (int, float)) and _eps_value(m.split("@", 1)[1]) is not None)
            if pts:
                lines.append((lab, pts))
        if len(lines) == len(labels):
            out[suite] = lines
    return out


def _figure(results, labels, path: Path) -> None:
    """Top-1 against eps (one panel per attack sweep) and the error of each corruption (grouped bars)."""
    from ..files import atomic_savefig, pyplot

    sweeps = _sweeps(results, labels)
    corr = [_with_corruption_metrics(r[CORRUPTIONS]) for r in results] if all(CORRUPTIONS in r for r in results) else []
    panels = len(sweeps) + (1 if corr else 0)
    if not panels:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 3.6), squeeze=False)
    for ax, (suite, lines) in zip(axes[0], sweeps.items()):
        scale, xlabel = eps_axis(results[0][suite].get("settings") or {})
        for i, (lab, pts) in enumerate(lines):
            ax.plot([p[0] * scale for p in pts], [p[1] for p in pts], marker="o", ms=3, label=lab, color=f"C{i % 10}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("top-1 (%)")
        ax.set_title(suite)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if corr:
        _corruption_panel(axes[0][-1], corr, labels)
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)


def _corruption_panel(ax, recs, labels) -> None:
    names = [row["corruption"] for row in recs[0].get("rows") or [] if "corruption" in row]
    width = 0.8 / len(labels)
    for i, (lab, rec) in enumerate(zip(labels, recs)):
        vals = [rec["metrics"].get(corruption_metric(c), float("nan")) for c in names]
        ax.bar([j + i * width for j in range(len(names))], vals, width=width, label=lab, color=f"C{i % 10}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("error (%), mean over severities")
    ax.set_title("corruptions")
    ax.legend(fontsize=8)
