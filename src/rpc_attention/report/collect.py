"""Collect every number of a study directory into one JSON-able dict (``results.json``).

The report is rendered from this dict only, so every number in ``report.md`` / ``report.html`` is in
``results.json``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..evaluate.suites import Column, all_suites, get_suite
from .intervals import example_se, holm, margin_tests, min_detectable, paired_comparison
from .lead import LEAD_RULE, lead_paragraph
from .paper import PAPER_LABEL, PAPER_ROWS
from .sparsity import collect_sparsity
from .verdict import RULES_TEXT, claim_verdict, effect

__all__ = ["collect_results", "setup_info", "metric_value", "TABLES", "claims_of"]

# The task tables, in the layout of the paper's tables; each suite contributes its own columns
# (``Suite.columns``), placed by their ``position``.
TABLES: Dict[str, Dict[str, Any]] = {
    "vision": {"title": "Image classification and robustness", "paper_scale": "ImageNet-scale"},
    "fan": {"title": "FAN: RPC-FAN (4iter/layer1) vs the symmetric FAN (asymmetric FAN for reference)",
            "paper_scale": "ImageNet-scale"},
    "scaled": {"title": "Scaled Attention vs the asymmetric softmax baseline"},
    "lm": {"title": "Language modelling (word-level perplexity, lower is better)", "paper_scale": "WikiText-103"},
    "seg": {"title": "Segmentation (composed Fashion-MNIST scenes)", "paper_scale": "ADE20K"},
}


def table_columns(table: str) -> List[Tuple[str, Column]]:
    """``(suite name, column)`` of every registered suite's columns in ``table``, by position."""
    return sorted([(s.name, c) for s in all_suites() for c in s.columns if c.table == table],
                  key=lambda sc: sc[1].position)


