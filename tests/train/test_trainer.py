"""Trainer: learning, run-dir contract, load_run, refusal/force, exact resume after SIGKILL, corrupt
checkpoints, NaN stop."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rpc_attention.train import RunExistsError, TrainingDiverged, load_run, run_training
from rpc_attention.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, verify_checkpoint

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import slowtask  # noqa: E402  (registers "slow_classification")


def _records(run, split="train"):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def _weights(path):
    return load_file(str(path))


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_trains_loss_decreases_and_writes_run_dir(tmp_path, tiny_cfg):
    run = run_training(tiny_cfg(epochs=4), tmp_path / "run")
    losses = [r["loss"] for r in _records(run)]
    assert len(losses) == 4 * 8
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.2
    for f in ("config.yaml", "model.safetensors", "metrics.jsonl", "final_metrics.json"):
        assert (run / f).is_file(), f
    assert any((run / "tb").iterdir())
    rec = _records(run)[-1]
    assert {"step", "epoch", "loss", "acc", "lr", "images_per_s"} <= set(rec)
    assert len(_records(run, "val")) == 4
    final = json.loads((run / "final_metrics.json").read_text())
    assert final["split"] == "test" and final["n"] == 128 and final["acc1"] > 20
    # checkpoints: the last two, atomic, verified
    ckpts = list_checkpoints(run / "checkpoints")
    assert [p.name for p in ckpts] == ["step_00000028", "step_00000032"]
    assert verify_checkpoint(ckpts[-1])["step"] == 32
    # load_run rebuilds the model from config.yaml with the final weights, eval mode
    model, cfg = load_run(run)
    assert not model.training and cfg["model"]["name"] == "rpc_symvit_tiny_patch16_224"
    assert cfg["data"]["mean"] == [0.286] and cfg["model"]["kwargs"]["num_classes"] == 10
    assert _same({k: v for k, v in model.state_dict().items()}, _weights(run / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="EMA"):
        load_run(run, ema=True)
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        load_run(tmp_path)
    # an existing run is refused, --force starts over
    with pytest.raises(RunExistsError, match="--resume"):
        run_training(tiny_cfg(epochs=1), run)
    run_training(tiny_cfg(epochs=1, save_every=0), run, force=True)
    assert len(_records(run)) == 8 and [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000008"]


@pytest.mark.xdist_group("train-subprocess")
def test_sigkill_then_resume_is_bit_identical(tmp_path, tiny_cfg):
    import yaml

    cfg = tiny_cfg(epochs=3, save_every=3, ema={"enabled": True, "decay": 0.9})
    cfg["task"] = "slow_classification"
    cfg["train"]["mixup"] = {"mixup": 0.8, "cutmix": 1.0, "label_smoothing": 0.1}
    cfg["model"]["kwargs"]["drop_path_rate"] = 0.1  # exercises the training RNG
    # reference: uninterrupted
    ref = run_training(cfg, tmp_path / "ref")
    # killed: a subprocess (slowed down) SIGKILLed after its second checkpoint
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    script = (f"import sys, yaml; sys.path.insert(0, {str(HERE)!r}); import slowtask\n"
              f"from rpc_attention.train import run_training\n"
              f"run_training(yaml.safe_load(open({str(tmp_path / 'cfg.yaml')!r})), {str(tmp_path / 'killed')!r})\n")
    env = dict(os.environ, RPC_TEST_STEP_SLEEP="0.15", RPC_ATTENTION_NO_PROGRESS="1")
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    ckroot = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if len(list_checkpoints(ckroot)) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    killed = tmp_path / "killed"
    assert not (killed / "model.safetensors").exists()
    done = max(int(p.name[5:]) for p in list_checkpoints(ckroot))
    assert 3 <= done < 24
    # resume in this process (no sleep) and compare with the uninterrupted run
    run_training(None, killed, resume=True)
    assert _same(_weights(ref / "model.safetensors"), _weights(killed / "model.safetensors"))
    assert _same(_weights(ref / "model_ema.safetensors"), _weights(killed / "model_ema.safetensors"))
    steps = [r["step"] for r in _records(killed)]
    assert steps == list(range(1, 25))  # records written after the checkpoint by the killed run were dropped
    assert [r["loss"] for r in _records(killed)] == [r["loss"] for r in _records(ref)]


def test_resume_drops_the_callback_records_of_an_epoch_ended_after_the_checkpoint(tmp_path, tiny_cfg):
    """A run killed after an epoch's end but before its next checkpoint has logged that epoch's callback
    records; the resumed run logs them again, so they must go with the rest of what followed the checkpoint."""

    def probe(model, cfg, epoch, run_dir, logger):
        logger.log({"epoch": epoch, "split": "probe"})  # no step of its own, as the jproj callback's

    def rows(run):
        return [(r["split"], r.get("step"), r["epoch"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    run = run_training(tiny_cfg(epochs=2, save_every=5), tmp_path / "run", callbacks=[("probe", probe)])
    ref = rows(run)
    assert ("probe", 8, 1) in ref and ("probe", 16, 2) in ref  # stamped with the epoch's last step
    ckpts = list_checkpoints(run / "checkpoints")
    assert [p.name for p in ckpts] == ["step_00000015", "step_00000016"]
    shutil.rmtree(ckpts[-1])  # as if killed after epoch 2's end (step 16) and before its checkpoint
    (run / "model.safetensors").unlink()
    run_training(None, run, resume=True, callbacks=[("probe", probe)])
    assert rows(run) == ref


def test_a_corrupt_checkpoint_is_one_warning_with_one_prefix(tmp_path, caplog):
    """The fallback's warning is a log record at WARNING whose text has no "warning:" of its own: the command
    line's handler adds the one prefix (it printed "warning: warning: ..." when the text carried it too)."""
    from rpc_attention.cli import _Formatter

    root = tmp_path / "checkpoints"
    (root / "step_00000001").mkdir(parents=True)
    (root / "step_00000001" / "meta.json").write_text(json.dumps({"files": {}}))
    (root / "step_00000002").mkdir()  # no meta.json: an interrupted write
    expected = (f"checkpoint {root / 'step_00000002'} is incomplete: meta.json is missing; "
                "falling back to the previous checkpoint")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rpc_attention"):
        assert latest_checkpoint(root) == root / "step_00000001"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.getMessage() == expected
    assert _Formatter("%(message)s").format(record) == f"warning: {expected}"
    told = []
    assert latest_checkpoint(root, warn=told.append) == root / "step_00000001"
    assert told == [expected]


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path, tiny_cfg, caplog):
    cfg = tiny_cfg(epochs=2, save_every=5)
    run = run_training(cfg, tmp_path / "run")
    ref = _weights(run / "model.safetensors")
    ckpts = list_checkpoints(run / "checkpoints")
    assert [p.name for p in ckpts] == ["step_00000015", "step_00000016"]
    f = ckpts[-1] / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])  # truncate the newest checkpoint
    with pytest.raises(CheckpointError, match="step_00000016.*truncated"):
        verify_checkpoint(ckpts[-1])
    (run / "model.safetensors").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rpc_attention"):
        run_training(None, run, resume=True)  # continues from step 15, redoes step 16
    err = caplog.text
    assert "step_00000016" in err and "falling back" in err and "from step_00000015" in err
    assert _same(ref, _weights(run / "model.safetensors"))
    # every checkpoint corrupt -> a clear error
    for p in list_checkpoints(run / "checkpoints"):
        (p / "state.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        run_training(None, run, resume=True)


def test_resume_before_the_first_checkpoint_equals_a_fresh_start(tmp_path, tiny_cfg):
    """A run killed before its first checkpoint leaves only config.yaml (and metrics lines); resuming it
    starts from step 0 seeded exactly as a fresh start, so it ends with the fresh run's weights."""
    cfg = tiny_cfg(epochs=1, save_every=0)
    cfg["model"]["kwargs"]["drop_path_rate"] = 0.1  # the training RNG matters
    ref = run_training(cfg, tmp_path / "ref")
    for name in ("checkpoints", "model.safetensors", "final_metrics.json", "tb"):
        if (ref / name).is_dir():
            shutil.rmtree(ref / name)
        else:
            (ref / name).unlink()
    fresh = run_training(cfg, tmp_path / "fresh")
    run_training(None, ref, resume=True)
    assert _same(_weights(fresh / "model.safetensors"), _weights(ref / "model.safetensors"))
    assert [r["loss"] for r in _records(ref)] == [r["loss"] for r in _records(fresh)]


def _diverging_run(cfg, run, nan_from, message):
    """Train ``cfg`` with the loss NaN from the ``nan_from``-th step on; expect TrainingDiverged(``message``)."""
    cfg["task"] = "slow_classification"
    slowtask.TASK.calls, slowtask.TASK.nan_from = 0, nan_from
    try:
        with pytest.raises(TrainingDiverged, match=message):
            run_training(cfg, run)
    finally:
        slowtask.TASK.nan_from = None


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_cfg):
    run = tmp_path / "run"
    _diverging_run(tiny_cfg(epochs=2, save_every=2), run, 5, r"step 5 \(epoch 1\).*step_00000004")
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000002", "step_00000004"]
    verify_checkpoint(run / "checkpoints" / "step_00000004")
    assert not (run / "model.safetensors").exists()
    w = _weights(run / "checkpoints" / "step_00000004" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in w.values())


