"""`rpc-attention train` / `presets` command line: clear one-line errors with exit code 2."""

import pytest

from rpc_attention.cli import main
from rpc_attention.train.config import list_presets, resolve_config

FMNIST = ["fmnist-symvit", "fmnist-rpc-symvit", "fmnist-rpc-symvit-all", "fmnist-scaled-s", "fmnist-scaled-alpha",
          "fmnist-vit"]
IMAGENET = ["imagenet-symvit-tiny", "imagenet-rpc-symvit-tiny-6iter-layer1", "imagenet-rpc-symvit-tiny-4iter-layer1",
            "imagenet-rpc-symvit-tiny-2iter-all", "imagenet-rpc-symvit-base-2iter-all", "imagenet-scaled-s",
            "imagenet-scaled-alpha", "imagenet-fan-tiny", "imagenet-symfan-tiny", "imagenet-rpc-fan-tiny"]


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


def test_presets_lists_one_line_each(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    names = [line.split()[0] for line in lines]
    assert set(FMNIST + IMAGENET) <= set(names)
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # every preset has a description


def test_bad_data_path_is_exit_2_one_line(tmp_path, capsys):
    rc = main(["train", "--preset", "fmnist-symvit", "--out", str(tmp_path / "r"), "--set", f"data.root={tmp_path}/nope"])
    err = _err(capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "dataset-fashion-mnist" in err and "nope" in err
    rc = main(["train", "--preset", "imagenet-symvit-tiny", "--out", str(tmp_path / "i"), "--set",
               f"data.root={tmp_path}/imnet"])
    err = _err(capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "imnet/train" in err


@pytest.mark.parametrize("args,needle", [
    (["--set", "train.epochz=3"], "train.epochz"),
    (["--set", "bogus=1"], "bogus"),
    (["--set", "train.epochs"], "KEY=VALUE"),
    (["--set", "model.kwargs.rpc_layers=[99]"], "rpc_layers index 99"),
    (["--set", "model.kwargs.n_iter=0"], "n_iter"),
    (["--set", "train.ema=3"], "train.ema is a section"),
])
def test_bad_set_is_exit_2(tmp_path, capsys, args, needle):
    rc = main(["train", "--preset", "fmnist-rpc-symvit", "--out", str(tmp_path / "r"), "--set",
               "data.train_subset=128", "--set", "train.max_steps=1"] + args)
    err = _err(capsys)
    assert rc == 2, err
    assert needle in err and len(err.splitlines()) == 1


def test_usage_errors(tmp_path, capsys):
    assert main(["train", "--preset", "no-such-preset", "--out", str(tmp_path)]) == 2
    assert "unknown preset" in _err(capsys)
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "config.yaml" in _err(capsys)
    assert main(["train", "--preset", "fmnist-symvit"]) == 2
    assert "--run DIR is required" in _err(capsys)


def test_existing_run_refused_without_resume_or_force(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("task: classification\n")
    rc = main(["train", "--preset", "fmnist-symvit", "--out", str(tmp_path)])
    assert rc == 2 and "already holds a run" in _err(capsys)


def test_print_config_resolves_overrides(capsys):
    assert main(["train", "--preset", "fmnist-rpc-symvit", "--print-config", "--set", "model.kwargs.n_iter=4",
                 "--set", "model.kwargs.new_kw=1"]) == 0
    out = capsys.readouterr().out
    assert "n_iter: 4" in out and "new_kw: 1" in out


@pytest.mark.parametrize("name", FMNIST + IMAGENET)
def test_every_preset_resolves_and_builds(name):
    import timm
    import torch

    import rpc_attention.models  # noqa: F401  (registers the models; run alone, nothing else did)

    cfg = resolve_config(name)
    assert cfg["task"] == "classification" and cfg["model"]["name"]
    kw = dict(cfg["model"]["kwargs"])
    if name.startswith("imagenet"):
        assert cfg["data"]["img_size"] == 224 and cfg["train"]["batch_size"] == 1024
        assert cfg["train"]["epochs"] == 300 and cfg["train"]["mixup"]["mixup"] == 0.8
        kw.update(depth=1, img_size=32)  # build a cheap 1-block version of the same family
    m = timm.create_model(cfg["model"]["name"], **kw)
    if name.startswith("fmnist"):
        with torch.no_grad():
            assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_preset_rpc_settings():
    k = resolve_config("fmnist-rpc-symvit")["model"]["kwargs"]
    assert (k["rpc_layers"], k["n_iter"], k["lambd"]) == ([0], 6, 4.0)
    k = resolve_config("fmnist-rpc-symvit-all")["model"]["kwargs"]
    assert (k["rpc_layers"], k["n_iter"]) == ("all", 2)
    k = resolve_config("imagenet-rpc-symvit-tiny-4iter-layer1")["model"]["kwargs"]
    assert (k["rpc_layers"], k["n_iter"]) == ([0], 4)
    c = resolve_config("imagenet-rpc-symvit-base-2iter-all")
    assert c["optim"]["clip_grad"] == 1.0 and c["model"]["name"] == "rpc_symvit_base_patch16_224"
    assert [n for n, _ in list_presets()] == sorted(n for n, _ in list_presets())


def test_fan_presets_follow_the_authors():
    k = resolve_config("fmnist-rpc-fan")["model"]["kwargs"]
    assert (k["rpc_layers"], k["n_iter"], k["lambd"], k["patch_size"]) == ([0], 4, 4.0, 4)
    assert "rpc_layers" not in resolve_config("fmnist-symfan")["model"]["kwargs"]
    for name in ("imagenet-fan-tiny", "imagenet-symfan-tiny", "imagenet-rpc-fan-tiny"):
        c = resolve_config(name)
        assert (c["optim"]["lr"], c["optim"]["lr_scale_batch"], c["optim"]["weight_decay"]) == (2e-3, None, 0.05)
        assert c["train"]["ema"] == {"enabled": True, "decay": 0.99992}
        assert c["train"]["mixup"]["cutmix"] == 1.0 and c["train"]["mixup"]["label_smoothing"] == 0.1
        assert c["data"]["augment"]["reprob"] == 0.25 and c["model"]["kwargs"]["drop_path_rate"] == 0.0
    k = resolve_config("imagenet-rpc-fan-tiny")["model"]["kwargs"]
    assert (k["rpc_layers"], k["n_iter"], k["lambd"]) == ([0], 4, 4.0)
