"""PNG figures of a kernel-PCA analysis result (matplotlib Agg, imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from ..files import atomic_savefig, pyplot

__all__ = ["JPROJ_HISTORY_TERMS", "make_figures", "plot_jproj_history"]

# mathtext labels: \varphi is the normalised feature map varphi(x) = phi(x) / g(x) of docs/method.md
JPROJ_HISTORY_TERMS = (("jproj", r"$|J_{proj}|$", "k"), ("phi2", r"$\|\varphi(q)\|^2$", "C0"),
                       ("h2", r"$\|h\|^2$", "C1"))


def _save(fig, path: Path) -> str:
    atomic_savefig(fig, path, dpi=100)
    return path.name


def _finish(plt, fig, path: Path, drawn: bool = True) -> List[str]:
    """Save ``fig`` to ``path`` when something was ``drawn``, close it; the file names written."""
    files = []
    if drawn:
        fig.tight_layout()
        files.append(_save(fig, path))
    plt.close(fig)
    return files


def _short(name: str) -> str:
    return name.replace("blocks.", "b").replace("encoder.layer.", "L").replace(".attention.self", "") \
        .replace(".attn", "").replace("layers.", "L").replace(".attention", "")


def make_figures(result: Dict[str, Any], out_dir: Path) -> List[str]:
    """Write the analysis figures into ``out_dir``; returns the file names written (a figure with
    nothing to show is skipped)."""
    plt = pyplot()
    out_dir = Path(out_dir)
    protos = list(result["protocols"])
    files = []
    for figure in (_jproj_terms, _jproj_history, _gamma_axes, _alignment_layers, _pap_sparse):
        files.extend(figure(plt, result, protos, out_dir))
    return files


def _jproj_terms(plt, result: Dict[str, Any], protos: List[str], out_dir: Path) -> List[str]:
    """J_proj terms per layer."""
    fig, axes = plt.subplots(1, len(protos), figsize=(5.5 * len(protos), 3.8), squeeze=False)
    for ax, proto in zip(axes[0], protos):
        layers = result["protocols"][proto]["layers"]
        xs = range(len(layers))
        for key, label, color in (("log_phi2", r"$\log\|\varphi(q)\|^2$", "C0"), ("log_h2", r"$\log\|h\|^2$", "C1")):
            m = [(l.get(key) or {}).get("mean") for l in layers]
            s = [(l.get(key) or {}).get("std") or 0.0 for l in layers]
            mm = [float("nan") if v is None else v for v in m]
            ax.errorbar(list(xs), mm, yerr=s, marker="o", ms=3, capsize=2, label=label, color=color)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([_short(l["name"]) for l in layers], rotation=60, fontsize=7)
        ax.set_ylabel("natural log (mean ± std over heads, examples)")
        ax.set_title(f"$J_{{proj}}$ terms per layer [{proto}]")
        ax.legend(fontsize=8)
    return _finish(plt, fig, out_dir / "jproj_terms.png")


def _jproj_history(plt, result: Dict[str, Any], protos: List[str], out_dir: Path) -> List[str]:
    """J_proj history over epochs."""
    hist = result.get("history")
    if not hist:
        return []
    fig, axes = plt.subplots(1, len(protos), figsize=(5.5 * len(protos), 3.8), squeeze=False)
    plotted = False
    for ax, proto in zip(axes[0], protos):
        drawn = plot_jproj_history(ax, hist, proto)
        plotted |= drawn
        ax.set_title(f"$J_{{proj}}$ and its terms over training [{proto}]")
        if drawn:
            ax.legend(fontsize=8)
    return _finish(plt, fig, out_dir / "jproj_history.png", plotted)


def _gamma_axes(plt, result: Dict[str, Any], protos: List[str], out_dir: Path) -> List[str]:
    """Gamma differences per axis with controls."""
    fig, axes = plt.subplots(1, len(protos), figsize=(5.5 * len(protos), 3.8), squeeze=False)
    plotted = False
    for ax, proto in zip(axes[0], protos):
        g = result["protocols"][proto]["model"].get("gamma", {})
        for key, color, label in (("learned", "C3", "learned a_hat"), ("perturbed", "C2", "eigvecs + noise, QR"),
                                  ("random", "C7", "random vectors"), ("eigvec", "C0", "true eigenvectors")):
            pa = (g.get(key) or {}).get("per_axis_mean")
            if pa:
                plotted = True
                ax.plot(range(1, len(pa) + 1), [max(v, 1e-30) if v == v else float("nan") for v in pa],
                        color=color, label=label, lw=1.2)
        ax.set_yscale("log")
        ax.set_xlabel("principal axis d")
        ax.set_ylabel("mean |gamma_i - gamma_j|")
        ax.set_title(f"gamma constancy per axis [{proto}]")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _finish(plt, fig, out_dir / "gamma_axes.png", plotted)


def _alignment_layers(plt, result: Dict[str, Any], protos: List[str], out_dir: Path) -> List[str]:
    """Alignment per layer next to chance."""
    metrics = ("optimal_cosine", "linear_cka", "rbf_cka", "direct_cosine")
    chance = result.get("chance", {})
    fig, axes = plt.subplots(len(protos), len(metrics), figsize=(3.4 * len(metrics), 3.0 * len(protos)), squeeze=False)
    plotted = False
    for r, proto in enumerate(protos):
        layers = result["protocols"][proto]["layers"]
        for c, metric in enumerate(metrics):
            ax = axes[r][c]
            m = [(l.get(metric) or {}).get("mean") for l in layers]
            s = [(l.get(metric) or {}).get("std") or 0.0 for l in layers]
            if any(v is not None for v in m):
                plotted = True
            ax.bar(range(len(layers)), [0 if v is None else v for v in m], yerr=s, color="C0", capsize=2)
            for i, ch in enumerate(chance.values()):
                cm = ch[metric]["mean"]
                ax.axhline(cm, color="C3", ls="--", lw=1, label="chance" if i == 0 else None)
            ax.set_xticks(range(len(layers)))
            ax.set_xticklabels([_short(l["name"]) for l in layers], rotation=60, fontsize=6)
            ax.set_title(f"{metric} [{proto}]", fontsize=9)
            lo = min([0.0] + [v for v in m if v is not None])
            ax.set_ylim(min(lo - 0.05, -0.05) if lo < 0 else 0, 1)
            if c == 0 and chance:
                ax.legend(fontsize=7)
    return _finish(plt, fig, out_dir / "alignment_layers.png", plotted)


def _pap_sparse(plt, result: Dict[str, Any], protos: List[str], out_dir: Path) -> List[str]:
    """PAP sparse part."""
    pap = result.get("pap")
    if pap and pap.get("clean"):
        names = list(pap["clean"])
        conds = [c for c in ("clean", "noise", "fgsm") if c in pap]
        fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(names) + 2), 3.5))
        width = 0.8 / len(conds)
        for i, cond in enumerate(conds):
            vals = [pap[cond].get(n, {}).get("rel_norm", 0.0) for n in names]
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=cond)
        ax.set_xticks([j + width * (len(conds) - 1) / 2 for j in range(len(names))])
        ax.set_xticklabels([_short(n) for n in names])
        ax.set_ylabel(r"$\|S\|_F / \|K\|_F$")
        ax.set_title("PAP sparse part per RPC layer")
        ax.legend(fontsize=8)
        return _finish(plt, fig, out_dir / "pap_sparse.png")
    return []


def plot_jproj_history(ax, history: List[Dict[str, Any]], protocol: str) -> bool:
    """Draw |J_proj| and its two terms (the model means the ``jproj`` callback logged at each epoch end,
    ``history`` as :func:`rpc_attention.kpca.runner.load_history` returns it) on ``ax``, log scale.
    Returns whether any point was drawn; the caller titles the axes."""
    drawn = False
    for term, label, color in JPROJ_HISTORY_TERMS:
        key = f"jproj/{protocol}/model/{term}"
        pts = [(r["epoch"], r[key]) for r in history
               if isinstance(r.get(key), (int, float)) and r.get("epoch") is not None]
        if pts:
            drawn = True
            ax.plot([p[0] for p in pts], [abs(p[1]) for p in pts], marker="o", ms=3, color=color, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    return drawn
