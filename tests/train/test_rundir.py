"""The run directory (train.rundir): layout, metrics.jsonl reading (torn and corrupt lines, missing
files named), truncation on resume, prepare; and that every reader of metrics.jsonl goes through it."""

import json

import pytest

from rpc_attention.train.rundir import MetricsLogger, RunDir, RunExistsError

RECORDS = [
    {"step": 1, "epoch": 0.5, "split": "train", "loss": 2.0},
    {"step": 2, "epoch": 1, "split": "val", "loss": 1.5, "acc1": 40.0},
    {"epoch": 1, "split": "jproj", "jproj/exact/model/jproj": 0.25},
    {"step": 3, "epoch": 1.5, "split": "train", "loss": 1.2},
]


def _run(tmp_path, lines, end="\n"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: classification\n")
    (run / "metrics.jsonl").write_text("\n".join(lines) + end)
    return RunDir(run)


def test_layout_names_every_file(tmp_path):
    run = RunDir(tmp_path)
    assert run.config.name == "config.yaml" and run.metrics.name == "metrics.jsonl"
    assert run.weights().name == "model.safetensors" and run.weights(ema=True).name == "model_ema.safetensors"
    assert run.checkpoints.name == "checkpoints" and run.final_metrics.name == "final_metrics.json"
    assert not run.is_run() and not run.holds_files()


def test_read_metrics_in_order_and_by_split(tmp_path):
    run = _run(tmp_path, [json.dumps(r) for r in RECORDS])
    assert run.read_metrics() == RECORDS
    assert [r["step"] for r in run.read_metrics("train")] == [1, 3]
    assert run.read_metrics("jproj") == [RECORDS[2]]


def test_torn_last_line_is_passed_over(tmp_path):
    # a process killed while appending leaves a prefix of a record and no newline after it
    torn = json.dumps(RECORDS[3])[:17]
    run = _run(tmp_path, [json.dumps(r) for r in RECORDS[:3]] + [torn], end="")
    assert run.read_metrics() == RECORDS[:3]


@pytest.mark.parametrize("bad", ['{"step": 2, "lo', "[1, 2]", "garbage"])
def test_corrupt_line_inside_the_file_is_an_error_naming_file_and_line(tmp_path, bad):
    lines = [json.dumps(RECORDS[0]), bad, json.dumps(RECORDS[1])]
    run = _run(tmp_path, lines)
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON object.*delete that line"):
        run.read_metrics()


def test_non_object_last_line_with_newline_is_corrupt_not_torn(tmp_path):
    # a complete line (it ends in a newline) that is not a record is corruption, not a cut-short write
    run = _run(tmp_path, [json.dumps(RECORDS[0]), "[1]"])
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        run.read_metrics()


def test_missing_files_are_named(tmp_path):
    run = RunDir(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        run.read_metrics()
    assert run.read_metrics(missing_ok=True) == []
    with pytest.raises(FileNotFoundError, match=r"holds no training run \(expected .*config\.yaml\)"):
        run.read_config()
    with pytest.raises(FileNotFoundError, match="final_metrics.json"):
        run.read_final_metrics()


def test_truncate_drops_later_records_and_torn_line(tmp_path):
    torn = json.dumps(RECORDS[3])[:10]
    run = _run(tmp_path, [json.dumps(r) for r in RECORDS] + [torn], end="")
    run.truncate_metrics_after(2)
    # records without a step (the jproj callback's) are kept, as before the split into this module
    assert run.read_metrics() == RECORDS[:3]
    assert run.metrics.read_text().endswith("}\n")


def test_logger_appends_records_that_read_back(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for r in RECORDS:
        logger.log(r)
    logger.close()
    assert RunDir(tmp_path).read_metrics() == RECORDS
    MetricsLogger(tmp_path / "other", enabled=False).log(RECORDS[0])
    assert not (tmp_path / "other").exists()


def test_logger_without_tensorboard_writes_the_metrics_and_notes_the_extra(tmp_path, monkeypatch, caplog):
    import logging
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the [tensorboard] extra were not installed
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with caplog.at_level(logging.INFO, logger="rpc_attention"):
        logger = MetricsLogger(tmp_path)
        for r in RECORDS:
            logger.log(r)
        logger.close()
    assert RunDir(tmp_path).read_metrics() == RECORDS and not (tmp_path / "tb").exists()
    notes = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert notes == [(logging.INFO, "no TensorBoard logs (tb/): pip install 'rpc-attention[tensorboard]' to write them")]


def test_prepare_refuses_an_existing_run_and_force_clears_it(tmp_path):
    run = _run(tmp_path, [json.dumps(RECORDS[0])])
    (run.path / "notes.txt").write_text("mine")
    with pytest.raises(RunExistsError, match="--resume .* or --force"):
        run.prepare()
    run.prepare(force=True)
    assert not run.holds_files() and (run.path / "notes.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        run.require_run("resume")


def test_every_metrics_reader_goes_through_the_run_directory(tmp_path):
    """compare, the kpca history, the study report and the train stage all see the same records and
    the same error for a corrupt line."""
    from rpc_attention.kpca.runner import load_history
    from rpc_attention.report.collect import _train_info
    from rpc_attention.report.compare import read_curves

    torn = '{"step": 9'
    run = _run(tmp_path, [json.dumps(r) for r in RECORDS] + [torn], end="")
    curve, finals = read_curves(run.path)
    assert curve == [RECORDS[1]] and finals == []
    assert load_history(run.path) == [RECORDS[2]]
    assert [r.get("step") for r in _train_info(run.path)["curve"]] == [1, 2, None, 3]
    run.metrics.write_text(json.dumps(RECORDS[0]) + "\nnot json\n")
    for read in (lambda: read_curves(run.path), lambda: load_history(run.path), lambda: _train_info(run.path)):
        with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
            read()
