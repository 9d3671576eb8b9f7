"""Compare training runs: validation curves of several runs on one figure, and a table of best and
final values (``compare.png``, ``compare.md``, ``compare.json``); ``rpc-attention compare`` and a
study's ``compare`` stage call :func:`compare_runs`."""

from __future__ import annotations

from ..markdown import markdown_table

__all__ = ["compare_runs", "read_curves", "summarise", "lower_is_better", "LOWER_IS_BETTER", "DEFAULT_PRIMARY"]

LOWER_IS_BETTER = ("loss", "ppl", "err", "error", "mce", "bpc")
DEFAULT_PRIMARY = ("acc1", "acc", "miou", "mIoU", "ppl", "macc")


def lower_is_better(metric: str) -> bool:
    m = metric.lower().removeprefix("ema_")
    return any(m == k or m.endswith("_" + k) or m.startswith(k) for k in LOWER_IS_BETTER)


def read_curves(run_dir, split: str = "val"):
    """``(curve records, final records)`` from ``run_dir/metrics.jsonl``: curve records are the
    ``split`` records (``final`` not set) in file order, de-duplicated by epoch (last wins, as a
    resumed run rewrites them); final records are those with ``final: true``."""
    from ..train.rundir import RunDir

    by_epoch, finals = {}, []
    for rec in RunDir(run_dir).read_metrics():
        if rec.get("final"):
            finals.append(rec)
        elif rec.get("split") == split and "epoch" in rec:
            by_epoch[float(rec["epoch"])] = rec
    return [by_epoch[e] for e in sorted(by_epoch)], finals


def summarise(curve, metric: str):
    pts = [(r["epoch"], r[metric]) for r in curve if isinstance(r.get(metric), (int, float))]
    if not pts:
        return None
    pick = min if lower_is_better(metric) else max
    best = pick(pts, key=lambda p: p[1])
    return {"best": best[1], "best_epoch": best[0], "final": pts[-1][1], "final_epoch": pts[-1][0], "points": len(pts)}


def compare_runs(runs, out_dir, metrics=None, labels=None, split: str = "val"):
    """Read the runs, write compare.json / compare.md / compare.png in ``out_dir``; returns the table dict."""
    from pathlib import Path

    from ..files import atomic_write_json, atomic_write_text

    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"{len(labels)} --label given for {len(runs)} runs")
    data = []
    for i, run in enumerate(runs):
        curve, finals = read_curves(run, split)
        label = labels[i] if labels else Path(run).resolve().name
        data.append((label, str(run), curve, finals))
    if metrics is None:
        keys = set()
        for _, _, curve, _ in data:
            for r in curve:
                keys.update(k for k, v in r.items() if isinstance(v, (int, float)))
        primary = next((k for k in DEFAULT_PRIMARY if k in keys), None)
        metrics = [m for m in (primary, "loss") if m is not None and m in keys]
    if not metrics:
        raise ValueError(f"no {split} metrics found in the runs' metrics.jsonl")
    table = {"split": split, "metrics": list(metrics), "runs": []}
    for label, run, curve, finals in data:
        row = {"label": label, "run": run, "epochs": len(curve)}
        for m in metrics:
            row[m] = summarise(curve, m)
        if finals:
            row["final_eval"] = {k: v for k, v in finals[-1].items() if isinstance(v, (int, float)) and k != "final"}
            row["final_eval"]["split"] = finals[-1].get("split")
        table["runs"].append(row)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compare.json", table, sort_keys=False, default=str)
    lines = [f"# Run comparison ({split})", ""]
    head = ["run", "epochs"]
    for m in metrics:
        arrow = "lower better" if lower_is_better(m) else "higher better"
        head += [f"best {m} ({arrow})", "at epoch", f"final {m}"]
    body = []
    for row in table["runs"]:
        cells = [row["label"], str(row["epochs"])]
        for m in metrics:
            s = row[m]
            cells += ["n/a"] * 3 if s is None else [f"{s['best']:.4g}", f"{s['best_epoch']:g}", f"{s['final']:.4g}"]
        body.append(cells)
    lines += markdown_table(head, body)
    fin = [r for r in table["runs"] if "final_eval" in r]
    if fin:
        lines += ["", "Final evaluation (the trainer's last record with `final: true`):", ""]
        for r in fin:
            vals = ", ".join(f"{k} {v:.4g}" for k, v in r["final_eval"].items() if k in metrics)
            lines.append(f"- {r['label']} ({r['final_eval'].get('split')}): {vals or 'n/a'}")
    atomic_write_text(out / "compare.md", "\n".join(lines) + "\n")
    _plot(data, metrics, out / "compare.png", split)
    return table


def _plot(data, metrics, path, split):
    import matplotlib

    from ..files import atomic_savefig

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for i, (label, _, curve, _) in enumerate(data):
            pts = [(r["epoch"], r[m]) for r in curve if isinstance(r.get(m), (int, float))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label, color=f"C{i % 10}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"{split} {m}")
        ax.set_title(f"{split} {m}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        atomic_savefig(fig, path, dpi=110)
    finally:
        plt.close(fig)
