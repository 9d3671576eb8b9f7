"""torchrun: 2 gloo processes reproduce the single-process loss curve for the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rpc_attention.train import run_training


def _losses(run):
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["split"] == "train"], [r["acc"] for r in recs if r["split"] == "train"]


@pytest.mark.xdist_group("train-subprocess")
def test_two_process_gloo_matches_one_process(tmp_path, tiny_cfg):
    cfg = tiny_cfg(epochs=1, save_every=0, repeated_aug=2)
    cfg["data"]["train_subset"] = 192
    cfg["train"]["mixup"] = {"label_smoothing": 0.1}
    single = run_training(cfg, tmp_path / "single")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, RPC_ATTENTION_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "rpc_attention", "train", "--preset", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "ddp")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    l1, a1 = _losses(single)
    l2, a2 = _losses(tmp_path / "ddp")
    assert len(l1) == len(l2) == 6
    # float32 training (DDP runs on gloo in float32): two half-batch gradient means all-reduced differ
    # from one full-batch mean by rounding (~eps = 1.2e-7 relative), and 6 AdamW steps, whose update
    # divides by sqrt(v), amplify that; 1e-4 relative is ~800 eps, far below the change a wrong
    # gradient average (a factor of 2, or a missing all-reduce) makes in the first step's loss.
    torch.testing.assert_close(torch.tensor(l2), torch.tensor(l1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(a2), torch.tensor(a1), rtol=0, atol=1e-3)
    w1, w2 = load_file(str(single / "model.safetensors")), load_file(str(tmp_path / "ddp" / "model.safetensors"))
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)
    # only rank 0 wrote: one line per step, one config, one set of weights
    assert (tmp_path / "ddp" / "config.yaml").is_file()
