"""The suite's results as Markdown tables and files (``bench-<config>-<device>.json`` and ``.md``)."""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from ..files import atomic_write_text
from ..markdown import markdown_table


def _ms(s: Optional[float]) -> str:
    return "-" if s is None else f"{s * 1e3:.2f}"


def _range_ms(summary: Optional[dict]) -> str:
    if not summary or summary.get("median") is None:
        return "-"
    return f"{_ms(summary['median'])} ({_ms(summary['min'])}-{_ms(summary['max'])})"


def _ratio(summary, digits: int = 2) -> str:
    if summary is None:
        return ""
    if isinstance(summary, (int, float)):
        return f"{summary:.{digits}f}"
    if summary.get("median") is None:
        return ""
    if summary["n"] > 1:
        return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"
    return f"{summary['median']:.{digits}f}"


def _mib(b: Optional[int]) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def header_markdown(results: dict) -> List[str]:
    """Title, environment, load and how to read the tables."""
    env = results["env"]
    return [
        f"# rpc-attention benchmark ({results['config']}, {env['device']})", "",
        f"{env['date']} - torch {env['torch']}, {env['threads']} threads, {env['cpu_count']} CPUs "
        f"({env['processor']}), flush denormals: {env['flush_denormal']}"
        + (f", GPU {env['gpu']} ({env['amp']})" if env.get("gpu") else ""),
        f"load average: start {env['load_average_start']}, after timing {env.get('load_average_after_timing')}, "
        f"end {env.get('load_average_end')}; wall {env.get('wall_s')} s", "",
        "Times: median over rounds (min-max) in ms. Ratios are taken round by round against the "
        "baseline measured beside them. `x n*sdpa`: time / (n x one symmetric SDPA). "
        "`official/pap`: official formulation's time over ours with the same n. "
        f"Memory ({results.get('memory_method')}): `peak` MiB above the live memory before the call; "
        "`saved`: MiB autograd keeps for backward (inputs excluded).", "",
    ]


def targets_markdown(targets: List[dict]) -> List[str]:
    if not targets:
        return []
    rows = []
    for t in targets:
        val = "-" if t["measured"] is None else f"{t['measured']:.2f}"
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        rows.append([t["target"], t["goal"], val, met])
    return ["## Targets", ""] + markdown_table(["target", "goal", "measured", "met"], rows) + [""]


def _op_notes(case: str, rf: dict, rb: dict) -> str:
    notes = [r[key] for r in (rf, rb) for key in ("error", "mem_error") if r.get(key)]
    if rf.get("n_iter_run") is not None:
        notes.append(f"stopped after {rf['n_iter_run']} iterations (tol 1e-2)")
    if rf.get("compile_s") is not None:
        notes.append(f"compile {rf['compile_s']:.0f} s")
    ratios_b = rb.get("ratios", {})
    if ratios_b.get("pap_peak_over_official") is not None:
        notes.append(f"pap/official peak {ratios_b['pap_peak_over_official']:.2f}")
    if ratios_b.get("saved_vs_pap1") is not None and case != "pap 1":
        notes.append(f"saved vs pap 1: {ratios_b['saved_vs_pap1']:.2f}")
    return "; ".join(notes)


def _op_row(case: str, rf: dict, rb: dict) -> List[str]:
    """One operator table row: the forward and forward+backward measurements of ``case``."""
    ratios_b = rb.get("ratios", {})
    return [case, _range_ms(rf.get("time")), _ratio(rf.get("ratios", {}).get("vs_n_sdpa")),
            _range_ms(rb.get("time")), _ratio(ratios_b.get("vs_n_sdpa")), _ratio(ratios_b.get("official_over_pap")),
            _mib(rb.get("peak_bytes")), _mib(rb.get("saved_bytes")), _op_notes(case, rf, rb)]


def ops_markdown(groups: List[dict]) -> List[str]:
    """One table per shape: each case's forward and forward+backward columns side by side."""
    by_shape: Dict[str, List[dict]] = {}
    for g in groups:
        by_shape.setdefault(g["shape"], []).append(g)
    lines = ["## Operator level", ""] if by_shape else []
    header = ["case", "fwd ms", "fwd x n*sdpa", "fwd+bwd ms", "fwd+bwd x n*sdpa", "official/pap (fwd+bwd)",
              "peak MiB", "saved MiB", "note"]
    for shape, grps in by_shape.items():
        g0 = grps[0]
        lines += [f"### {shape}: B={g0['b']} H={g0['h']} N={g0['n']} d={g0['d']}" + (" causal" if g0["causal"] else ""),
                  ""]
        fwd = {r["case"]: r for g in grps if g["mode"] == "fwd" for r in g["rows"]}
        bwd = {r["case"]: r for g in grps if g["mode"] == "fwd+bwd" for r in g["rows"]}
        cases = list(dict.fromkeys(list(fwd) + list(bwd)))
        lines += markdown_table(header, [_op_row(c, fwd.get(c, {}), bwd.get(c, {})) for c in cases]) + [""]
    return lines


def _model_cells(r: dict) -> List[str]:
    rat = r.get("ratios", {})
    tp = "-" if r.get("train_throughput") is None else f"{r['train_throughput']:.1f}"
    ip = "-" if r.get("infer_throughput") is None else f"{r['infer_throughput']:.1f}"
    err = f" ({r['error']})" if r.get("error") else ""
    return [f"{r['model']}{err}", f"{r['params'] / 1e6:.2f}", _range_ms(r.get("train")), _ratio(rat.get("train_vs_base")),
            tp, _range_ms(r.get("infer")), _ratio(rat.get("infer_vs_base")), ip, _mib(r.get("train_peak_bytes")),
            _ratio(rat.get("train_peak_vs_base"))]


def models_markdown(families: List[dict]) -> List[str]:
    """One table per model family, ratios against the family's baseline."""
    lines = []
    for fam in families:
        unit = fam["unit"]
        lines += [f"## Model level ({fam['family']})", ""]
        if fam.get("note"):
            lines += [f"Note: {fam['note']}", ""]
        header = ["model", "params (M)", "train step ms", "train x base", f"train {unit}/s", "inference ms",
                  "infer x base", f"infer {unit}/s", "train peak MiB", "peak x base"]
        lines += markdown_table(header, [_model_cells(r) for r in fam["rows"]])
        if fam["rows"]:
            first = fam["rows"][0]
            lines += ["", f"Train batch {first['train_batch_items']} {unit}, inference batch "
                          f"{first['infer_batch_items']} {unit} per call."]
        lines.append("")
    return lines


def write_files(results: dict, markdown: str, out_dir: str) -> Dict[str, str]:
    """Write ``bench-<config>-<device>.json`` and ``.md`` into ``out_dir`` (atomically); returns their paths."""
    dev = results["env"]["device"].split(":")[0]
    stem = os.path.join(out_dir, f"bench-{results['config']}-{dev}")
    paths = {"json": stem + ".json", "md": stem + ".md"}
    atomic_write_text(paths["json"], json.dumps(results, indent=1, default=str) + "\n")
    atomic_write_text(paths["md"], markdown)
    return paths
