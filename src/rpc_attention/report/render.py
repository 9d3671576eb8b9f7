"""Render ``results.json`` as markdown and as a self-contained HTML page (figures inlined as base64)."""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path
from typing import Any, Dict, List

from ..markdown import format_seconds, markdown_table
from .families import by_family, family_tables, power_section
from .rows import gather_rows
from .scorecard import has_scorecard, scorecard_lines
from .sparsity import render_sparse_corruption, render_sparsity
from .verdict import FAMILIES

__all__ = ["render_markdown", "render_html", "fmt", "format_seconds", "task_table", "run_summary", "eps_table",
           "corruption_table", "kernels_label"]


def fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e5):
            return f"{x:.3g}"
        return f"{x:.{digits}f}"
    return str(x)


def _cell_text(c: Dict[str, Any]) -> str:
    if not c.get("n"):
        st = c.get("status") or "—"
        return "—" if st in ("not evaluated",) else f"— ({st})"
    s = fmt(c["mean"])
    if c.get("std") is not None:
        s += f" ± {fmt(c['std'])} (n={c['n']})"
    return s


def _table(header: List[str], rows: List[List[Any]]) -> List[str]:
    return markdown_table(header, rows) + [""]


def _plan_lines(res: Dict[str, Any]) -> List[str]:
    """The pre-registered plan the run followed: its file, hash, when it was written and committed."""
    plan = res.get("plan")
    if not plan:
        return []
    git = plan.get("git") or {}
    committed = (f"committed in {git['commit'][:12]} at {git['date']}" + ("" if git.get("clean") else
                 " (the file differed from that commit when the run started)") if git else "not in a git checkout")
    rule = plan.get("rule") or {}
    return [f"*Plan: `{plan['path']}`, sha256 `{plan['sha256']}`, written {plan.get('created')}, {committed}; "
            f"confirmatory seeds from {plan.get('seed_base')}, Holm over a family of {rule.get('family_size')} "
            f"claims at {rule.get('alpha')}; targets by its rule: {rule.get('text', '')}.*", ""] + [
            f"*Plan note: {note}*" for note in plan.get("notes") or []] + ([""] if plan.get("notes") else [])


def _figs(res: Dict[str, Any], section: str) -> List[str]:
    out = []
    for f in res.get("figures", []):
        if f.get("section") == section and f.get("path"):
            out += [f"![{f['caption']}]({f['path']})", "", f"*{f['caption']}*", ""]
    return out


def eps_table(res: Dict[str, Any], suite: str) -> List[str]:
    """Top-1 at each eps of the attack ``suite`` (rows) for every model (columns), mean ± std over seeds."""
    per_model = res["evals"].get(suite) or {}
    eps_order, vals = gather_rows(per_model, lambda row: row.get("eps"), "top1")
    if not vals:
        return []
    keys = list(vals)
    rows = []
    for eps in eps_order:
        r = [eps]
        for k in keys:
            xs = vals[k].get(eps, [])
            if not xs:
                r.append("—")
                continue
            m = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
            r.append(fmt(m) + (f" ± {fmt(sd)}" if sd is not None else ""))
        rows.append(r)
    any_e = next(iter(next(iter(per_model.values())).values()))
    proto = any_e.get("protocol") or ""
    n = any_e.get("n_examples")
    lines = [f"**{suite.upper()}**: top-1 (%) at each eps ({proto}; {n} test examples).", ""]
    return lines + _table(["eps"] + [res["models"].get(k, {}).get("label", k) for k in keys], rows)


def corruption_table(res: Dict[str, Any], protocol: bool = True) -> List[str]:
    """Top-1 error per corruption (rows), mean over severities and seeds, for every model (columns); the
    caption names the suite's protocol unless ``protocol`` is false (it names the baseline run's folder)."""
    per_model = res["evals"].get("corruptions") or {}
    names, data = gather_rows(per_model, lambda row: row.get("corruption") or None, "mean_error")
    if not data:
        return []
    keys = list(data)
    rows = [[c] + [fmt(sum(data[k].get(c, [math.nan])) / max(1, len(data[k].get(c, [1])))) for k in keys] for c in names]
    any_e = next(iter(next(iter(per_model.values())).values()))
    what = f"; {any_e.get('protocol') or ''}" if protocol else ", mean over seeds"
    lines = [f"**Corruptions**: top-1 error (%) per corruption, mean over severities ({any_e.get('n_examples')} test "
             f"examples{what}).", ""]
    return lines + _table(["corruption"] + [res["models"].get(k, {}).get("label", k) for k in keys], rows)


