"""Masking-aware training (``train.token_drop``): random patch tokens dropped through the key mask, seeded,
off by default; off, the training loss is the plain model's and draws no random numbers."""

import pytest
import torch
from safetensors.torch import load_file

from rpc_attention.evaluate.masking import random_token_drop
from rpc_attention.train import run_training
from rpc_attention.train.task_classification import TASK


def _weights(run):
    return load_file(str(run / "model.safetensors"))


def test_token_drop_changes_training_and_repeats_exactly(tmp_path, tiny_cfg):
    base = tiny_cfg(epochs=1, save_every=0)
    plain = _weights(run_training(base, tmp_path / "plain"))
    drop = tiny_cfg(epochs=1, save_every=0, token_drop=0.5)
    a = _weights(run_training(drop, tmp_path / "a"))
    b = _weights(run_training(tiny_cfg(epochs=1, save_every=0, token_drop=0.5), tmp_path / "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)              # seeded: the same run twice
    assert any(not torch.equal(a[k], plain[k]) for k in a)      # and it changes training


def test_off_the_loss_is_the_plain_models_and_draws_nothing(tiny_cfg):
    torch.manual_seed(0)
    cfg = TASK.finalize_config(tiny_cfg())
    model = TASK.build_model(cfg).train()
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    state = torch.get_rng_state()
    loss, _ = TASK.loss(model, (x, y), cfg)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(model(x).float(), y), rtol=0, atol=0)


def test_the_drawn_masks():
    gen = torch.Generator().manual_seed(0)
    dropped = random_token_drop(2000, 16, 0.5, generator=gen)
    counts = dropped.sum(1)
    assert counts.min() == 0 and counts.max() == 8            # 0 .. round(0.5 * 16) tokens per image
    assert set(counts.tolist()) == set(range(9))
    share = dropped.float().mean(0)                              # 4 of 16 tokens on average, any token alike
    assert 0.2 < share.min() and share.max() < 0.3
    with pytest.raises(ValueError, match="fraction"):
        random_token_drop(2, 16, 1.0)


@pytest.mark.parametrize("value", [1.0, -0.1, "half", True])
def test_bad_token_drop_is_refused(tiny_cfg, value):
    with pytest.raises(ValueError, match="train.token_drop"):
        TASK.finalize_config(tiny_cfg(token_drop=value))
