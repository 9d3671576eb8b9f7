"""The study report's training-curve figure: one colour and one legend entry per model, and runs
evaluated once (a one-epoch study) drawn as visible dots per model, not as hidden single markers."""

from rpc_attention.files import pyplot
from rpc_attention.report import figures as F


def _res(val_points):
    models, training = {}, {}
    for m in range(4):
        key = f"model{m}"
        models[key] = {"family": "vision", "label": f"Model {m}", "runs": [f"{key}-s{s}" for s in range(3)],
                       "seeds": [0, 1, 2]}
        for s in range(3):
            curve = [{"split": "train", "step": st, "loss": 2.0 - 0.1 * st - 0.01 * m} for st in range(5)]
            curve += [{"split": "val", "step": 5 * (i + 1), "acc1": 50.0 + m + s + i, "loss": 1.0 - 0.01 * s}
                      for i in range(val_points)]
            training[f"{key}-s{s}"] = {"curve": curve}
    return {"models": models, "training": training}


def test_single_evaluations_are_one_dot_per_seed_grouped_by_model():
    plt = pyplot()
    res = _res(val_points=1)
    fig = F._training_figure(plt, res, [r for m in res["models"].values() for r in m["runs"]])
    try:
        assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"Model {m}" for m in range(4)]
        train_ax, val_ax, _ = fig.axes[:3]
        assert len(train_ax.get_lines()) == 12 and train_ax.get_legend() is None
        xs = sorted(float(x) for c in val_ax.collections for x, _ in c.get_offsets())
        assert xs == [0.0] * 3 + [1.0] * 3 + [2.0] * 3 + [3.0] * 3
        assert [t.get_text() for t in val_ax.get_xticklabels()] == [f"Model {m}" for m in range(4)]
    finally:
        plt.close(fig)


def test_repeated_evaluations_are_lines_coloured_per_model():
    plt = pyplot()
    res = _res(val_points=3)
    fig = F._training_figure(plt, res, [r for m in res["models"].values() for r in m["runs"]])
    try:
        lines = fig.axes[1].get_lines()
        assert len(lines) == 12 and all(len(line.get_xdata()) == 3 for line in lines)
        assert len({line.get_color() for line in lines}) == 4
    finally:
        plt.close(fig)
