"""A researcher's own images: an ImageFolder tree trains the right model with no extra settings,
evaluates, and two runs compare side by side; the traps around it answer in one line."""

import json

import numpy as np
import pytest
import yaml

from rpc_attention.cli import main
from rpc_attention.data import images as I

# a tiny model, so a run takes seconds: the data settings are all read from the folder
TINY = ["model.kwargs.depth=1", "model.kwargs.embed_dim=24", "model.kwargs.patch_size=8", "model.kwargs.n_iter=2",
        "train.epochs=2", "train.batch_size=8", "train.threads=1"]


def make_folder(root, splits=(("train", 8), ("val", 4)), size=(32, 32), classes=("cat", "dog"), seed=0):
    """An ImageFolder tree of RGB PNGs: class ``dog`` has a bright square in the middle."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in splits:
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                w, h = size if not callable(size) else size(i)
                img = rng.integers(0, 80, (h, w, 3)).astype(np.uint8)
                if c:
                    img[h // 4: 3 * h // 4, w // 4: 3 * w // 4] += 150
                Image.fromarray(img).save(folder / f"{i}.png")
    return root


def _train(tmp_path, root, out, *sets, preset="fmnist-rpc-symvit"):
    args = ["train", "--preset", preset, "--out", str(out), "--set", "data.name=imagefolder",
            "--set", f"data.root={root}"]
    for s in TINY + list(sets):
        args += ["--set", s]
    return main(args)


def _err(capsys):
    """The command's error: one line (the notes logged before it are not part of it)."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and err.endswith(errors[0]), err
    return errors[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("own") / "data")


@pytest.mark.slow  # two trainings, two evaluations and a comparison: about 20 s on 2 cores under load 8
def test_own_folder_trains_evaluates_and_compares(folder, tmp_path, capsys):
    """The walk of a new user: 2 classes at 32 px, no data settings; evaluate; compare two runs."""
    a, b = tmp_path / "rpc", tmp_path / "sym"
    assert _train(tmp_path, folder, a, "train.epochs=1") == 0
    assert _train(tmp_path, folder, b, "train.epochs=1", preset="fmnist-symvit") == 0
    cfg = yaml.safe_load((a / "config.yaml").read_text())
    assert cfg["data"]["num_classes"] == 2 and cfg["data"]["img_size"] == 32 and cfg["data"]["in_chans"] == 3
    assert cfg["model"]["kwargs"]["num_classes"] == 2 and cfg["model"]["kwargs"]["img_size"] == 32
    assert cfg["data"]["mean"] != list(I.IMAGENET_MEAN)  # computed from the training images
    final = json.loads((a / "final_metrics.json").read_text())
    assert final["split"] == "val" and "acc5" not in final  # the val folder is called val; no top-5 of 2 classes
    assert all("acc5" not in r for r in map(json.loads, (a / "metrics.jsonl").read_text().splitlines()))
    for run in (a, b):
        assert main(["eval", "--run", str(run), "--suite", "clean,fgsm", "--set", "fgsm.eps=[1/255,4/255]", "--set",
                     "batch_size=16", "-q"]) == 0
    clean = json.loads((a / "eval" / "clean.json").read_text())
    assert clean["data"]["split"] == "val" and "top5" not in clean["metrics"]
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--out", str(out), "--resamples", "200"]) == 0
    printed = capsys.readouterr().out
    assert "sym - rpc" in printed and "top1@4/255" in printed
    table = json.loads((out / "robustness.json").read_text())
    row = next(r for r in table["rows"] if r["suite"] == "clean" and r["metric"] == "top1")
    assert row["diffs"]["sym"]["interval"] is not None  # clean keeps per-example records: a paired interval
    assert (out / "robustness.png").is_file() and (out / "compare.png").is_file()


def test_wrong_class_count_is_one_line_and_the_same_out_takes_the_retry(folder, tmp_path, capsys):
    out = tmp_path / "r"
    assert _train(tmp_path, folder, out, "data.num_classes=1") == 2
    err = _err(capsys)
    assert "data.num_classes=1" in err and "2 classes" in err
    assert _train(tmp_path, folder, out, "model.kwargs.num_classes=5") == 2
    err = _err(capsys)
    assert "model.kwargs.num_classes=5" in err
    assert _train(tmp_path, folder, out, "train.max_steps=1") == 0  # nothing from the refused tries is in the way


