"""kpca.plots.plot_jproj_history: the one J_proj-over-training drawing (rpc-attention analyze and the
study report both call it)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rpc_attention.kpca.plots import plot_jproj_history

HISTORY = [
    {"epoch": 1, "split": "jproj", "jproj/exact/model/jproj": -0.5, "jproj/exact/model/phi2": 2.0,
     "jproj/exact/model/h2": 2.5},
    {"epoch": 2, "split": "jproj", "jproj/exact/model/jproj": 0.25, "jproj/exact/model/phi2": None,
     "jproj/exact/model/h2": 1.75},
]


def test_draws_absolute_values_of_each_term_per_epoch_on_a_log_axis():
    fig, ax = plt.subplots()
    try:
        assert plot_jproj_history(ax, HISTORY, "exact")
        lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
        assert lines == {r"$|J_{proj}|$": ([1, 2], [0.5, 0.25]), r"$\|\varphi(q)\|^2$": ([1], [2.0]),
                         r"$\|h\|^2$": ([1, 2], [2.5, 1.75])}
        assert ax.get_yscale() == "log" and ax.get_xlabel() == "epoch"
        assert not plot_jproj_history(ax, HISTORY, "paper")  # nothing logged for that protocol
    finally:
        plt.close(fig)