def metric_value(metrics: Dict[str, Any], name: str) -> Optional[float]:
    """The finite number a suite recorded as ``name``, or None."""
    v = metrics.get(name)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
        return float(v)
    return None


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _versions() -> Dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "torchvision", "timm", "numpy", "transformers", "torchattacks", "imagecorruptions"):
        try:
            from importlib.metadata import version

            out[mod] = version(mod)
        except Exception:
            pass
    try:
        from .. import __version__

        out["rpc_attention"] = __version__
    except Exception:
        pass
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def setup_info(study, environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The machine, software, seeds and CPU kernels of a study's report (``environ``: the process
    environment, whose kernel-capping variables are recorded; default ``os.environ``)."""
    import torch

    environ = os.environ if environ is None else environ
    info: Dict[str, Any] = {
        "hostname": platform.node(), "platform": platform.platform(), "cpu": cpu_model(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "versions": _versions(),
        "device": study.device, "cuda": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [],
    }
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    # float32 results depend on the vectorised kernels torch, oneDNN and MKL dispatch to (AVX-512, AVX2, ...):
    # what torch chose, and the variables that cap it, so two runs' drift can be told apart from their kernels
    info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    info["kernel_env"] = {k: environ[k] for k in _KERNEL_ENV if k in environ}
    info["seeds"] = sorted({s for m in study.models for s in m.seeds})
    info["seeds_by_model"] = {m.label: list(m.seeds) for m in study.models}
    return info


def _train_info(run_dir: Path) -> Dict[str, Any]:
    from ..train.rundir import RunDir

    run = RunDir(run_dir)
    out: Dict[str, Any] = {"run_dir": str(run_dir)}
    if run.is_run():
        cfg = run.read_config()
        d = cfg.get("data") or {}
        out["data"] = {k: d.get(k) for k in ("name", "source", "train_subset", "test_subset", "val_size",
                                             "img_size", "root") if d.get(k) is not None}
        out["model"] = cfg.get("model")
        t = cfg.get("train") or {}
        out["schedule"] = {k: t.get(k) for k in ("epochs", "max_steps", "batch_size", "seed") if k in t}
        out["optim"] = {k: (cfg.get("optim") or {}).get(k) for k in ("name", "lr", "weight_decay")}
    curve = [{k: v for k, v in rec.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
             for rec in run.read_metrics(missing_ok=True)]
    train_recs = [r for r in curve if any("loss" in k for k in r)]
    if len(train_recs) > 300:  # keep the file small: subsample the step records evenly
        keep = set(range(0, len(train_recs), max(1, len(train_recs) // 300)))
        keep_ids = {id(r) for i, r in enumerate(train_recs) if i in keep or i == len(train_recs) - 1}
        curve = [r for r in curve if r not in train_recs or id(r) in keep_ids]
    out["curve"] = curve
    return out


def _cell(values: List[float]) -> Dict[str, Any]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "mean": None, "std": None, "values": []}
    m = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {"n": len(vals), "mean": m, "std": sd, "values": vals}


def relative_to_study(value: Any, out_dir) -> Any:
    """``value`` (results, or any part of them) with the study directory's paths written relative to
    it, so that results carry no path of the machine that ran them: the directory itself becomes
    ``"."``, ``DIR/runs/x`` becomes ``runs/x``, also inside text ("baseline run DIR/runs/x"). Both
    ``out_dir`` as given and resolved are replaced."""
    import re

    prefixes = sorted({str(Path(out_dir)), str(Path(out_dir).resolve())} - {".", "", "/"}, key=len, reverse=True)
    if not prefixes:
        return value
    inside = re.compile("|".join(re.escape(p) + "/" for p in prefixes))
    alone = re.compile("(?:" + "|".join(re.escape(p) for p in prefixes) + r")(?![\w/-])(?!\.\w)")

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, str):
            return alone.sub(".", inside.sub("", x))
        return x

    return strip(value)


def collect_results(out_dir, study, pipeline) -> Dict[str, Any]:
    """Every number of the study in ``out_dir`` as one JSON-able dict: models and their training,
    evaluation records, the task tables, the claims' verdicts and the KPCA analyses; under ``_per_example``
    the per-example records of the evaluations (the caller writes them to ``examples.json.gz``)."""
    out_dir = Path(out_dir)
    stages = pipeline.stage_table()
    status = {r["name"]: r for r in stages}
    res: Dict[str, Any] = {
        "study": study.name, "description": study.description, "settings": study.settings,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "out_dir": str(out_dir.resolve()),
        "setup": setup_info(study), "stages": stages, "notes": list(study.notes),
        "rules": RULES_TEXT, "paper": {"label": PAPER_LABEL, "rows": PAPER_ROWS},
        "models": {}, "training": {}, "evals": {}, "tables": {}, "claims": [], "analysis": {},
        "plan": getattr(study, "plan", None), "not_run": list(getattr(study, "not_run", None) or []),
    }
    _collect_models(res, study, status, out_dir)
    per_example = _collect_evals(res, study, status, out_dir)
    _collect_tables(res, study)
    _collect_claims(res, study, per_example)
    res["sparsity"] = collect_sparsity(out_dir, study)  # S activity of every RPC model's runs
    _collect_analyses(res, study, status, out_dir)
    res["lead"] = {"text": lead_paragraph(res), "rule": LEAD_RULE}
    res = relative_to_study(res, out_dir)
    # the per-example records behind the example intervals go to their own file (report.recompute), not here
    res["_per_example"] = per_example
    return res


def _collect_models(res: Dict[str, Any], study, status: Dict[str, Any], out_dir: Path) -> None:
    """Each model's settings and training status, and each of its runs' training record."""
    for m in study.models:
        runs = m.runs()
        res["models"][m.key] = {"label": m.label, "family": m.family, "role": m.role, "preset": m.preset,
                                "overrides": m.overrides, "seeds": m.seeds, "runs": runs,
                                "train_status": {r: status.get(f"train.{r}", {}).get("status") for r in runs}}
        for run in runs:
            rd = out_dir / "runs" / run
            if rd.is_dir():
                res["training"][run] = _train_info(rd)


def _collect_evals(res: Dict[str, Any], study, status: Dict[str, Any], out_dir: Path) -> Dict[str, Any]:
    """Each evaluation record, by suite, model and seed (with its stage status when it has none).
    Returns the records' per-example correctness, ``{suite: {model: {seed: per_example}}}``, which
    stays out of ``results.json`` (its intervals go in)."""
    per_example: Dict[str, Any] = {}
    for ev in study.evals:
        for key in ev.models:
            m = study.model(key)
            for seed, run in ev.runs_of(m):
                st = status.get(f"eval.{run}.{ev.suite}", {})
                rec = _read_json(out_dir / "runs" / run / "eval" / f"{ev.suite}.json") if st.get("status") == "done" else None
                entry = {"status": st.get("status", "not run"), "reason": st.get("reason"), "seconds": st.get("seconds")}
                if rec:
                    entry.update({"metrics": rec.get("metrics", {}), "rows": rec.get("rows", []),
                                  "protocol": rec.get("protocol"), "settings": rec.get("settings", {}),
                                  "n_examples": rec.get("n_examples"), "data": rec.get("data", {})})
                    normalised = get_suite(ev.suite).study.baseline
                    if ev.baseline_model == key and normalised and normalised not in entry["metrics"]:
                        # the normalising model, by definition
                        entry["metrics"] = dict(entry["metrics"], **{normalised: 100.0})
                        entry["note"] = f"{normalised} = 100 by definition (the errors are normalised by this model's)"
                        _self_normalised_mce(rec)
                    if isinstance(rec.get("per_example"), dict):
                        per_example.setdefault(ev.suite, {}).setdefault(key, {})[str(seed)] = rec["per_example"]
                res["evals"].setdefault(ev.suite, {}).setdefault(key, {})[str(seed)] = entry
    return per_example


def _self_normalised_mce(rec: Dict[str, Any]) -> None:
    """Declare the normalising model's own per-example mCE (its errors over its own mean errors, mean
    100), the same weights the other models' mCE records carry for this baseline run."""
    from ..evaluate.corruptions import declare_mce
    from ..evaluate.per_example import PerExample

    pe, errors = rec.get("per_example"), rec.get("errors") or {}
    if not isinstance(pe, dict) or "mCE" in (pe.get("metrics") or {}) or not errors:
        return
    if any(float(sum(v)) <= 0.0 for v in errors.values()):
        return  # a corruption with no error cannot normalise
    holder = PerExample([])
    declare_mce(holder, list(errors), {c: sum(map(float, v)) / len(v) for c, v in errors.items()})
    pe["metrics"] = dict(pe.get("metrics") or {}, mCE=holder.as_dict()["metrics"]["mCE"])