def _lm_rows(res: Dict[str, Any]) -> List[str]:
    out = []
    for suite in ("ppl", "wordswap"):
        per_model = res["evals"].get(suite) or {}
        for key, per_seed in per_model.items():
            for seed, e in per_seed.items():
                if e.get("protocol"):
                    out.append(f"- `{suite}` ({res['models'].get(key, {}).get('label', key)}, seed {seed}): {e['protocol']}")
                    break
            break
    return out + ([""] if out else [])


def _claim_row(c: Dict[str, Any]) -> List[Any]:
    e = c["effect"]

    def ms(vals, mean, sd):
        if mean is None:
            return "—"
        return fmt(mean) + (f" ± {fmt(sd)}" if sd is not None else "") + (f" (n={len(vals)})" if len(vals) > 1 else "")

    iv = c.get("intervals") or {}
    diffs = list((iv.get("per_seed_diff") or {}).values())
    delta = fmt((1.0 if c["higher"] else -1.0) * sum(diffs) / len(diffs)) if diffs else "—"
    seed_ci = _ci(iv.get("seed_ci")) if iv.get("seed_ci") else ("n/a, one seed" if iv.get("seeds") else "—")
    pooled = (iv.get("bootstrap") or {}).get("pooled")
    p = (iv.get("tests") or {}).get("p")
    p_text = f"{fmt(p, 3)} / {fmt(iv['p_holm'], 3)}" if p is not None and iv.get("p_holm") is not None else "—"
    p = c.get("paper")
    paper = f"{fmt(p['baseline'])} → {fmt(p['rpc'])} ({p['setting']}, {p['change']})" if p else "—"
    return [c["title"], f"{c['suite']}: {c['metric']} ({'higher' if c['higher'] else 'lower'} better)",
            ms(c["baseline_values"], e.get("baseline_mean"), e.get("baseline_std")) + f" [{c['baseline_label']}]",
            ms(c["rpc_values"], e.get("rpc_mean"), e.get("rpc_std")) + f" [{c['rpc_label']}]",
            delta, seed_ci, (_ci(pooled) + _ratio(pooled, c["metric"])) if pooled else "—", p_text,
            fmt(iv.get("min_detectable")),
            fmt(c["margin"]), paper, f"**{c['verdict']}**"]


def _ratio(ci: Dict[str, Any], metric: str) -> str:
    """`` (ratio 0.95 [0.93, 0.97])`` for perplexities (RPC / baseline on the same resamples), else ``""``."""
    if "ppl" not in metric or ci.get("ratio_lo") is None:
        return ""
    return f" (ratio {ci['ratio']:.3f} [{ci['ratio_lo']:.3f}, {ci['ratio_hi']:.3f}])"


def _ci(ci: Dict[str, Any]) -> str:
    """``+1.20 [-0.50, +2.90]``: an RPC - baseline difference and its 95 % interval."""
    return f"{ci['diff']:+.2f} [{ci['lo']:+.2f}, {ci['hi']:+.2f}]"


def _holm_note(claims: List[Dict[str, Any]]) -> str:
    """What p (Holm) and the smallest resolvable |delta| were computed over: each family's claims with
    a p, or that no claim has one (never "over the 0 claims")."""
    sizes = {}
    for name, members in by_family(claims).items():
        size = max((c.get("intervals") or {}).get("family") or 0 for c in members)
        if size:
            sizes[name] = size
    if not sizes:
        return ("No claim has a p (each has fewer than two seeds, or per-seed differences with no spread): no p, "
                "Holm adjustment or smallest resolvable difference.")
    per = ", ".join(f"{n} {name}" for name, n in sizes.items())
    return (f"p: the paired t test against the margin over the seeds; p (Holm): adjusted within each family over its "
            f"claims that have a p ({per}). Smallest resolvable |delta|: the effect these seeds would call "
            "reproduced with 80 % power at the family's strictest Holm threshold (Verdict rules).")