def test_nan_between_logs_is_found_at_the_next_log_and_named_by_its_step(tmp_path, tiny_cfg):
    """Losses are tested only when the trainer logs (no host sync per step), yet the error names the
    first bad step and nothing computed after it is logged or saved."""
    run = tmp_path / "run"
    _diverging_run(tiny_cfg(epochs=2, save_every=0, log_every=4), run, 5,
                   r"loss is nan at step 5 \(epoch 1\).*no checkpoint was saved")
    assert [r["step"] for r in _records(run)] == [4] and list_checkpoints(run / "checkpoints") == []
    assert slowtask.TASK.calls == 8  # it ran to the next log point (step 8), not beyond


def test_resume_with_longer_schedule(tmp_path, tiny_cfg):
    run = run_training(tiny_cfg(epochs=1, save_every=0), tmp_path / "run")
    run_training(None, run, resume=True, overrides=["train.epochs=2"])
    assert [r["step"] for r in _records(run)] == list(range(1, 17))
    import yaml
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["epochs"] == 2
    lrs = [r["lr"] for r in _records(run)]
    assert lrs[8] > lrs[15]  # the cosine was rebuilt for 2 epochs (not stuck at the 1-epoch minimum)


def test_run_training_builds_the_typed_config_once(tmp_path, tiny_cfg, monkeypatch):
    """The typed view is built once from the resolved dict and handed down: besides the type check of the
    user's values before the task fills in its derived keys, run_training parses the config once."""
    from rpc_attention.train import config as config_mod

    original = config_mod.TrainConfig.from_dict.__func__
    calls = []

    def counting(cls, cfg):
        calls.append(cfg)
        return original(cls, cfg)

    monkeypatch.setattr(config_mod.TrainConfig, "from_dict", classmethod(counting))
    run = run_training(tiny_cfg(epochs=1, max_steps=2, save_every=100), tmp_path / "run")
    assert len(calls) == 2  # the check before the task's finalize_config, the typed view after it
    assert calls[-1]["data"]["mean"] == [0.286]  # the typed view is of the final (finalized) dict
    calls.clear()
    cfg, typed = config_mod.resolve_typed_config(base=tiny_cfg())
    assert len(calls) == 2 and typed == original(config_mod.TrainConfig, cfg)
    assert (run / "model.safetensors").is_file()
