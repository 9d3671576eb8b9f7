"""Config resolution: defaults, overrides (YAML values, open sections, unknown keys), samplers."""

import pytest
import torch

from rpc_attention.train.config import apply_overrides, parse_overrides, resolve_config
from rpc_attention.train.trainer import StepSampler


def test_overrides_parse_yaml_values():
    assert parse_overrides(["a.b=3", "c=[0, 1]", "d=all", "e=1e-3", "f=null", "g=true"]) == [
        ("a.b", 3), ("c", [0, 1]), ("d", "all"), ("e", 1e-3), ("f", None), ("g", True)]
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["nothing"])


def test_apply_overrides_rules():
    cfg = {"train": {"epochs": 1, "ema": {"enabled": False}}, "model": {"kwargs": {}}}
    out = apply_overrides(cfg, [("train.epochs", 5), ("model.kwargs.n_iter", 4), ("train.ema.enabled", True)])
    assert out["train"]["epochs"] == 5 and out["model"]["kwargs"]["n_iter"] == 4 and out["train"]["ema"]["enabled"]
    assert cfg["train"]["epochs"] == 1  # input untouched
    with pytest.raises(ValueError, match="unknown config key 'train.epoch'.*train.epochs"):
        apply_overrides(cfg, [("train.epoch", 2)])
    with pytest.raises(ValueError, match="not a section"):
        apply_overrides(cfg, [("train.epochs.x", 2)])


def test_resolve_fills_dataset_defaults_into_model():
    cfg = resolve_config("fmnist-symvit", ["train.epochs=7", "data.name=mnist5k"])
    assert cfg["train"]["epochs"] == 7
    assert cfg["data"]["mean"] == [0.1307] and cfg["data"]["std"] == [0.3081]
    kw = cfg["model"]["kwargs"]
    assert (kw["num_classes"], kw["in_chans"], kw["img_size"]) == (10, 1, 28)
    # resolving a resolved config is a no-op
    assert resolve_config(base=cfg) == cfg
    with pytest.raises(ValueError, match="unknown task"):
        resolve_config("fmnist-symvit", ["task=nope"])


def test_step_sampler_ranks_partition_global_batches():
    one = StepSampler(40, 8, rank=0, world=1, seed=5)
    two = [StepSampler(40, 8, rank=r, world=2, seed=5) for r in range(2)]
    for s in [one] + two:
        s.set_epoch(3)
    b1 = list(one)
    b2 = [list(s) for s in two]
    assert len(b1) == 5 and all(len(b) == 4 for b in b2[0])
    for step in range(5):
        assert sorted(b2[0][step] + b2[1][step]) == sorted(b1[step])
    # resume inside the epoch yields the remaining batches unchanged
    one.set_epoch(3, start_step=2)
    assert list(one) == b1[2:]
    # each epoch is a permutation; different epochs differ
    idx = [i for b in b1 for (i, e, p) in b]
    assert sorted(idx) == list(range(40))
    one.set_epoch(4)
    assert [i for b in one for (i, e, p) in b] != idx


def test_step_sampler_repeated_augmentation_and_errors():
    s = StepSampler(12, 6, seed=0, repeats=3, positions=False)
    order = s.epoch_order(0)
    assert len(order) == 12 and all((order[i::1][:3] == order[i]).all() for i in range(0, 12, 3))
    with pytest.raises(ValueError, match="divisible"):
        StepSampler(12, 5, world=2)
    with pytest.raises(ValueError, match="fewer than one batch"):
        StepSampler(3, 8)


@pytest.mark.parametrize("power", [0.9, 2.0])
def test_poly_schedule_takes_its_power_from_decay_rate(power):
    from rpc_attention.train.trainer import _build_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = {"schedule": {"name": "poly", "decay_rate": power, "warmup_epochs": 0, "min_lr": 0.0}}
    sched = _build_scheduler(opt, cfg, steps_per_epoch=10, epochs=1)
    sched.step_update(5)  # halfway: lr = (1 - t / T) ** power
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 ** power, rel=1e-6)
