"""`rpc-attention compare` on two fake metrics.jsonl files."""

import json

from rpc_attention.cli import main
from rpc_attention.report.compare import compare_runs, lower_is_better, read_curves


def _write(run, recs):
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def _fake(tmp_path):
    a, b = tmp_path / "vit", tmp_path / "scaled-s"
    _write(a, [
        {"step": 10, "epoch": 0.5, "split": "train", "loss": 2.0},
        {"step": 20, "epoch": 1, "split": "val", "loss": 1.0, "acc1": 60.0},
        {"step": 40, "epoch": 2, "split": "val", "loss": 0.8, "acc1": 70.0},
        {"step": 60, "epoch": 3, "split": "val", "loss": 0.9, "acc1": 68.0},
        {"step": 60, "epoch": 3, "split": "test", "final": True, "loss": 0.95, "acc1": 67.5},
    ])
    _write(b, [
        {"step": 20, "epoch": 1, "split": "val", "loss": 1.2, "acc1": 55.0},
        {"step": 40, "epoch": 2, "split": "val", "loss": 0.7, "acc1": 72.0},
        {"step": 40, "epoch": 2, "split": "val", "loss": 0.6, "acc1": 73.0},  # resumed run rewrote epoch 2
        {"epoch": 2, "split": "jproj", "jproj/exact/model/jproj": 0.1},
    ])
    return a, b


def test_lower_is_better():
    assert lower_is_better("loss") and lower_is_better("ema_loss") and lower_is_better("ppl")
    assert not lower_is_better("acc1") and not lower_is_better("miou")


def test_read_curves_dedupes_epochs(tmp_path):
    _, b = _fake(tmp_path)
    curve, finals = read_curves(b)
    assert [r["epoch"] for r in curve] == [1, 2] and curve[1]["acc1"] == 73.0 and finals == []


def test_compare_table_and_files(tmp_path):
    a, b = _fake(tmp_path)
    out = tmp_path / "cmp"
    table = compare_runs([a, b], out)
    assert table["metrics"] == ["acc1", "loss"]
    ra, rb = table["runs"]
    assert ra["label"] == "vit" and ra["acc1"] == {"best": 70.0, "best_epoch": 2, "final": 68.0, "final_epoch": 3, "points": 3}
    assert ra["loss"]["best"] == 0.8 and ra["loss"]["best_epoch"] == 2 and ra["loss"]["final"] == 0.9
    assert ra["final_eval"]["acc1"] == 67.5 and ra["final_eval"]["split"] == "test"
    assert rb["acc1"]["best"] == 73.0 and rb["loss"]["best"] == 0.6 and "final_eval" not in rb
    md = (out / "compare.md").read_text()
    assert "| vit | 3 | 70 | 2 | 68 | 0.8 | 2 | 0.9 |" in md
    assert json.loads((out / "compare.json").read_text())["runs"][1]["label"] == "scaled-s"
    assert (out / "compare.png").stat().st_size > 1000


def test_compare_cli_errors(tmp_path, capsys):
    a, _ = _fake(tmp_path)
    assert main(["compare", str(a), str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert main(["compare", str(a), "--out", str(tmp_path / "o"), "--label", "x", "--label", "y"]) == 2
    assert main(["compare", str(a), "--out", str(tmp_path / "o"), "--metric", "nope"]) == 0  # n/a row, no crash
    assert "n/a" in (tmp_path / "o" / "compare.md").read_text()
    # an earlier comparison in --out is kept unless --force
    (tmp_path / "o" / "compare.json").write_text("EARLIER")
    assert main(["compare", str(a), "--out", str(tmp_path / "o")]) == 2
    assert "already holds a comparison" in capsys.readouterr().err
    assert (tmp_path / "o" / "compare.json").read_text() == "EARLIER"
    assert main(["compare", str(a), "--out", str(tmp_path / "o"), "--force"]) == 0
    assert json.loads((tmp_path / "o" / "compare.json").read_text())["runs"]