def test_model_classes_follow_data_on_resume():
    """A saved config's derived model.kwargs.num_classes follows an override of data.num_classes."""
    from rpc_attention.train.config import resolve_config

    cfg = resolve_config("fmnist-rpc-symvit")
    assert cfg["model"]["kwargs"]["num_classes"] == 10
    cfg["data"].update(name="imagefolder", val_size=0)  # no root: the class count is the config's to give
    again = resolve_config(base=cfg, overrides=["data.num_classes=3"])
    assert again["model"]["kwargs"]["num_classes"] == 3 and again["data"]["num_classes"] == 3


def test_resume_with_another_model_shape_is_one_line(folder, tmp_path, capsys):
    out = tmp_path / "r"
    assert _train(tmp_path, folder, out, "train.max_steps=1") == 0
    rc = main(["train", "--resume", str(out), "--set", "train.max_steps=2", "--set", "model.kwargs.embed_dim=48"])
    err = _err(capsys)
    assert rc == 2 and "does not fit the model" in err


def test_failed_start_leaves_nothing_that_blocks_the_retry(tmp_path, tiny_cfg):
    """A run that fails before its first checkpoint can start again in the same directory."""
    from rpc_attention.train import run_training

    def boom(*_):
        raise RuntimeError("callback failed")

    out = tmp_path / "run"
    (out).mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="callback failed"):
        run_training(tiny_cfg(epochs=1, save_every=0), out, callbacks=[("boom", boom)])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # the user's file stays
    run_training(tiny_cfg(epochs=1, save_every=0, max_steps=1), out, callbacks=[])
    assert (out / "model.safetensors").is_file()


def test_test_folder_is_the_final_test_split(tmp_path):
    root = make_folder(tmp_path / "data", splits=(("train", 8), ("val", 2), ("test", 3)))
    out = tmp_path / "r"
    assert _train(tmp_path, root, out) == 0
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["split"] == "test" and final["n"] == 6  # the 3 + 3 test images, not the 2 + 2 val images
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert len(I.build_eval_dataset(cfg, "test")) == 6 and I.eval_split_name(cfg, "test") == "test"
    assert len(I.build_eval_dataset(cfg, "val")) == 4


def test_image_size_mean_and_std_are_read_from_the_images(tmp_path):
    from PIL import Image

    root = make_folder(tmp_path / "d", size=(40, 48))
    info = I.inspect_imagefolder(I.ImageData(name="imagefolder", root=str(root)))
    assert info.classes == ("cat", "dog") and info.img_size == 40 and not info.has_test
    pixels = np.concatenate([np.asarray(Image.open(p).convert("RGB"), dtype=np.float64).reshape(-1, 3) / 255
                             for p in sorted((root / "train").rglob("*.png"))])
    np.testing.assert_allclose(info.mean, pixels.mean(0), atol=1e-4)  # rounded to 4 digits
    np.testing.assert_allclose(info.std, pixels.std(0), atol=1e-4)


def test_images_of_varying_size_ask_for_img_size(tmp_path, capsys):
    root = make_folder(tmp_path / "d", size=lambda i: (32 + 8 * (i % 2), 32))
    rc = _train(tmp_path, root, tmp_path / "r")
    err = _err(capsys)
    assert rc == 2 and "data.img_size" in err
    assert _train(tmp_path, root, tmp_path / "r", "data.img_size=32", "train.max_steps=1") == 0


def test_val_with_other_classes_is_refused(tmp_path, capsys):
    root = make_folder(tmp_path / "d")
    (root / "val" / "bird").mkdir()
    rc = _train(tmp_path, root, tmp_path / "r")
    err = _err(capsys)
    assert rc == 2 and "different class folders" in err and "bird" in err