def _verdicts_section(res: Dict[str, Any], claims: List[Dict[str, Any]]) -> List[str]:
    if not claims:
        return []
    L = ["## Verdicts in detail", ""]
    header = ["claim (paper)", "metric", "baseline (ours)", "RPC (ours)", "delta, RPC better > 0",
              "RPC − baseline, 95 % seed interval", "RPC − baseline, 95 % example interval", "p / p (Holm)",
              "smallest resolvable |delta|", "margin", "paper: baseline → RPC (its data set)", "verdict"]
    for name, members in by_family(claims).items():
        fam = FAMILIES.get(name)
        L += [f"**{fam.title if fam else name}**", ""] + _table(header, [_claim_row(c) for c in members])
    L += ["Intervals: RPC − baseline in the metric's units (not oriented). Seed interval: t interval over the "
          "per-seed differences (seeds paired). Example interval: paired bootstrap over test examples (the same "
          "resampled examples for both models and every seed, seeds pooled); per-seed intervals are in "
          f"`results.json`. {_holm_note(claims)} Every verdict follows the one rule in Verdict rules.", ""]
    L += ([] if has_scorecard(res) else _figs(res, "forest")) + _figs(res, "verdicts")
    L += ["Reasons:", ""]
    return L + [f"- {c['title']}: {c['verdict']} — {c['reason']}." for c in claims] + [""]


def _training_data_rows(res: Dict[str, Any]) -> List[List[str]]:
    rows = []
    for run, t in res.get("training", {}).items():
        d = t.get("data") or {}
        sch = t.get("schedule") or {}
        if d or sch:
            rows.append([run, d.get("name") or d.get("source") or "—",
                         ", ".join(f"{k}={val}" for k, val in d.items() if k not in ("name",)) or "—",
                         ", ".join(f"{k}={val}" for k, val in sch.items()) or "—"])
    return rows


def _eval_data_rows(res: Dict[str, Any]) -> List[List[str]]:
    rows = []
    for suite, per_model in res.get("evals", {}).items():
        ns = sorted({str(e.get("n_examples")) for pm in per_model.values() for e in pm.values() if e.get("n_examples")})
        ds = sorted({str((e.get("data") or {}).get("dataset") or (e.get("data") or {}).get("source")
                         or " vs ".join(str(x) for x in ((e.get("data") or {}).get("in_distribution"),
                                                         (e.get("data") or {}).get("ood")) if x) or "")
                     for pm in per_model.values() for e in pm.values() if e.get("data")})
        if ns:
            rows.append([suite, ", ".join(d for d in ds if d) or "—", ", ".join(ns)])
    return rows


def _seeds_text(setup: Dict[str, Any]) -> str:
    """"0, 1, 2" when every model has the same seeds, else the models grouped by their seeds."""
    by_model = setup.get("seeds_by_model") or {}
    groups: Dict[tuple, List[str]] = {}
    for label, seeds in by_model.items():
        groups.setdefault(tuple(seeds), []).append(label)
    if len(groups) <= 1:
        return ", ".join(str(x) for x in setup.get("seeds", []))
    return "; ".join(f"{', '.join(labels)}: {', '.join(map(str, seeds))}" for seeds, labels in groups.items())


def kernels_label(setup: Dict[str, Any]) -> str:
    """``, AVX512 kernels``: the CPU kernels torch dispatched to, where the results record them, else ""."""
    return f", {setup['cpu_capability']} kernels" if setup.get("cpu_capability") else ""


def _kernels_text(setup: Dict[str, Any]) -> str:
    """``; CPU kernels AVX2 (ATEN_CPU_CAPABILITY=avx2)``: torch's kernel choice and the variables that capped
    it, where the results record them."""
    if not setup.get("cpu_capability"):
        return ""
    env = ", ".join(f"{k}={v}" for k, v in (setup.get("kernel_env") or {}).items())
    return f"; CPU kernels {setup['cpu_capability']}" + (f" ({env})" if env else "")