def _collect_tables(res: Dict[str, Any], study) -> None:
    """The task tables: a cell per model and column (mean, std over seeds), the paper's rows beside them."""
    for tname, spec in TABLES.items():
        keys = [m.key for m in study.models if m.family == tname]
        if not keys:
            continue
        cols = [(s, c.metric, c.header, c.higher, c.paper) for s, c in table_columns(tname) if s in res["evals"]]
        if not cols:
            continue
        rows = []
        for key in keys:
            cells = {}
            for suite, metric, _header, _higher, _pid in cols:
                per = res["evals"][suite].get(key, {})
                vals = [metric_value(e.get("metrics", {}), metric) for e in per.values()]
                c = _cell(vals)
                if not c["n"]:
                    sts = sorted({e.get("status") for e in per.values()})
                    c["status"] = ",".join(s or "not run" for s in sts) if per else "not evaluated"
                    c["reason"] = next((e.get("reason") for e in per.values() if e.get("reason")), None)
                cells[f"{suite}:{metric}"] = c
            rows.append({"model": key, "label": res["models"][key]["label"], "role": res["models"][key]["role"],
                         "cells": cells})
        # a column nobody has a number for, and that has no paper anchor, is noise: drop it
        keep = [c for c in cols if c[4] or any(r["cells"][f"{c[0]}:{c[1]}"]["n"] for r in rows)]
        for r in rows:
            r["cells"] = {k: v for k, v in r["cells"].items() if any(k == f"{c[0]}:{c[1]}" for c in keep)}
        cols = keep
        paper = {"baseline": {}, "rpc": {}}
        for suite, metric, _header, _higher, pid in cols:
            if pid and pid in PAPER_ROWS:
                pr = PAPER_ROWS[pid]
                paper["baseline"][f"{suite}:{metric}"] = {"value": pr["baseline"], "setting": pr["setting"]}
                paper["rpc"][f"{suite}:{metric}"] = {"value": pr["rpc"], "setting": pr["setting"], "change": pr["change"]}
        res["tables"][tname] = {"title": spec["title"], "paper_scale": spec.get("paper_scale", "ImageNet-scale"),
                                "columns": [
            {"key": f"{s}:{m}", "suite": s, "metric": m, "header": h, "higher": hb, "paper": p} for s, m, h, hb, p in cols],
            "rows": rows, "paper": paper}


