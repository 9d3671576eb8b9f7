import os

import pytest
import torch

os.environ.setdefault("RPC_ATTENTION_NO_PROGRESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_worker():
    # `make test` runs two pytest workers on two cores: one intra-op thread each.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    yield
