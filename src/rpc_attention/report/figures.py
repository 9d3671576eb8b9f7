"""Report figures (matplotlib, Agg backend, imported lazily), drawn from the ``results.json`` dict.

Each function returns a list of ``{"path": relative path, "caption": ..., "section": ...}`` for the
figures it wrote (nothing when the numbers it needs are absent).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..evaluate.suites import all_suites
from ..files import atomic_savefig, pyplot
from .verdict import mean_std

__all__ = ["make_figures"]


def _save(fig, out_dir: Path, name: str) -> str:
    plt = pyplot()
    try:
        atomic_savefig(fig, out_dir / "figures" / name, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return f"figures/{name}"


def _int_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _eps_value(label) -> Optional[float]:
    """'2/255' -> 2.0 (in 1/255 units); a plain float -> value * 255."""
    if label is None:
        return None
    s = str(label)
    m = re.fullmatch(r"\s*([0-9.]+)\s*/\s*255\s*", s)
    if m:
        return float(m.group(1))
    try:
        return float(s) * 255.0
    except ValueError:
        return None


def _mean_and_bar(vals: List[float]) -> Tuple[float, float]:
    """Mean and error bar (sample std; none, i.e. 0, for one seed)."""
    _, m, sd = mean_std(vals)
    return m, sd or 0.0


def attack_curves(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    suites = [s.name for s in all_suites() if s.curve and s.name in res["evals"]]
    curves = {}
    for suite in suites:
        for key, per_seed in res["evals"][suite].items():
            pts: Dict[float, List[float]] = {}
            for e in per_seed.values():
                for row in e.get("rows", []):
                    x = _eps_value(row.get("eps"))
                    if x is not None and isinstance(row.get("top1"), (int, float)):
                        pts.setdefault(x, []).append(float(row["top1"]))
                c = (e.get("metrics") or {}).get("clean_top1")
                if isinstance(c, (int, float)) and e.get("rows"):
                    pts.setdefault(0.0, []).append(float(c))
            if pts:
                curves.setdefault(suite, {})[key] = pts
    if not curves:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 3.8), squeeze=False)
    for ax, (suite, per_model) in zip(axes[0], curves.items()):
        for key, pts in per_model.items():
            xs = sorted(pts)
            ms = [_mean_and_bar(pts[x]) for x in xs]
            label = res["models"].get(key, {}).get("label", key)
            ax.errorbar(xs, [m for m, _ in ms], yerr=[s for _, s in ms], marker="o", capsize=3, label=label)
        ax.set_title(f"{suite.upper()} (white-box through PAP)")
        ax.set_xlabel("eps (x 1/255, pixel space)")
        ax.xaxis.set_major_locator(_int_locator())
        ax.set_ylabel("top-1 accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.subplots_adjust(wspace=0.28)
    p = _save(fig, out_dir, "attack_curves.png")
    n_seeds = max(len(e) for per in res["evals"][suites[0]].values() for e in [per]) if suites else 1
    cap = ("Top-1 accuracy vs attack budget eps for each model (eps = 0: clean accuracy of the same examples)"
           + ("; error bars: std across seeds." if n_seeds > 1 else "; one seed."))
    return [{"path": p, "caption": cap, "section": "vision"}]


def corruption_bars(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    per_model = res["evals"].get("corruptions")
    if not per_model:
        return []
    data: Dict[str, Dict[str, List[List[float]]]] = {}
    names: List[str] = []
    for key, per_seed in per_model.items():
        for e in per_seed.values():
            for row in e.get("rows", []):
                c = row.get("corruption")
                if c is None or not isinstance(row.get("mean_error"), (int, float)):
                    continue
                if c not in names:
                    names.append(c)
                sev = [float(row[k]) for k in sorted(row) if re.fullmatch(r"s\d", k) and isinstance(row[k], (int, float))]
                data.setdefault(key, {}).setdefault(c, []).append([float(row["mean_error"])] + sev)
    if not data:
        return []
    plt = pyplot()
    import numpy as np

    keys = list(data)
    multi_seed = any(len(v) > 1 for d in data.values() for v in d.values())
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) * max(1, len(keys)) / 1.5), 4.0))
    width = 0.8 / len(keys)
    x = np.arange(len(names))
    for i, key in enumerate(keys):
        means, lo, hi = [], [], []
        for c in names:
            recs = data[key].get(c, [])
            if not recs:
                means.append(np.nan), lo.append(0), hi.append(0)
                continue
            vals = [r[0] for r in recs]
            m, sd = _mean_and_bar(vals)
            means.append(m)
            if multi_seed:
                lo.append(sd), hi.append(sd)
            else:
                sev = recs[0][1:] or [m]
                lo.append(m - min(sev)), hi.append(max(sev) - m)
        ax.bar(x + (i - (len(keys) - 1) / 2) * width, means, width, yerr=[lo, hi], capsize=2,
               label=res["models"].get(key, {}).get("label", key))
    ax.set_xticks(x)
    ax.set_xticklabels([n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("top-1 error (%), mean over severities")
    ax.set_title("Error under each corruption")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.subplots_adjust(wspace=0.28)
    p = _save(fig, out_dir, "corruption_errors.png")
    cap = ("Top-1 error per corruption (mean over the 5 severities); error bars: "
           + ("std across seeds." if multi_seed else "range from the mildest to the strongest severity (one seed)."))
    return [{"path": p, "caption": cap, "section": "vision"}]


_VAL_KEYS = ("acc1", "top1", "miou", "mIoU", "ppl", "acc")


def _run_curves(curve: List[dict]) -> Dict[str, Any]:
    """A run's training loss, validation metric and validation loss as ``(step, value)`` points."""
    train = [(r["step"], r["loss"]) for r in curve if r.get("split", "train") == "train"
             and isinstance(r.get("loss"), (int, float)) and isinstance(r.get("step"), (int, float))]
    val = [r for r in curve if r.get("split") in ("val", "valid") and isinstance(r.get("step"), (int, float))]
    mk = next((k for k in _VAL_KEYS if any(isinstance(r.get(k), (int, float)) for r in val)), None)
    metric = [(r["step"], r[mk]) for r in val if mk and isinstance(r.get(mk), (int, float))]
    vloss = [(r["step"], r["loss"]) for r in val if isinstance(r.get("loss"), (int, float))]
    return {"train": train, "metric": metric, "metric_name": mk, "val_loss": vloss}


