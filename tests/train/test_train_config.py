"""Config resolution: defaults, overrides (YAML values, open sections, unknown keys), samplers."""

import re

import pytest
import torch

from rpc_attention.train.config import (
    DEFAULTS,
    TrainConfig,
    apply_overrides,
    list_presets,
    load_preset,
    parse_overrides,
    resolve_config,
)
from rpc_attention.train.trainer import StepSampler


def test_overrides_parse_yaml_values():
    assert parse_overrides(["a.b=3", "c=[0, 1]", "d=all", "e=1e-3", "f=null", "g=true"]) == [
        ("a.b", 3), ("c", [0, 1]), ("d", "all"), ("e", 1e-3), ("f", None), ("g", True)]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides(["nothing"])


def test_apply_overrides_rules():
    cfg = {"train": {"epochs": 1, "ema": {"enabled": False}}, "model": {"kwargs": {}}}
    out = apply_overrides(cfg, [("train.epochs", 5), ("model.kwargs.n_iter", 4), ("train.ema.enabled", True)])
    assert out["train"]["epochs"] == 5 and out["model"]["kwargs"]["n_iter"] == 4 and out["train"]["ema"]["enabled"]
    assert cfg["train"]["epochs"] == 1  # input untouched
    with pytest.raises(ValueError, match="unknown config key 'train.epoch'.*did you mean train.epochs"):
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
    cfg = TrainConfig.from_dict({"schedule": {"name": "poly", "decay_rate": power, "warmup_epochs": 0, "min_lr": 0.0}})
    sched = _build_scheduler(opt, cfg.schedule, steps_per_epoch=10, epochs=1)
    sched.step_update(5)  # halfway: lr = (1 - t / T) ** power
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 ** power, rel=1e-6)


def test_defaults_have_one_owner_the_typed_config():
    # DEFAULTS is the dict form of the dataclasses; the EMA decay is DeiT's 0.99996 (the trainer
    # once fell back to 0.9999 when a config lacked the key)
    assert TrainConfig.from_dict(DEFAULTS) == TrainConfig()
    assert TrainConfig.from_dict({"train": {"ema": {"enabled": True}}}).train.ema.decay == DEFAULTS["train"]["ema"]["decay"] == 0.99996
    assert TrainConfig.from_dict({}).to_dict() == DEFAULTS


@pytest.mark.parametrize("name", [n for n, _ in list_presets()])
def test_every_preset_reads_as_a_typed_config(name):
    raw = load_preset(name)
    cfg = TrainConfig.from_dict(raw)
    assert cfg.task == raw.get("task", "classification")
    for section in ("optim", "schedule", "train", "eval"):
        for key, value in (raw.get(section) or {}).items():
            have = getattr(getattr(cfg, section), key, None)
            if have is None:
                have = getattr(cfg, section).extra.get(key)
            assert have == value or (key == "ema" and have == TrainConfig.from_dict({"train": {"ema": value}}).train.ema)