def test_keep_best_selects_the_best_validation_epoch(folder, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "r"
    assert _train(tmp_path, folder, out, "train.keep_best=true", "train.epochs=3") == 0
    final = json.loads((out / "final_metrics.json").read_text())
    vals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "val" and not r.get("final")]
    best = max(vals, key=lambda r: r["acc1"])  # the first of equals: later ones must beat it
    assert final["selected"] == {"step": best["step"], "epoch": best["epoch"], "acc1": best["acc1"]}
    kept, chosen = load_file(str(out / "model.safetensors")), load_file(str(out / "model_best.safetensors"))
    assert all(bool((kept[k] == chosen[k]).all()) for k in kept)
    assert (out / "model_last.safetensors").is_file()
    assert final["acc1"] == best["acc1"]  # the final evaluation (on val) is the selected weights'


def test_keep_best_without_validation_is_refused(folder, tmp_path, capsys):
    assert _train(tmp_path, folder, tmp_path / "r", "train.keep_best=true", "train.eval_every=0") == 2
    assert "train.eval_every=0" in _err(capsys)


def test_keep_best_survives_a_resume(folder, tmp_path):
    """A run stopped after 2 of 3 epochs and resumed selects what the uninterrupted run selects."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert _train(tmp_path, folder, whole, "train.keep_best=true", "train.epochs=3") == 0
    assert _train(tmp_path, folder, parts, "train.keep_best=true", "train.epochs=3", "train.max_steps=4") == 0
    assert main(["train", "--resume", str(parts), "--set", "train.max_steps=null"]) == 0
    a, b = (json.loads((r / "final_metrics.json").read_text()) for r in (whole, parts))
    assert a["selected"] == b["selected"] and a["acc1"] == b["acc1"]


def test_subsets_apply_to_a_folder_and_the_preset_val_size_does_not_follow_it(tmp_path, capsys):
    root = make_folder(tmp_path / "data", splits=(("train", 8), ("val", 2), ("test", 3)))
    out = tmp_path / "r"
    assert _train(tmp_path, root, out, "data.train_subset=10", "data.test_subset=4", "train.max_steps=1") == 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    # the Fashion-MNIST preset's data.val_size (5000) went back to its default: the folder has val/
    assert cfg["data"]["val_size"] == 0
    train, val, test = (I.build_datasets(cfg)[k] for k in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (10, 4, 4)  # of 16, 4 (val: never subset) and 6
    # drawn with data.subset_seed, in file order, the same images twice; another seed draws others
    a = I.build_eval_dataset(cfg, "test")
    assert a.indices == I.build_eval_dataset(cfg, "test").indices == sorted(a.indices)
    assert a.classes == ["cat", "dog"]
    other = dict(cfg, data=dict(cfg["data"], subset_seed=1))
    assert I.build_eval_dataset(other, "test").indices != a.indices
    final = json.loads((out / "final_metrics.json").read_text())
    assert final["n"] == 4


def test_a_key_the_folder_does_not_read_is_refused(tmp_path, capsys):
    root = make_folder(tmp_path / "data")
    rc = _train(tmp_path, root, tmp_path / "r", "data.val_size=3")
    err = _err(capsys)
    assert rc == 2 and "data.val_size=3 has no effect on data.name='imagefolder'" in err
    rc = main(["train", "--preset", "fmnist-rpc-symvit", "--out", str(tmp_path / "f"), "--set", "data.val_dir=v"])
    err = _err(capsys)
    assert rc == 2 and "data.val_dir='v' has no effect on data.name='fashion_mnist'" in err
    assert not (tmp_path / "f").exists() and not (tmp_path / "r").exists()


def test_a_run_saved_with_an_unread_key_still_loads():
    """Runs made before unread data keys were refused kept the preset's val_size on an ImageFolder."""
    from rpc_attention.train.config import resolve_config

    cfg = resolve_config("fmnist-rpc-symvit")
    cfg["data"].update(name="imagefolder", val_size=5000, num_classes=10)
    again = resolve_config(base=cfg)
    assert again["data"]["val_size"] == 0 and again["data"]["name"] == "imagefolder"
