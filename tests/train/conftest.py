import copy

import pytest


def tiny_config(**train):
    """A few-second classification run: 256 Fashion-MNIST images, 2-block 32-wide RPC-SymViT."""
    cfg = {
        "task": "classification",
        "model": {"name": "rpc_symvit_tiny_patch16_224",
                  "kwargs": {"patch_size": 7, "embed_dim": 32, "depth": 2, "num_heads": 2, "n_iter": 2,
                             "drop_path_rate": 0.0}},
        "data": {"name": "fashion_mnist", "train_subset": 256, "test_subset": 128, "val_size": 0,
                 "augment": {"enabled": True, "padding": 2, "flip": True}},
        "optim": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05},
        "schedule": {"name": "cosine", "warmup_epochs": 0.25, "min_lr": 1e-5},
        "train": {"epochs": 3, "batch_size": 32, "save_every": 4, "log_every": 1, "threads": 1, "seed": 3},
        "eval": {"batch_size": 128},
    }
    cfg["train"].update(train)
    return copy.deepcopy(cfg)


@pytest.fixture
def tiny_cfg():
    return tiny_config