@pytest.mark.parametrize("override,needle", [
    ("train.epochs=three", "train.epochs: expected an integer, got 'three'"),
    ("train.amp=fp8", "train.amp: expected one of"),
    ("optim.lr=fast", "optim.lr: 'fast' is not a number"),
    ("train.ema.enabled=maybe", "train.ema.enabled: expected true or false"),
    ("train.callbacks=jproj", "train.callbacks: expected a list"),
])
def test_override_of_the_wrong_type_names_the_key(override, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        resolve_config("fmnist-symvit", [override])


def test_typed_values_reach_the_config():
    cfg = resolve_config("fmnist-symvit", ["optim.lr=2.5e-4", "schedule.min_lr=1/100000", "train.ema.enabled=true"])
    typed = TrainConfig.from_dict(cfg)
    assert typed.optim.lr == 2.5e-4 and typed.schedule.min_lr == 1e-5 and typed.train.ema.enabled
    assert typed.data.extra["val_size"] == 5000  # a task key lives in the section's extra


def test_task_options_is_not_an_open_section():
    # it was accepted by --set and read by no one
    with pytest.raises(ValueError, match="unknown config key 'task_options.x'"):
        resolve_config("fmnist-symvit", ["task_options.x=1"])


def test_primary_metric_has_one_default():
    from rpc_attention.train.tasks import DEFAULT_PRIMARY_METRIC, get_task, primary_metric

    assert primary_metric(object()) == DEFAULT_PRIMARY_METRIC == "acc1"
    assert primary_metric(get_task("classification")) == "acc1"
    assert primary_metric(get_task("lm")) == "ppl"


def test_lm_preset_run_length_is_train_max_steps(tmp_path):
    # `--set train.max_steps=30` on an LM preset once trained the preset's 600 steps: the LM presets
    # read a second name for the same setting (train.steps). One name now, and it takes effect.
    cache = f"data.cache_dir={tmp_path}"
    cfg = resolve_config("wiki-rpc-symlm", ["train.max_steps=30", cache])
    assert cfg["train"]["max_steps"] == 30 and cfg["train"]["epochs"] == 1
    assert resolve_config("wiki-rpc-symlm", [cache])["train"]["max_steps"] == 600
    with pytest.raises(ValueError, match=r"unknown config key 'train.steps'.*did you mean train.max_steps"):
        resolve_config("wiki-rpc-symlm", ["train.steps=30", cache])


def test_lm_derived_epochs_given_differently_is_an_error(tmp_path):
    cache = f"data.cache_dir={tmp_path}"
    with pytest.raises(ValueError, match=r"train.epochs=7 and train.max_steps=600 are both set"):
        resolve_config("wiki-rpc-symlm", ["train.epochs=7", cache])
    with pytest.raises(ValueError, match=r"schedule.warmup_epochs=2 and schedule.warmup_steps=50"):
        resolve_config("wiki-rpc-symlm", ["schedule.warmup_epochs=2", cache])
    # by epochs instead of steps
    cfg = resolve_config("wiki-rpc-symlm", ["train.max_steps=null", "train.epochs=3", cache])
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["max_steps"] is None
    # a resolved config resolves to itself (resume), and a run config written with the old name still resumes
    full = resolve_config("wiki-rpc-symlm", [cache])
    assert resolve_config(base=full) == full
    old = {**full, "train": {**{k: v for k, v in full["train"].items() if k != "max_steps"}, "steps": 600}}
    assert resolve_config(base=old) == full


@pytest.mark.parametrize("section,key,value,suggest", [
    ("train", "steps", 30, "train.max_steps"),          # a renamed setting
    ("data", "val_sise", 10, "data.val_size"),           # a task key (a section's extra) misspelt
    ("data", "kwargs", {"x": 1}, None),                   # a section nobody reads
    ("train", "mixup", {"mixup": 0.5, "cutmx": 1.0}, "train.mixup.cutmix"),
])
def test_a_preset_key_nobody_reads_is_an_error(tmp_path, section, key, value, suggest):
    import yaml

    raw = load_preset("fmnist-symvit")
    raw.setdefault(section, {})[key] = value
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=rf"preset {re.escape(str(path))}: {section}\.{key}.*no code reads it") as e:
        resolve_config(str(path))
    if suggest:
        assert f"did you mean {suggest}" in str(e.value)


@pytest.mark.parametrize("override,needle", [
    ("data.augment.flp=true", "did you mean data.augment.flip"),
    ("data.kwargs.x=1", "unknown config key 'data.kwargs.x'"),
])
def test_an_override_nobody_reads_is_an_error(override, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        resolve_config("fmnist-symvit", [override])


def test_a_declared_key_without_a_default_can_be_set():
    cfg = resolve_config("fmnist-symvit", ["data.name=mnist5k", "data.test_size=500", "data.augment.reprob=0.1"])
    assert cfg["data"]["test_size"] == 500 and cfg["data"]["augment"]["reprob"] == 0.1


@pytest.mark.parametrize("preset,override,needle", [
    ("wiki-rpc-symlm", "data.img_size=32", "data.img_size=32: the lm task does not read it"),
    ("wiki-rpc-symlm", "data.augment.flip=true", "unknown config key 'data.augment.flip'"),
    ("fmnist-symvit", "schedule.decay_rate=0.5", "schedule.decay_rate=0.5 has no effect with schedule.name='cosine'"),
    ("fmnist-symvit", "schedule.decay_epochs=3", "schedule.decay_epochs=3 has no effect"),
])
def test_a_setting_without_effect_is_an_error(tmp_path, preset, override, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        resolve_config(preset, [override, f"data.cache_dir={tmp_path}"] if preset.startswith("wiki") else [override])
    # the same settings where they do act
    if "decay_rate" in override:
        assert resolve_config(preset, ["schedule.name=poly", override])["schedule"]["decay_rate"] == 0.5


def test_a_callback_setting_counts_only_where_the_callback_runs():
    import rpc_attention.kpca

    rpc_attention.kpca.register_callbacks()  # the jproj callback and the key it reads

    cfg = resolve_config("fmnist-symvit", ["train.callbacks=[jproj]", "train.jproj_examples=4"])
    assert cfg["train"]["jproj_examples"] == 4
    assert resolve_config("fmnist-symvit", ["train.sparsity_examples=16"])["train"]["sparsity_examples"] == 16
    with pytest.raises(ValueError, match=re.escape("train.jproj_examples is read by the jproj callback, which "
                                                   "this run does not run (--set train.callbacks=[jproj])")):
        resolve_config("fmnist-symvit", ["train.jproj_examples=4"])
