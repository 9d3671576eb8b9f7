"""The study report's view of PAP's sparse step and of sparse corruption.

:func:`collect_sparsity` reads, for every RPC model of a study, the S activity its training recorded
(``runs/<run>/final_metrics.json``, key ``"sparsity"``: the ``sparsity`` trainer callback's last
record, on the run's fixed held-out probe) and applies the written rule :data:`FIRED_RULE`.
:func:`render_sparsity` and :func:`render_sparse_corruption` give the Markdown of the S-activity
table and of the sparse-corruption table.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List

from ..markdown import NOT_MEASURED, markdown_table
from .rows import gather_rows

__all__ = ["FIRED_RULE", "collect_sparsity", "model_sparsity_verdict", "render_sparsity",
           "render_sparse_corruption"]

# The rule of rpc_attention.train.sparsity.FIRED_RULE, worded for the report (runs and models).
FIRED_RULE = ("A PAP block's sparse step *fired* when the share of non-zero entries of S (the sparse part of "
              "the keys, in PAP's final pass) is above 0 on the probe; at 0, S = 0 everywhere and the block "
              "*acted as iterated attention* (each pass attends with the previous pass's output as keys). A run "
              "fired when any of its PAP blocks did; a model fired when any of its runs did.")
FIRED, ITERATED = "fired", "acted as iterated attention"


def _final_metrics(run_dir: Path) -> Dict[str, Any]:
    """The run's ``final_metrics.json``; empty when the run has not finished (a corrupt file is an error)."""
    from ..train.rundir import RunDir

    try:
        return RunDir(run_dir).read_final_metrics()
    except FileNotFoundError:
        return {}


def model_sparsity_verdict(runs: Dict[str, Dict[str, Any]]) -> str:
    """The model's verdict from its runs' records (:data:`FIRED_RULE`); "not measured" without any."""
    blocks = [b for r in runs.values() for b in (r.get("blocks") or [])]
    if not blocks:
        return NOT_MEASURED
    return FIRED if any(float(b.get("frac_nonzero") or 0.0) > 0 for b in blocks) else ITERATED


def collect_sparsity(out_dir, study) -> Dict[str, Any]:
    """``{"rule": ..., "models": {key: {"label", "verdict", "runs": {run: record}}}}`` for the RPC models."""
    out: Dict[str, Any] = {"rule": FIRED_RULE, "models": {}}
    for m in study.models:
        if m.role != "rpc":
            continue
        runs: Dict[str, Dict[str, Any]] = {}
        for run in m.runs():
            final = _final_metrics(Path(out_dir) / "runs" / run)
            rec = final.get("sparsity")
            runs[run] = rec if isinstance(rec, dict) else {"blocks": [], "note": "no S-activity record in "
                                                                                "final_metrics.json"}
        out["models"][m.key] = {"label": m.label, "family": m.family, "verdict": model_sparsity_verdict(runs),
                                "runs": runs}
    return out


def _pct(x: Any) -> str:
    if not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        return "—"
    return f"{100.0 * float(x):.3g}"


def _num(x: Any) -> str:
    if not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        return "—"
    return f"{float(x):.3g}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    return markdown_table(header, rows) + [""]