def _seed_values(res: Dict[str, Any], suite: str, key: str, metric: str) -> Dict[str, float]:
    """``{seed: value}`` of one model's metric, for the seeds that measured it."""
    per_seed = res["evals"].get(suite, {}).get(key, {})
    vals = {seed: metric_value(e.get("metrics", {}), metric) for seed, e in per_seed.items()}
    return {seed: v for seed, v in vals.items() if v is not None}


def _seed_scores(per_example: Dict[str, Any], suite: str, key: str, metric: str,
                 reference: Optional[str] = None) -> Dict[str, Any]:
    """``{seed: ExampleData}`` of one model's metric, where recorded. With ``reference`` (the model
    whose errors normalise the suite's mCE), mCE's reference errors are recomputed on every resample
    (:mod:`rpc_attention.report.mce`)."""
    from ..evaluate.corruptions import MCE
    from ..evaluate.per_example import example_data
    from .mce import mce_example_data

    records = per_example.get(suite, {})
    refs = records.get(reference, {}) if reference else {}
    out = {}
    for seed, rec in records.get(key, {}).items():
        data = None
        if metric == MCE and refs:
            data = mce_example_data(rec, refs.get(seed) or next(iter(refs.values())), metric)
        data = data if data is not None else example_data(rec, metric)
        if data is not None:
            out[seed] = data
    return out


def compare_models(res: Dict[str, Any], per_example: Dict[str, Any], suite: str, metric: str,
                   baseline: str, rpc: str, reference: Optional[str] = None,
                   baseline_metric: Optional[str] = None) -> Dict[str, Any]:
    """RPC - baseline of one metric with its seed and example intervals (``intervals.paired_comparison``);
    ``baseline_metric``: the baseline's own metric where it differs (a comparison within one model)."""
    bm = baseline_metric or metric
    return paired_comparison(_seed_values(res, suite, baseline, bm), _seed_values(res, suite, rpc, metric),
                             _seed_scores(per_example, suite, baseline, bm, reference),
                             _seed_scores(per_example, suite, rpc, metric, reference))


