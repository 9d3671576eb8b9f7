"""The real SLURM of ``make test-slurm``: a one-node CPU-only cluster started for this directory's tests
(``cluster.py``) and stopped at the end, also when a test or the start fails."""

import atexit
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reproduce"))  # the comparison helper of the launcher tests

from cluster import Cluster, ensure_installed  # noqa: E402


def _cluster(tmp_path_factory, request, accounting):
    why = ensure_installed(accounting)
    if why:
        print(f"\nskipping the real-SLURM tests: {why}", file=sys.stderr)
        pytest.skip(why)
    cluster = Cluster(tmp_path_factory.mktemp("slurm-accounting" if accounting else "slurm"), accounting=accounting)
    # registered before the start, so a failed start stops what did start; atexit and SIGTERM (a CI
    # time limit) too, so that the daemons never outlive the test run
    request.addfinalizer(cluster.stop)
    atexit.register(cluster.stop)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    cluster.start()
    return cluster


def _interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")  # pytest then tears the fixtures down


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    return _cluster(tmp_path_factory, request, accounting=False)


@pytest.fixture(scope="module")
def accounting_cluster(tmp_path_factory, request):
    return _cluster(tmp_path_factory, request, accounting=True)