def render_sparsity(res: Dict[str, Any]) -> List[str]:
    """Markdown: the S-activity table of every RPC model, the rule and one verdict line per model."""
    sp = res.get("sparsity") or {}
    models = sp.get("models") or {}
    if not models:
        return []
    rows: List[List[str]] = []
    for m in models.values():
        for run, rec in m["runs"].items():
            probe = rec.get("probe") or {}
            where = f"{probe.get('examples')} {probe.get('split')}" if probe else "—"
            if not rec.get("blocks"):
                rows.append([m["label"], run, "—", "—", where] + ["—"] * 6 + [rec.get("note", NOT_MEASURED)])
            for b in rec.get("blocks") or []:
                rule = f"{b.get('threshold')} λ={_num(b.get('lambd'))}" + (", causal" if b.get("causal") else "")
                rows.append([m["label"], run, str(b.get("block")), rule, where, _pct(b.get("frac_nonzero")),
                             _pct(b.get("frac_rows_nonzero")), _num(b.get("s_over_k")),
                             f"{_num(b.get('tau_mean'))} (max {_num(b.get('tau_max'))})",
                             f"{_num(b.get('abs_k_median'))} / {_num(b.get('abs_k_p99'))} / {_num(b.get('abs_k_max'))}",
                             str(b.get("n_iter")), b.get("verdict") or ""])
    lines = ["## PAP's sparse step: did it fire?", "",
             "S activity of every PAP block at the end of training, on the run's fixed held-out probe (the "
             "first examples of its validation split): the share of non-zero entries of S, the share of tokens "
             "with a non-zero S row, ||S||_F / ||K||_F, the threshold tau and the |k| quantiles. " + FIRED_RULE, ""]
    lines += _table(["model", "run", "block", "threshold", "probe", "S ≠ 0 (% entries)", "S rows ≠ 0 (% tokens)",
                     "‖S‖/‖K‖", "tau", "|k| median / p99 / max", "n_iter", "verdict"], rows)
    lines += [f"- **{m['label']}**: {m['verdict']}." for m in models.values()] + [""]
    return lines


def render_sparse_corruption(res: Dict[str, Any]) -> List[str]:
    """Markdown: top-1 under each sparse-corruption setting (rows) for every model (columns)."""
    def setting(row: dict) -> str:
        level = row.get("level")
        return f"{row.get('corruption')}: {level}" if level not in (None, "-") else str(row.get("corruption"))

    per_model = (res.get("evals") or {}).get("sparse") or {}
    settings, data = gather_rows(per_model, setting, "top1")
    if not data:
        return []
    keys = list(data)

    def cell(xs: List[float]) -> str:
        if not xs:
            return "—"
        m = sum(xs) / len(xs)
        if len(xs) < 2:
            return f"{m:.2f}"
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
        return f"{m:.2f} ± {sd:.2f}"

    rows = [[s] + [cell(data[k].get(s, [])) for k in keys] for s in settings]
    any_e = next(iter(next(iter(per_model.values())).values()))
    lines = [f"**Sparse corruption**: top-1 (%) under each setting ({any_e.get('n_examples')} test examples; "
             f"{any_e.get('protocol') or ''}; mean ± std over seeds where there are several).", ""]
    lines += _table(["setting"] + [res["models"].get(k, {}).get("label", k) for k in keys], rows)
    return lines + _render_support(res, per_model)


_PRECISION, _RECALL = "s_precision_", "s_recall_"


def _render_support(res: Dict[str, Any], per_model: Dict[str, Any]) -> List[str]:
    """Markdown: precision / recall of the support of block 1's final S against the corrupted key entries
    (the sparse suite's ``s_precision_<setting>`` / ``s_recall_<setting>`` metrics), mean over seeds, for
    every model whose block 1 runs PAP; nothing when no model recorded them."""
    found: Dict[str, Dict[str, List[tuple]]] = {}
    for key, per_seed in per_model.items():
        for record in per_seed.values():
            m = record.get("metrics") or {}
            for name, value in m.items():
                recall = m.get(_RECALL + name[len(_PRECISION):])
                if name.startswith(_PRECISION) and isinstance(value, (int, float)) and isinstance(recall, (int, float)):
                    found.setdefault(key, {}).setdefault(name[len(_PRECISION):], []).append((value, recall))
    if not found:
        return []
    # by share, then magnitude ("keys@5%x20std"): the order of the dose-response
    settings = sorted({s for per in found.values() for s in per},
                      key=lambda s: [float(x) for x in re.findall(r"\d+(?:\.\d+)?", s)])

    def cell(pairs: List[tuple]) -> str:
        if not pairs:
            return "—"
        return f"{sum(p for p, _ in pairs) / len(pairs):.2f} / {sum(r for _, r in pairs) / len(pairs):.2f}"

    rows = [[s.replace("top1_", "")] + [cell(found[k].get(s, [])) for k in found] for s in settings]
    return ["", "**S on the corrupted keys**: precision / recall of the support of block 1's final S (its "
            "non-zero entries) against the corrupted key entries, mean over seeds (models whose block 1 runs PAP).",
            ""] + _table(["setting"] + [res["models"].get(k, {}).get("label", k) for k in found], rows)