def _claim_rows(res: Dict[str, Any], claims, refs: Dict[str, Optional[str]], per_example: Dict[str, Any],
                stored: Optional[Dict[str, Any]] = None) -> List[tuple]:
    """``(claim, baseline evals, RPC evals, baseline values, RPC values, effect, comparison)`` per claim,
    with the margin tests of the comparison on the one interval over seeds and examples
    (``comparison["tests"]``). ``refs``: the model that normalises each suite's errors (mCE); ``stored``
    ({claim id: its published bootstrap, per seed and pooled}) stands in for the bootstrap of a claim without
    per-example records (a published study recomputed from its results alone)."""
    rows = []
    for c in claims:
        b = res["evals"].get(c.suite, {}).get(c.baseline, {})
        r = res["evals"].get(c.suite, {}).get(c.rpc, {})
        bm = getattr(c, "baseline_metric", None) or c.metric
        bv = [v for v in (metric_value(e.get("metrics", {}), bm) for e in b.values()) if v is not None]
        rv = [v for v in (metric_value(e.get("metrics", {}), c.metric) for e in r.values()) if v is not None]
        e = effect(bv, rv, c.higher, c.margin, c.relative)
        iv = compare_models(res, per_example, c.suite, c.metric, c.baseline, c.rpc, refs.get(c.suite),
                            baseline_metric=getattr(c, "baseline_metric", None))
        if iv["bootstrap"] is None and stored and stored.get(c.id):
            iv["bootstrap"] = stored[c.id]
        margin = e.margin if e.margin is not None else c.margin
        pooled = (iv["bootstrap"] or {}).get("pooled")
        iv["tests"] = margin_tests(list(iv["per_seed_diff"].values()), margin, c.higher, example_se(pooled),
                                   target=c.target if getattr(c, "smaller", False) else None)
        rows.append((c, b, r, bv, rv, e, iv))
    return rows


def _holm_by_family(rows: List[tuple]) -> None:
    """Holm's adjustment of the three tests within each claim's family (``p_holm``, ``p_equivalence_holm``,
    and ``p_smaller_holm`` over the claims with a target),
    the family's size and the MDE at its strictest step (``min_detectable``). A claim without a noise
    figure enters Holm with p = 1 (it counts in the family, which is fixed before the data) and gets no
    adjusted p."""
    families: Dict[str, List[tuple]] = {}
    for row in rows:
        families.setdefault(row[0].family, []).append(row)
    for members in families.values():
        tests = [row[-1]["tests"] or {} for row in members]
        flat = [t.get("no_spread", False) for t in tests]
        p_dir = [1.0 if f else t.get("p") for t, f in zip(tests, flat)]
        p_tost = [1.0 if f else t.get("p_equivalence") for t, f in zip(tests, flat)]
        p_small = [None if not getattr(row[0], "smaller", False) else (1.0 if f else t.get("p_smaller"))
                   for row, t, f in zip(members, tests, flat)]
        size = sum(p is not None for p in p_dir)
        for row, f, p, q, s, t in zip(members, flat, holm(p_dir), holm(p_tost), holm(p_small), tests):
            c, e, iv = row[0], row[5], row[-1]
            margin = e.margin if e.margin is not None else c.margin
            iv["p_holm"], iv["p_equivalence_holm"] = (None, None) if f else (p, q)
            iv["p_smaller_holm"] = None if f else s
            iv["family"] = size
            iv["min_detectable"] = min_detectable(list(iv["per_seed_diff"].values()), size, margin,
                                                  se_examples=t.get("se_examples") or 0.0)


