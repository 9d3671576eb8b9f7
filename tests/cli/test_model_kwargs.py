"""A misspelt model keyword is one line naming it with a suggestion: from ``timm.create_model`` for every
registered model, and with exit 2 in every command that builds one."""

import pickle

import pytest
import timm
import torch
import yaml

from rpc_attention.cli import main
from rpc_attention.models import FAN_MODEL_NAMES, MODEL_NAMES
from rpc_attention.models.factory import ModelKeywordError, create_model, keyword_error


@pytest.mark.parametrize("name", [*MODEL_NAMES, *FAN_MODEL_NAMES])
def test_timm_create_model_names_the_misspelt_keyword_for_every_registered_model(name):
    """The plain timm route: no wrapper of this library between the user and timm."""
    with pytest.raises(TypeError) as err:
        timm.create_model(name, n_iters=2)
    assert str(err.value) == f"{name} takes no keyword argument 'n_iters'; did you mean n_iter?"
    assert isinstance(err.value, ValueError) and err.value.__cause__ is None
    # the message survives a trip to another process (a worker's error)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


def test_a_misspelt_timm_factory_keyword_is_suggested_too():
    with pytest.raises(ModelKeywordError, match=r"'feature_only'; did you mean features_only"):
        timm.create_model("symvit_tiny_patch16_224", feature_only=True)


def _one_error_line(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_create_model_names_the_keyword_and_the_closest_ones():
    with pytest.raises(ValueError, match=r"^model.kwargs.n_iters: rpc_symvit_tiny_patch16_224 takes no keyword "
                                         r"argument 'n_iters'; did you mean n_iter\?"):
        create_model("rpc_symvit_tiny_patch16_224", n_iters=2)
    # a keyword of timm's VisionTransformer (the parent class) is suggested too
    with pytest.raises(ValueError, match=r"did you mean embed_dim"):
        create_model("symvit_tiny_patch16_224", embed_dimm=32)
    with pytest.raises(ValueError, match=r"^model.kwargs.depht: .* did you mean depth"):
        create_model("fan_tiny_12_p16_224", depht=2)
    # a TypeError that is not a bad keyword is not dressed up as one
    assert keyword_error(TypeError("unsupported operand type(s) for +: 'int' and 'str'"), "m") is None


def test_train_with_a_misspelt_model_keyword(tmp_path, capsys):
    rc = main(["train", "--preset", "fmnist-rpc-symvit", "--run", str(tmp_path / "r"),
               "--set", "model.kwargs.n_iters=2"])
    assert rc == 2
    _one_error_line(capsys, "model.kwargs.n_iters", "did you mean n_iter?")
    assert not (tmp_path / "r" / "config.yaml").exists()


def test_eval_external_with_a_misspelt_model_keyword(tmp_path, capsys):
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"data": {"name": "fashion_mnist"}}))
    torch.save({}, tmp_path / "ck.pth")
    rc = main(["eval-external", "--timm", "rpc_symvit_tiny_patch16_224", "--checkpoint", str(tmp_path / "ck.pth"),
               "--data-config", str(tmp_path / "data.yaml"), "--set", "model.kwargs.lamda=2",
               "--out", str(tmp_path / "e"), "--limit", "4"])
    assert rc == 2
    _one_error_line(capsys, "model.kwargs.lamda", "did you mean lambd?")


def test_analyze_with_a_misspelt_model_keyword(tmp_path, capsys):
    rc = main(["analyze", "--timm", "rpc_symvit_tiny_patch16_224", "--set", "model.kwargs.n_iters=2",
               "--out", str(tmp_path / "a")])
    assert rc == 2
    _one_error_line(capsys, "model.kwargs.n_iters", "did you mean n_iter?")


def test_train_lm_with_a_misspelt_model_keyword(tmp_path, capsys):
    rc = main(["train", "--preset", "wiki-rpc-symlm", "--run", str(tmp_path / "r"), "--set", "model.kwargs.n_iters=2",
               "--set", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 2
    _one_error_line(capsys, "model.kwargs.n_iters", "did you mean n_iter?")