def _setup_section(res: Dict[str, Any]) -> List[str]:
    s = res["setup"]
    v = s.get("versions", {})
    L = ["## Setup", ""]
    L += [f"- Hardware: {s.get('cpu')} ({s.get('cpu_count')} logical CPUs), "
          + (f"GPUs: {', '.join(s['gpus'])}" if s.get("gpus") else "no GPU") + f"; device `{s.get('device')}`; "
          f"torch threads {s.get('torch_threads')}; load average at report time {s.get('load_average')}"
          + _kernels_text(s) + ".",
          "- Software: " + ", ".join(f"{k} {val}" for k, val in v.items()) + f"; {s.get('platform')}.",
          "- Seeds: " + _seeds_text(s) + "."]
    L += [f"- {note}" for note in res.get("notes") or []] + [""]
    data_rows = _training_data_rows(res)
    if data_rows:
        L += ["Training runs (data and schedule, from each run's config.yaml):", ""]
        L += _table(["run", "data", "data options", "schedule"], data_rows)
    eval_rows = _eval_data_rows(res)
    if eval_rows:
        L += ["Evaluation data (examples per model):", ""]
        L += _table(["suite", "data", "examples"], eval_rows)
    return L + ["Study settings: " + ", ".join(f"`{k}={val}`" for k, val in res.get("settings", {}).items()), ""]


def _stage_time_section(stages: List[Dict[str, Any]], cpu_count: Any) -> List[str]:
    rows, total, cpu_total = [], 0.0, 0.0
    for r in stages:
        total += r.get("seconds") or 0.0
        note = r.get("reason") or ""
        if r.get("resumed"):
            note = ("resumed after an interruption; " + note).strip("; ")
        ld = [x for x in (r.get("load") or []) if x is not None]
        cpu_total += r.get("cpu_s") or 0.0
        rows.append([r["name"], r["kind"], r["status"], format_seconds(r.get("seconds")), format_seconds(r.get("cpu_s")),
                     format_seconds(r.get("estimate_s")), " → ".join(f"{x:.1f}" for x in ld) or "—", note[:160]])
    L = ["### Time per stage", ""]
    L += _table(["stage", "kind", "status", "wall time", "CPU time", "estimate", "load avg (start → end)", "note"], rows)
    return L + [f"Total stage time: {format_seconds(total)} wall, {format_seconds(cpu_total)} CPU (process time, all threads; "
                "the report stage's own time is not included). Load average: "
                f"1-minute system load when each stage started and ended; on a machine with {cpu_count} logical "
                f"CPUs, a load above {cpu_count} means other processes competed for them and times are inflated.", ""]


def task_table(res: Dict[str, Any], tname: str) -> List[str]:
    """The task table ``tname`` of the results: one row per model (mean ± std over seeds), then the
    paper's rows where it has numbers for the columns."""
    t = res["tables"][tname]
    header = ["model"] + [c["header"] for c in t["columns"]]
    rows = [[r["label"]] + [_cell_text(r["cells"][c["key"]]) for c in t["columns"]] for r in t["rows"]]
    if any(t["paper"]["baseline"].values()):
        scale = t.get("paper_scale", "ImageNet-scale")
        rows.append([f"*paper: baseline ({scale})*"] + [
            fmt(t["paper"]["baseline"][c["key"]]["value"]) if c["key"] in t["paper"]["baseline"] else "" for c in t["columns"]])
        rows.append([f"*paper: RPC ({scale})*"] + [
            f"{fmt(t['paper']['rpc'][c['key']]['value'])} ({t['paper']['rpc'][c['key']]['change']})"
            if c["key"] in t["paper"]["rpc"] else "" for c in t["columns"]])
    return _table(header, rows)


def run_summary(res: Dict[str, Any]) -> str:
    """One line: the study, its stages and their time, the machine, the date."""
    every = res.get("stages") or []
    stages = [r for r in every if r.get("kind") != "report"]
    done = sum(r.get("status") == "done" for r in stages)
    wall = sum(r.get("seconds") or 0.0 for r in stages)
    cpu = sum(r.get("cpu_s") or 0.0 for r in stages)
    s = res.get("setup") or {}
    # the report stage is running while it writes these results, so it is counted apart (reproduce --dry-run
    # counts it as one of the study's stages)
    count = (f"{len(every)} stages: {done} of {len(stages)} done and the report, which wrote these results"
             if len(every) > len(stages) else f"{done} of {len(stages)} stages done")
    return (f"`{res['study']}` study, {count}; {format_seconds(wall)} of stage time "
            f"({format_seconds(cpu)} CPU) on {s.get('cpu')} ({s.get('cpu_count')} logical CPUs{kernels_label(s)}, torch "
            f"{(s.get('versions') or {}).get('torch')}); generated {res.get('generated')}.")