def claims_of(res: Dict[str, Any], claims, refs: Dict[str, Optional[str]], per_example: Dict[str, Any],
              stored: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Each claim's record and verdict by the one rule of RULES_TEXT: the margin tests on the one interval
    over seeds and examples, Holm-adjusted within the claim's family, and the smallest effect the design
    could have resolved. The report and ``rpc-attention verify`` both call this."""
    rows = _claim_rows(res, claims, refs, per_example, stored)
    _holm_by_family(rows)
    out = []
    for c, b, r, bv, rv, e, iv in rows:
        margin = e.margin if e.margin is not None else c.margin
        v = claim_verdict(iv, c.higher, e.margin, iv["p_holm"], iv["p_equivalence_holm"], iv.get("p_smaller_holm"),
                          c.target if getattr(c, "smaller", False) else None)
        reason = v["reason"]
        if not bv or not rv:
            why = [x.get("reason") or x.get("status") for x in list(b.values()) + list(r.values())
                   if x.get("status") != "done"]
            if why:
                reason += f" ({why[0]})"
        out.append({
            "id": c.id, "title": c.title, "table": c.table, "suite": c.suite, "metric": c.metric,
            "family": c.family, "target": c.target, "smaller": bool(getattr(c, "smaller", False)),
            "baseline_metric": getattr(c, "baseline_metric", None), "margin_spec": c.margin, "reference": refs.get(c.suite),
            "baseline": c.baseline, "baseline_label": res["models"].get(c.baseline, {}).get("label", c.baseline),
            "rpc": c.rpc, "rpc_label": res["models"].get(c.rpc, {}).get("label", c.rpc), "higher": c.higher,
            "margin": margin, "relative_margin": c.relative, "baseline_values": bv, "rpc_values": rv,
            "verdict": v["verdict"], "reason": reason, "effect": e.as_dict(), "intervals": iv,
            "paper": PAPER_ROWS.get(getattr(c, "paper_id", None) or c.id), "paper_id": getattr(c, "paper_id", None),
        })
    return out


def _collect_claims(res: Dict[str, Any], study, per_example: Dict[str, Any]) -> None:
    refs = {ev.suite: ev.baseline_model for ev in study.evals if ev.baseline_model}
    res["claims"] = claims_of(res, study.claims, refs, per_example)


def _collect_analyses(res: Dict[str, Any], study, status: Dict[str, Any], out_dir: Path) -> None:
    """Each KPCA analysis run's status and, when done, :func:`_analysis_summary` of its kpca.json."""
    for a in study.analyses:
        m = study.model(a["model"])
        for run in m.runs():
            st = status.get(f"analyze.{run}", {})
            kp = _read_json(out_dir / "analysis" / run / "kpca.json") if st.get("status") == "done" else None
            entry: Dict[str, Any] = {"model": m.key, "label": m.label, "status": st.get("status", "not run"),
                                     "reason": st.get("reason"), "dir": f"analysis/{run}"}
            if kp:
                entry.update(_analysis_summary(kp, run))
            res["analysis"][run] = entry


def _analysis_summary(kp: Dict[str, Any], run: str) -> Dict[str, Any]:
    """The parts of a ``kpca.json`` the report shows."""
    entry: Dict[str, Any] = {"protocols": {}}
    for proto, pr in (kp.get("protocols") or {}).items():
        mo = pr.get("model") or {}
        entry["protocols"][proto] = {
            "model": {k: mo.get(k) for k in ("jproj", "phi2", "h2", "log_phi2", "log_h2", "log_mean_jproj",
                                              "log_mean_jproj_official", "rel_error_wrt_phi2", "rel_error_wrt_h2",
                                              "optimal_cosine", "direct_cosine", "linear_cka", "rbf_cka",
                                              "eig_max", "eig_min", "eig_mean", "eig_median")},
            "gamma": {k: {kk: vv for kk, vv in (g or {}).items() if kk in ("mean", "std", "n")}
                      for k, g in (mo.get("gamma") or {}).items()},
            "layers": [{k: L.get(k) for k in ("name", "kind", "tokens", "heads", "jproj", "phi2", "h2",
                                              "optimal_cosine", "linear_cka", "rbf_cka", "direct_cosine")}
                       for L in pr.get("layers", [])],
        }
    entry["chance"] = kp.get("chance", {})
    entry["history"] = kp.get("history", [])
    fails = kp.get("failures") or []
    entry["failures"] = len(fails)
    msgs: Dict[str, int] = {}
    for f in fails:
        msgs[str(f.get("error"))] = msgs.get(str(f.get("error")), 0) + 1
    entry["failure_messages"] = [{"error": m, "count": c} for m, c in
                                 sorted(msgs.items(), key=lambda x: -x[1])[:5]]
    entry["meta"] = {k: v for k, v in (kp.get("meta") or {}).items() if isinstance(v, (str, int, float))}
    entry["figures"] = [str(Path("analysis") / run / Path(f).name) for f in kp.get("figures", []) or []]
    return entry
