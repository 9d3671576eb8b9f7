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


@pytest.fixture(autouse=True)
def _keep_thread_count():
    # Every test runs at the thread count the run was started with (OMP_NUM_THREADS, or one per xdist
    # worker): a test or CLI that changes it must not silently run the rest of the suite at another count,
    # which would hide thread-count-dependent tolerances.
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed_every_test():
    # Every test starts from the same RNG state, whatever ran before it in its worker: a test that
    # draws unseeded random tensors sees the same ones in every run (no order-dependent flakiness).
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
