"""The report's table of S precision / recall on the corrupted keys (the sparse suite's recorded metrics)."""

from rpc_attention.report.sparsity import render_sparse_corruption


def _record(top1, support):
    metrics = {"mean_top1_keys": top1}
    for setting, (p, r) in support.items():
        metrics[f"s_precision_{setting}"], metrics[f"s_recall_{setting}"] = p, r
    return {"metrics": metrics, "n_examples": 10, "protocol": "fake",
            "rows": [{"corruption": "key corruption", "level": "5%", "top1": top1}]}


def test_support_table_averages_seeds_and_orders_the_dose_response():
    res = {"models": {"sym": {"label": "SymViT"}, "rob": {"label": "robust"}},
           "evals": {"sparse": {
               "sym": {"0": _record(50.0, {})},
               "rob": {"0": _record(70.0, {"keys@5%x100std": (0.9, 1.0), "keys@5%x5std": (0.8, 0.5)}),
                       "1": _record(72.0, {"keys@5%x100std": (0.7, 1.0), "keys@5%x5std": (0.6, 0.7)})}}}}
    md = "\n".join(render_sparse_corruption(res))
    table = md[md.index("**S on the corrupted keys**"):]
    assert "| setting | robust |" in table and "SymViT" not in table  # only models that recorded S
    lines = [line for line in table.splitlines() if line.startswith("| keys@")]
    assert lines == ["| keys@5%x5std | 0.70 / 0.60 |", "| keys@5%x100std | 0.80 / 1.00 |"]


def test_no_support_table_without_pap_in_block_1():
    res = {"models": {"sym": {"label": "SymViT"}}, "evals": {"sparse": {"sym": {"0": _record(50.0, {})}}}}
    assert "S on the corrupted keys" not in "\n".join(render_sparse_corruption(res))