def _draw_validation(ax, per_model: List[tuple], key: str) -> bool:
    """Validation points per model: lines over steps when runs were evaluated several times, else one
    column of dots per model (one dot per seed) so that single evaluations stay visible."""
    series = [(label, color, [c[key] for c in curves if c[key]]) for label, color, curves in per_model]
    series = [t for t in series if t[2]]
    if not series:
        return False
    if max(len(pts) for _, _, runs in series for pts in runs) > 1:
        for label, color, runs in series:
            for i, pts in enumerate(runs):
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=color,
                        label=label if i == 0 else "_nolegend_")
        ax.set_xlabel("step")
        return True
    for x, (_label, color, runs) in enumerate(series):
        ys = [pts[-1][1] for pts in runs]
        ax.scatter([x] * len(ys), ys, color=color, s=28, zorder=3)
    ax.set_xticks(range(len(series)))
    ax.set_xticklabels([t[0] for t in series], rotation=20, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(series) - 0.4)
    ax.set_xlabel("model (one dot per seed, single evaluation)")
    return True


def _training_figure(plt, res: Dict[str, Any], runs: List[str]):
    """The three panels of one model family; None when nothing was logged."""
    per_model: Dict[str, tuple] = {}
    for run in runs:
        key = run.rsplit("-s", 1)[0]
        if key not in per_model:
            color = f"C{len(per_model) % 10}"
            per_model[key] = (res["models"].get(key, {}).get("label", key), color, [])
        per_model[key][2].append(_run_curves(res["training"][run]["curve"]))
    models = list(per_model.values())
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    drew = [False, False, False]
    for label, color, curves in models:
        for i, c in enumerate(curves):
            if c["train"]:
                axes[0].plot([p[0] for p in c["train"]], [p[1] for p in c["train"]], lw=1, color=color,
                             alpha=0.8, label=label if i == 0 else "_nolegend_")
                drew[0] = True
    drew[1] = _draw_validation(axes[1], models, "metric")
    drew[2] = _draw_validation(axes[2], models, "val_loss")
    if not any(drew):
        plt.close(fig)
        return None
    val_name = next((c["metric_name"] for _, _, cs in models for c in cs if c["metric_name"]), None)
    axes[0].set_title("training loss (one line per seed)")
    axes[0].set_xlabel("step")
    axes[1].set_title(f"validation {val_name or 'metric'}")
    axes[2].set_title("validation loss")
    if val_name == "ppl":
        axes[1].set_yscale("log")
    for ax, d in zip(axes, drew):
        ax.grid(alpha=0.3)
        if not d:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    handles = [plt.Line2D([], [], color=color, lw=2, label=label) for label, color, _ in models]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    fig.subplots_adjust(wspace=0.28, bottom=0.32 if len(handles) > 4 else 0.27)
    return fig