def stage_cost_table(res: Dict[str, Any]) -> List[str]:
    """Estimated against measured stage time, one row per group of stages (the trainings, each eval
    suite, the analyses): count, the study's per-stage estimates summed, the CPU time and wall time the
    stages took, and CPU over estimate. Stages that did not finish are left out of both sums."""
    groups: Dict[str, List[float]] = {}
    for r in res.get("stages") or []:
        if r.get("kind") == "report" or r.get("status") != "done":
            continue
        key = r["kind"] if r.get("kind") != "eval" else f"eval: {r['name'].rsplit('.', 1)[-1]}"
        g = groups.setdefault(key, [0, 0.0, 0.0, 0.0])
        g[0] += 1
        g[1] += r.get("estimate_s") or 0.0
        g[2] += r.get("cpu_s") or 0.0
        g[3] += r.get("seconds") or 0.0
    if not groups:
        return []
    L = ["| stages | count | estimated | CPU time | wall time | CPU / estimate |", "|---|---|---|---|---|---|"]
    rows = sorted(groups.items(), key=lambda kv: -kv[1][2])
    total = [sum(g[i] for _, g in rows) for i in range(4)]
    for key, (n, est, cpu, wall) in rows + [("all", total)]:
        ratio = f"{cpu / est:.2f}" if est > 0 else "—"
        name = f"**{key}**" if key == "all" else key
        L.append(f"| {name} | {int(n)} | {format_seconds(est)} | {format_seconds(cpu)} | {format_seconds(wall)} | {ratio} |")
    return L + [""]


def _task_section(res: Dict[str, Any], tname: str, t: Dict[str, Any]) -> List[str]:
    L = [f"## {t['title']}", ""]
    L += task_table(res, tname)
    L += [f"Ours: mean ± std across seeds (n = number of seeds) where there are several. Rows in italics are "
          f"the paper's ({t.get('paper_scale', 'ImageNet-scale')}; not comparable in absolute terms, "
          "docs/method.md#published-numbers): compare directions, not values.", ""]
    if tname == "vision":
        L += eps_table(res, "fgsm") + eps_table(res, "pgd") + corruption_table(res)
        L += render_sparse_corruption(res)
    if tname == "lm":
        L += _lm_rows(res)
    return L + _figs(res, tname)


def _kpca_rows(run: str, a: Dict[str, Any]) -> List[List[str]]:
    """The analysis table's rows of one run: one per protocol, or one saying why there is none."""
    if not a.get("protocols"):
        return [[a["label"], run, f"— ({a['status']}{': ' + a['reason'] if a.get('reason') else ''})"] + [""] * 7]
    chance = a.get("chance") or {}

    def ch(k):
        xs = [c[k]["mean"] for c in chance.values() if isinstance(c.get(k), dict) and c[k].get("mean") is not None]
        return fmt(sum(xs) / len(xs), 3) if xs else "—"

    rows = []
    for proto, pr in a["protocols"].items():
        mo = pr["model"]
        g = (mo.get("jproj") or {})

        def m(k, d=3, mo=mo):
            x = mo.get(k)
            return fmt(x.get("mean"), d) if isinstance(x, dict) else "—"

        rows.append([a["label"], f"{run} ({proto})", f"{fmt(g.get('mean'), 4)} ± {fmt(g.get('std'), 4)}",
                     m("phi2", 4), m("h2", 4), f"{m('optimal_cosine')} (chance {ch('optimal_cosine')})",
                     f"{m('linear_cka')} (chance {ch('linear_cka')})", f"{m('rbf_cka')} (chance {ch('rbf_cka')})",
                     m("direct_cosine"),
                     " / ".join(fmt(_g.get("mean"), 3) for _g in (pr.get("gamma", {}).get(k, {}) for k in ("learned", "perturbed", "random")))])
    return rows


