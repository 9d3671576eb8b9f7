"""Shared fixtures: a tiny RPC-SymViT trained for ~1 s on Fashion-MNIST, and its config."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")

MEAN, STD = 0.2860, 0.3530


def tiny_cfg():
    return {
        "task": "classification",
        "model": {"name": "rpc_symvit_tiny_patch16_224",
                  "kwargs": {"num_classes": 10, "img_size": 28, "in_chans": 1, "patch_size": 7, "embed_dim": 32,
                             "depth": 1, "num_heads": 2, "rpc_layers": "all", "n_iter": 2}},
        "data": {"name": "fashion_mnist", "mean": [MEAN], "std": [STD], "num_classes": 10, "in_chans": 1,
                 "img_size": 28},
    }


def build_tiny(cfg=None):
    import timm

    import rpc_attention.models  # noqa: F401  (registers the models in timm)

    cfg = cfg or tiny_cfg()
    return timm.create_model(cfg["model"]["name"], **cfg["model"]["kwargs"])


def train_tiny(cfg):
    """A model of ``cfg`` trained 2 epochs on 2000 images (about 1 s), seeded; in eval mode.

    The images are test images 5000-6999 (the small test file loads much faster than the training
    file); the suites are evaluated on the first test images, which the model has not seen."""
    from rpc_attention.data.images import fashion_mnist

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_tiny(cfg)
        xi, yi = fashion_mnist("test")
        xi, yi = xi[5000:7000], yi[5000:7000]
        x = ((torch.from_numpy(np.array(xi[:2000])).float() / 255 - MEAN) / STD).unsqueeze(1)
        y = torch.from_numpy(np.array(yi[:2000])).long()
        opt = torch.optim.AdamW(model.parameters(), 3e-3)
        for _ in range(2):
            for i in range(0, 2000, 100):
                loss = torch.nn.functional.cross_entropy(model(x[i:i + 100]), y[i:i + 100])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model():
    """(model, cfg): the tiny RPC-SymViT trained by :func:`train_tiny`, roughly 50 % accuracy."""
    if not os.path.isdir(FMNIST):
        pytest.skip("Fashion-MNIST not installed")
    cfg = tiny_cfg()
    return train_tiny(cfg), cfg


@pytest.fixture(scope="session")
def robust_tiny_model():
    """(model, cfg): the tiny model with robust PAP (MAD threshold lambda 4, L in key space, hard
    shrinkage, no dual step; docs/method.md#robust-variants), trained by :func:`train_tiny`."""
    if not os.path.isdir(FMNIST):
        pytest.skip("Fashion-MNIST not installed")
    cfg = tiny_cfg()
    cfg["model"]["kwargs"].update(threshold="mad", lowrank="keys", shrink="hard", dual_step=0.0, lambd=4.0)
    return train_tiny(cfg), cfg


@pytest.fixture(scope="session")
def test_batch():
    """64 Fashion-MNIST test images in [0, 1] ([64, 1, 28, 28]) and labels."""
    if not os.path.isdir(FMNIST):
        pytest.skip("Fashion-MNIST not installed")
    from rpc_attention.data.images import fashion_mnist

    xi, yi = fashion_mnist("test")
    x = torch.from_numpy(np.array(xi[:64])).float().div(255).unsqueeze(1)
    return x, torch.from_numpy(np.array(yi[:64])).long()


@pytest.fixture(scope="session")
def tiny_run(tiny_model, tmp_path_factory):
    """A run directory (config.yaml + model.safetensors) holding the tiny trained model."""
    import yaml
    from safetensors.torch import save_file

    model, cfg = tiny_model
    d = tmp_path_factory.mktemp("run")
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="session")
def sym_run(tmp_path_factory):
    """A run directory (config.yaml + model.safetensors) holding the tiny model as a plain SymViT (no PAP),
    trained by :func:`train_tiny`."""
    import yaml
    from safetensors.torch import save_file

    if not os.path.isdir(FMNIST):
        pytest.skip("Fashion-MNIST not installed")
    cfg = tiny_cfg()
    kwargs = {k: v for k, v in cfg["model"]["kwargs"].items() if k not in ("rpc_layers", "n_iter")}
    cfg["model"] = {"name": "symvit_tiny_patch16_224", "kwargs": kwargs}
    model = train_tiny(cfg)
    d = tmp_path_factory.mktemp("symrun")
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    return d