def training_curves(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    """Training loss (records with split == "train") and the validation metric (split == "val") per run,
    from each run's metrics.jsonl (the trainer's schema: step, epoch, split, loss, acc1 / ppl / miou).
    One colour per model (its seeds share it) and one legend under the panels."""
    figs = []
    by_family: Dict[str, List[str]] = {}
    for m in res["models"].values():
        for run in m["runs"]:
            if res["training"].get(run, {}).get("curve"):
                by_family.setdefault(m["family"], []).append(run)
    if not by_family:
        return []
    plt = pyplot()
    for fam, runs in by_family.items():
        fig = _training_figure(plt, res, runs)
        if fig is None:
            continue
        p = _save(fig, out_dir, f"training_{fam}.png")
        figs.append({"path": p, "caption": f"Training curves ({fam} models): training loss at each logged step, and the "
                                           "validation metric and loss at each evaluation (the trainer's metrics.jsonl; "
                                           "a single evaluation per run is drawn as one dot per seed).",
                     "section": fam})
    return figs


def _stat(d, key="mean"):
    return d.get(key) if isinstance(d, dict) and isinstance(d.get(key), (int, float)) else None


def kpca_figures(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    """Per analysed run: J_proj terms per layer, alignment next to chance, J_proj over training."""
    figs = []
    plt = pyplot()
    for run, a in res.get("analysis", {}).items():
        if not a.get("protocols"):
            continue
        figs.append(_jproj_terms_figure(plt, run, a, out_dir))
        figs.append(_alignment_figure(plt, run, a, out_dir))
        figs.extend(_jproj_history_figure(plt, run, a, out_dir))
    return figs


def _jproj_terms_figure(plt, run: str, a: Dict[str, Any], out_dir: Path) -> dict:
    protos = a["protocols"]
    fig, axes = plt.subplots(1, len(protos), figsize=(5.2 * len(protos), 3.8), squeeze=False)
    for ax, (proto, pr) in zip(axes[0], protos.items()):
        layers = pr.get("layers") or []
        xs = list(range(len(layers)))
        for term, lab in (("phi2", r"$\|\varphi(q)\|^2$"), ("h2", r"$\|h\|^2$"), ("jproj", "J_proj")):
            ys = [_stat(L.get(term)) for L in layers]
            if term == "jproj":
                neg = [y is not None and y < 0 for y in ys]
                ys = [abs(y) if y is not None else None for y in ys]
                lab = "|J_proj| (hollow: J_proj < 0)"
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
            if pts:
                line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
                if term == "jproj":
                    for (x, y) in pts:
                        if neg[x]:
                            ax.plot([x], [y], marker="o", mfc="white", color=line.get_color())
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_int_locator())
        ax.set_title(f"J_proj terms ({proto} protocol)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.subplots_adjust(wspace=0.28)
    p = _save(fig, out_dir, f"jproj_{run}.png")
    return {"path": p, "section": "kpca", "caption": (
        f"{a['label']}: the projection loss J_proj = mean(‖φ(q)‖² − ‖h‖²) and its two terms per "
        "layer (mean over heads, tokens and probe images; log scale).")}


def _alignment_figure(plt, run: str, a: Dict[str, Any], out_dir: Path) -> dict:
    protos = a["protocols"]
    metrics = ["optimal_cosine", "direct_cosine", "linear_cka", "rbf_cka"]
    chance = a.get("chance") or {}
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    width = 0.8 / (len(protos) + 1)
    import numpy as np

    x = np.arange(len(metrics))
    for i, (proto, pr) in enumerate(protos.items()):
        mo = pr.get("model") or {}
        ax.bar(x + i * width, [_stat(mo.get(k)) or 0 for k in metrics], width,
               yerr=[_stat(mo.get(k), "std") or 0 for k in metrics], capsize=2, label=f"learned V ({proto})")
    if chance:
        cm = [[_stat(v.get(k)) for v in chance.values()] for k in metrics]
        cs = [[_stat(v.get(k), "std") for v in chance.values()] for k in metrics]
        ax.bar(x + len(protos) * width, [np.mean([c for c in cc if c is not None] or [0]) for cc in cm], width,
               yerr=[max([c for c in cc if c is not None] or [0]) for cc in cs], capsize=2, color="grey",
               label="chance (random matrices)")
    ax.set_xticks(x + width * len(protos) / 2)
    ax.set_xticklabels([m.replace("_", " ") for m in metrics])
    lows = [(_stat(pr.get("model", {}).get(k)) or 0) for pr in protos.values() for k in metrics]
    ax.set_ylim(min(0.0, min(lows) - 0.05), 1)
    ax.axhline(0.8, color="k", lw=0.8, ls="--")
    ax.set_ylabel("similarity of V and V_hat")
    ax.set_title("Learned values vs the KPCA value matrix")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.subplots_adjust(wspace=0.28)
    p = _save(fig, out_dir, f"alignment_{run}.png")
    return {"path": p, "section": "kpca", "caption": (
        f"{a['label']}: alignment of the learned value matrix V with the KPCA prediction V_hat (reproduction "
        "study metrics; mean over layer, head and image; error bars: std), next to independent random matrices "
        "of the same shapes (chance). Dashed: 0.8.")}


def _jproj_history_figure(plt, run: str, a: Dict[str, Any], out_dir: Path) -> List[dict]:
    from ..kpca.plots import plot_jproj_history

    protos, hist = a["protocols"], a.get("history") or []
    if len(hist) < 2:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    proto = next((pr for pr in protos if any(f"jproj/{pr}/model/jproj" in r for r in hist)), next(iter(protos)))
    plot_jproj_history(ax, hist, proto)
    ax.set_title(f"J_proj during training ({proto})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.subplots_adjust(wspace=0.28)
    p = _save(fig, out_dir, f"jproj_history_{run}.png")
    return [{"path": p, "section": "kpca", "caption": f"{a['label']}: J_proj and its terms at the end of each "
                                                      "training epoch (absolute values, log scale)."}]


def seg_examples(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    out = []
    for key, per_seed in (res["evals"].get("seg") or {}).items():
        for seed, e in per_seed.items():
            for f in (e.get("settings") or {}).get("examples", [])[:2]:
                p = Path(f)
                if not p.is_absolute():
                    p = out_dir / p
                if p.is_file():
                    try:
                        rel = os.path.relpath(p, out_dir)
                    except ValueError:
                        continue
                    out.append({"path": rel, "section": "seg_examples", "caption": f"{res['models'].get(key, {}).get('label', key)}"
                                f" (seed {seed}): example segmentation ({p.name})."})
            break
    return out


def _forest_rows(res: Dict[str, Any]) -> Dict[str, List[tuple]]:
    """``{family: [(claim, sign, one interval, example interval)]}`` of the claims with an interval."""
    from .families import by_family

    out: Dict[str, List[tuple]] = {}
    for fam, members in by_family(res.get("claims") or []).items():
        for c in members:
            iv = c.get("intervals") or {}
            one = (iv.get("tests") or {}).get("interval")
            ex = (iv.get("bootstrap") or {}).get("pooled")
            if one or ex:
                out.setdefault(fam, []).append((c, 1.0 if c["higher"] else -1.0, one, ex))
    return out


def verdict_intervals(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    """A forest plot per family: each claim on its own axis (its own units, so a perplexity difference of 200
    does not squeeze an accuracy difference of 1 into a sliver), RPC - baseline oriented so that right of 0
    is the paper's direction, the one 95 % interval over seeds and examples (thick), the example interval
    alone (thin), the margin band around 0 and the target (dashed) where the claim has one, the verdict on
    the right."""
    from .verdict import FAMILIES

    figs = []
    for fam, rows in _forest_rows(res).items():
        plt = pyplot()
        fig, axes = plt.subplots(len(rows), 1, figsize=(8.0, 0.62 * len(rows) + 0.9), squeeze=False)
        for ax, (c, sign, one, ex) in zip(axes[:, 0], rows):
            xs = [0.0]
            for ci, lw, color, off in ((one, 4.0, "C0", 0.08), (ex, 1.3, "C1", -0.18)):
                if ci:
                    lo, hi = sorted((sign * ci["lo"], sign * ci["hi"]))
                    ax.plot([lo, hi], [off, off], color=color, lw=lw, solid_capstyle="butt")
                    ax.plot([sign * ci["diff"]], [off], "o", color=color, ms=4)
                    xs += [lo, hi]
            m = c.get("margin") or 0.0
            if m:
                ax.axvspan(-m, m, color="0.85", lw=0)
            if c.get("target"):
                ax.axvline(c["target"], color="C2", ls="--", lw=1.0)
                xs.append(c["target"])
            ax.axvline(0.0, color="k", lw=0.8)
            span = max(xs) - min(xs) or 1.0
            ax.set_xlim(min(xs) - 0.08 * span, max(xs) + 0.08 * span)
            ax.set_ylim(-0.5, 0.5)
            ax.set_yticks([])
            ax.tick_params(axis="x", labelsize=7, pad=1)
            ax.set_ylabel(c["id"], rotation=0, ha="right", va="center", fontsize=8)
            ax.annotate(c["verdict"], (1.01, 0.5), xycoords="axes fraction", fontsize=8, va="center",
                        weight="bold" if c["verdict"] in ("reproduced", "contradicted") else "normal")
        title = FAMILIES[fam].title if fam in FAMILIES else fam
        axes[0, 0].set_title(f"{title}: RPC − baseline, > 0 = RPC better (each claim in its own units)", fontsize=8)
        fig.subplots_adjust(left=0.16, right=0.84, hspace=0.9)
        p = _save(fig, out_dir, f"forest_{fam}.png")
        figs.append({"path": p, "section": "forest", "caption": (
            f"{title}: each claim's RPC − baseline on its own axis (its units), oriented so that right of 0 is the "
            "paper's direction: the one 95 % interval over seeds and examples (thick, blue), the example interval "
            "alone (thin, orange), ± the margin shaded around 0, the target dashed (green); the verdict on the "
            "right.")})
    return figs


def _frontier_figure(res: Dict[str, Any], out_dir: Path, suite: str, x_metric: str, y_metric: str, labels,
                     name: str, caption: str) -> List[dict]:
    """Per model of ``suite``, ``y_metric`` against ``x_metric``: mean with seed-std error bars in both directions
    (:func:`rpc_attention.report.frontier.frontier_rows`); nothing without both."""
    from .frontier import frontier_rows

    rows = [r for r in frontier_rows(res, suite) if r["stats"][x_metric]["n"] and r["stats"][y_metric]["n"]]
    if not rows:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.4))
    markers = {"baseline": "s", "rpc": "o", "variant": "^"}
    for i, r in enumerate(rows):
        x, y = r["stats"][x_metric], r["stats"][y_metric]
        ax.errorbar([x["mean"]], [y["mean"]], xerr=[x["std"] or 0.0], yerr=[y["std"] or 0.0], fmt=markers.get(r["role"], "o"),
                    color=f"C{i % 10}", capsize=3, ms=6, label=f"{r['label']} (n={x['n']})")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    p = _save(fig, out_dir, name)
    return [{"path": p, "section": "verdicts", "caption": caption}]


def patch_frontier(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    """Clean top-1 (x) against worst-case 1-patch top-1 (y) per model, mean with seed-std error bars in both
    directions; nothing without patch results with clean accuracy."""
    from ..evaluate.patch import CLEAN_TOP1, top1_patches

    return _frontier_figure(res, out_dir, "patch", CLEAN_TOP1, top1_patches(1),
                            ("clean top-1 (%)", "top-1 under the adaptive 1-patch attack (%)"), "patch_frontier.png", (
        "Robustness frontier: clean top-1 against top-1 under the adaptive 1-patch attack (worst case per example), "
        "both on the same test images; mean over seeds with ± one seed standard deviation in each direction. Up "
        "and to the right is better."))


def certify_frontier(res: Dict[str, Any], out_dir: Path) -> List[dict]:
    """Defended clean top-1 (x) against certified top-1 against one patch anywhere (y) per model (the certify
    suite); nothing without certify results."""
    from ..evaluate.certify import certified_metric, defended_metric

    return _frontier_figure(res, out_dir, "certify", defended_metric("patch"), certified_metric("patch"),
                            ("clean top-1 of the defended classifier (%)", "certified top-1, one patch anywhere (%)"),
                            "certify_frontier.png", (
        "Certified frontier: the double-masking classifier's clean top-1 against its certified top-1 against one "
        "patch anywhere, on the same test images; mean over seeds with ± one seed standard deviation in each "
        "direction. Up and to the right is better."))


def make_figures(res: Dict[str, Any], out_dir) -> List[dict]:
    out_dir = Path(out_dir)
    figs: List[dict] = []
    for fn in (verdict_intervals, patch_frontier, certify_frontier, attack_curves, corruption_bars, training_curves, kpca_figures,
               seg_examples):
        try:
            figs.extend(fn(res, out_dir))
        except Exception as exc:  # a figure must never sink the report; the failure is reported
            figs.append({"path": None, "section": "errors", "caption": f"{fn.__name__} failed: {type(exc).__name__}: {exc}"})
    return figs