def _kpca_section(res: Dict[str, Any]) -> List[str]:
    analysis = res.get("analysis")
    if not analysis:
        return []
    L = ["## Kernel-PCA analysis (claims 1 and 2 of section 2 of the paper)", ""]
    rows = [row for run, a in analysis.items() for row in _kpca_rows(run, a)]
    L += _table(["model", "run (protocol)", "J_proj", "‖φ(q)‖²", "‖h‖²", "optimal cosine", "linear CKA",
                 "RBF CKA", "direct cosine", "mean |Δgamma| learned / perturbed / random"], rows)
    for run, a in analysis.items():
        for fm in a.get("failure_messages") or []:
            L += [f"- `{run}`: {fm['count']} analysis record(s) failed: {fm['error']}"]
    if any(a.get("failure_messages") for a in analysis.values()):
        L += [""]
    L += ["Protocols: `paper` standardises q and k per token (the paper's undocumented detail), `exact` uses the "
          "definitions of docs/method.md#kernel-pca-view-of-attention. Chance: independent random matrices of the same shapes. The analysis "
          "tool's own summary, with its stated rules, is in each `analysis/<run>/summary.md`.", ""]
    return L + _figs(res, "kpca")


def _problems_section(res: Dict[str, Any], stages: List[Dict[str, Any]]) -> List[str]:
    bad = [r for r in stages if r["status"] not in ("done",)]
    errs = [f for f in res.get("figures", []) if f.get("section") == "errors"]
    if not (bad or errs):
        return []
    L = ["## Skipped, failed and pending stages", ""]
    L += [f"- `{r['name']}`: {r['status']}" + (f" — {r['reason']}" if r.get("reason") else "") for r in bad]
    L += [f"- figure: {f['caption']}" for f in errs]
    return L + [""]


def render_markdown(res: Dict[str, Any]) -> str:
    """``report.md``: verdicts, setup, time per stage, one section per task, the rules, KPCA, problems."""
    L: List[str] = [f"# Reproduction report: `{res['study']}` study", ""]
    if has_scorecard(res):  # the first screen: the paper's claims, one row each, in the paper's order
        elsewhere = None if res.get("plan") else "the confirmatory run (docs/results/paper.json)"
        L += ["## Scorecard: the paper's claims at this scale", ""] + scorecard_lines(res, elsewhere)
        L += _plan_lines(res) + _figs(res, "forest")
    if (res.get("lead") or {}).get("text"):
        L += [f"**The answer at this scale.** {res['lead']['text']}", ""]
    if res.get("claims"):
        L += ["## Verdicts", ""] + family_tables(res["claims"]) + [f"*{(res.get('lead') or {}).get('rule', '')}*", ""]
    L += [res.get("description", ""), "",
          f"Generated {res['generated']} by `rpc-attention reproduce --study {res['study']}` in `{res['out_dir']}`. "
          "Every number below is also in `results.json`; verdicts are computed by the rules stated at the end, "
          "never written by hand.", ""]
    L += power_section(res)
    L += _verdicts_section(res, res.get("claims") or [])
    L += _setup_section(res)
    # the report stage writing this page is still running: it is not a pending stage
    stages = [r for r in res["stages"] if not (r.get("kind") == "report" and r["status"] == "running")]
    L += _stage_time_section(stages, res["setup"].get("cpu_count"))
    for tname, t in res.get("tables", {}).items():
        L += _task_section(res, tname, t)
    L += render_sparsity(res)
    L += ["## Verdict rules", "", res["rules"], ""]
    L += _kpca_section(res)
    if any(f.get("section") == "seg_examples" for f in res.get("figures", [])):
        L += ["## Example segmentations", ""] + _figs(res, "seg_examples")
    L += _problems_section(res, stages)
    return "\n".join(L).rstrip() + "\n"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
line-height:1.45;color:#222}
table{border-collapse:collapse;margin:0.6em 0;font-size:0.88em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2} tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;border:1px solid #eee} code{background:#f4f4f4;padding:0 3px}
h1,h2,h3{border-bottom:1px solid #eee;padding-bottom:0.2em}
"""


def render_html(markdown_text: str, base_dir, title: str = "rpc-attention reproduction report") -> str:
    """HTML of ``markdown_text`` (python-markdown, tables) with every ``figures/*.png`` image inlined."""
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code", "sane_lists"])
    base = Path(base_dir)

    def inline(m):
        src = html.unescape(m.group(2))
        p = base / src
        if not src.startswith(("http:", "https:", "data:")) and p.is_file():
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            return f'{m.group(1)}"data:image/png;base64,{data}"'
        return m.group(0)

    body = re.sub(r'(<img[^>]*?src=)"([^"]+)"', inline, body)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")
