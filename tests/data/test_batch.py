"""data.batch.to_device: the one way a collated batch reaches a device (trainer, kpca probes, jproj callback)."""

import torch

from rpc_attention.data.batch import to_device


def test_every_tensor_moves_and_containers_keep_their_type():
    batch = ([torch.ones(2), (torch.zeros(1), "name")], {"y": torch.arange(3), "n": 7})
    moved = to_device(batch, torch.device("meta"))
    assert type(moved) is tuple and type(moved[0]) is list and type(moved[0][1]) is tuple
    assert moved[0][0].device.type == "meta" and moved[0][1][0].device.type == "meta"
    assert moved[1]["y"].device.type == "meta" and moved[0][1][1] == "name" and moved[1]["n"] == 7
    assert moved[1]["y"].shape == (3,) and moved[1]["y"].dtype == torch.int64
