"""train.probe.first_eval_batch: the one probe batch of analyze and the jproj / sparsity callbacks."""

import pytest
import torch
from torch.utils.data import TensorDataset

from rpc_attention.train.probe import first_eval_batch
from rpc_attention.train.tasks import register_task


class _Task:
    def __init__(self, splits):
        self.splits = splits

    def build_datasets(self, cfg):
        return {name: TensorDataset(torch.arange(n, dtype=torch.float32)) for name, n in self.splits.items()}

    def collate_fn(self, cfg):
        return None

    def build_model(self, cfg):  # a registered task needs these; the probe uses none of them
        raise NotImplementedError

    loss = evaluate = build_model


@pytest.mark.parametrize("splits, split, examples", [({"val": 5, "test": 9}, "val", 4), ({"val": 0, "test": 3}, "test", 3),
                                                     ({"test": 9}, "test", 4)])
def test_validation_set_first_then_test_set(splits, split, examples):
    register_task("probe_dummy", _Task(splits), overwrite=True)
    got = first_eval_batch({"task": "probe_dummy"}, 4)
    assert got.split == split and got.examples == examples
    assert got.batch[0].tolist() == list(range(examples))


def test_no_evaluation_set_is_an_error_and_the_random_streams_are_left_alone():
    register_task("probe_dummy", _Task({"train": 4}), overwrite=True)
    with pytest.raises(ValueError, match="no 'val' or 'test' data set"):
        first_eval_batch({"task": "probe_dummy"}, 4)
    register_task("probe_dummy", _Task({"val": 8}), overwrite=True)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    first_eval_batch({"task": "probe_dummy"}, 4)  # a DataLoader without its own generator draws a seed here
    assert torch.equal(torch.get_rng_state(), before)
