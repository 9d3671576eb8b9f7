"""Stand-ins for the trainer's task and metrics logger, shared by the epoch-end callback tests."""

import pytest
import torch


class FakeLogger:
    """Collects what a callback logs."""

    def __init__(self):
        self.records = []

    def log(self, rec):
        self.records.append(rec)


class FakeTask:
    """A classification task on ``n`` random 1x16x16 images (train and val are the same set)."""

    def __init__(self, n: int):
        self.n = n

    def build_datasets(self, cfg):
        g = torch.Generator().manual_seed(0)
        ds = torch.utils.data.TensorDataset(torch.randn(self.n, 1, 16, 16, generator=g),
                                            torch.zeros(self.n, dtype=torch.long))
        return {"train": ds, "val": ds}

    def collate_fn(self, cfg):
        return None

    def loss(self, model, batch, cfg):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y), {}

    def build_model(self, cfg):
        raise NotImplementedError

    def evaluate(self, model, loader, cfg):
        return {}


@pytest.fixture
def fake_logger():
    return FakeLogger()


@pytest.fixture
def fake_task():
    return FakeTask
