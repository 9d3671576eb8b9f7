"""Test helper: the classification task with an optional per-step sleep (to SIGKILL a run mid-way) and an
optional NaN loss from a given step. Imported by tests in-process and by the subprocess they spawn."""

import os
import time

import torch

from rpc_attention.train.tasks import get_task, register_task


class SlowClassification:
    def __init__(self, base):
        self._base = base
        self.calls = 0
        self.nan_from = None

    def __getattr__(self, name):
        return getattr(self._base, name)

    def loss(self, model, batch, cfg):
        self.calls += 1
        time.sleep(float(os.environ.get("RPC_TEST_STEP_SLEEP", "0")))
        loss, stats = self._base.loss(model, batch, cfg)
        if self.nan_from is not None and self.calls >= self.nan_from:
            loss = loss * torch.tensor(float("nan"))
        return loss, stats


TASK = SlowClassification(get_task("classification"))
register_task("slow_classification", TASK, overwrite=True)
