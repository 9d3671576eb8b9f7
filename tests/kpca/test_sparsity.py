"""S activity of PAP blocks: the probe, the rule, the default trainer callback, final_metrics.json."""

import json
import math

import pytest
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the timm models)
from rpc_attention import functional as RF
from rpc_attention import nn as rnn
from rpc_attention.train.callbacks import default_callbacks, get_callback, register_callback, resolve_callbacks
from rpc_attention.train.sparsity import (
    ACTIVITY_KEYS,
    measure_sparsity,
    probe_sparsity,
    sparsity_callback,
    sparsity_verdict,
)


def _rpc_module(**pap):
    torch.manual_seed(0)
    return rnn.RPCAttention(16, num_heads=2, n_iter=3, **pap).double().eval()


def _expected(mod, x, attn_mask=None, is_causal=False, valid=None):
    """sparse_activity of the functional PAP on the module's own keys and values, float64."""
    k, v = mod._split(x)
    _, state = RF.pap_attention(k, v, attn_mask=attn_mask, is_causal=is_causal, n_iter=mod.n_iter, lambd=mod.lambd,
                                threshold=mod.threshold, mu_mode=mod.mu_mode, model_dim=mod.dim, fused=False,
                                return_state=True)
    return RF.sparse_activity(state, k, valid)


@pytest.mark.parametrize("pap", [dict(lambd=0.05, threshold="lambda_over_mu"), dict(lambd=4.0)])
def test_measure_sparsity_equals_sparse_activity_of_the_functional_pap(pap):
    mod = _rpc_module(**pap)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    (rec,) = measure_sparsity(mod, lambda: mod(x))
    want = _expected(mod, x)
    for key in ACTIVITY_KEYS:
        assert rec[key] == pytest.approx(want[key], rel=1e-12, abs=0), key
    assert rec["threshold"] == mod.threshold and rec["lambd"] == mod.lambd and rec["n_iter"] == 3
    assert rec["tokens"] == 3 * 7 and rec["causal"] is False
    assert rec["verdict"] == ("fired" if want["frac_nonzero"] > 0 else "acted as iterated attention")
    # the module is left as it was: no state kept, no hook
    assert mod.keep_state is False and mod.last_state is None and not mod._forward_hooks


def test_official_threshold_on_small_keys_is_iterated_attention_and_pcp_fires():
    x = 0.1 * torch.randn(2, 9, 16, dtype=torch.float64)
    official = _rpc_module(lambd=4.0)
    (rec,) = measure_sparsity(official, lambda: official(x))
    # tau = lambd * mu with mu = N C / (4 sum|k|): far above every |k| entry at this scale
    assert rec["tau_mean"] > 10 * rec["abs_k_max"]
    assert rec["frac_nonzero"] == 0.0 and rec["s_over_k"] == 0.0 and rec["verdict"] == "acted as iterated attention"
    pcp = _rpc_module(lambd=0.05, threshold="lambda_over_mu")
    (rec,) = measure_sparsity(pcp, lambda: pcp(x))
    assert 0 < rec["frac_nonzero"] <= 1 and rec["verdict"] == "fired"
    assert sparsity_verdict([{"frac_nonzero": 0.0}, {"frac_nonzero": 1e-4}]) == "fired"
    assert sparsity_verdict([{"frac_nonzero": 0.0}]) == "acted as iterated attention"
    assert sparsity_verdict([]) is None


def test_padding_keys_are_left_out():
    mod = _rpc_module(lambd=0.05, threshold="lambda_over_mu")
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    mask = keep[:, None, None, :]  # (B, 1, 1, N): no query attends to the padding keys
    (rec,) = measure_sparsity(mod, lambda: mod(x, attn_mask=mask))
    want = _expected(mod, x, attn_mask=mask, valid=keep)
    for key in ACTIVITY_KEYS:
        assert rec[key] == pytest.approx(want[key], rel=1e-12, abs=0), key
    assert rec["frac_nonzero"] != pytest.approx(_expected(mod, x, attn_mask=mask)["frac_nonzero"], rel=1e-12)


def test_causal_language_model_blocks():
    from rpc_attention.models.lm import Symlm, SymlmConfig

    torch.manual_seed(0)
    cfg = SymlmConfig(vocab_size=50, n_layer=3, d_model=32, n_head=2, d_inner=64, context=24, dropout=0.0,
                      rpc_layers=[0, 2], n_iter=3, lambd=0.05, threshold="lambda_over_mu", cutoffs=[], adaptive=False)
    lm = Symlm(cfg).eval()
    tokens = torch.randint(0, 50, (2, 24))
    recs = measure_sparsity(lm, lambda: lm(tokens))
    assert [r["block"] for r in recs] == [0, 2]
    assert all(r["causal"] and r["mu_mode"] in (None, "causal") and r["tokens"] == 48 for r in recs)
    assert all(0 < r["frac_nonzero"] <= 1 for r in recs)


def _vit(name="rpc_symvit_tiny_patch16_224", **kw):
    torch.manual_seed(0)
    return timm.create_model(name, img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                             num_classes=4, **kw).eval()


def test_callback_logs_probe_of_200_held_out_examples_and_returns_the_record(tmp_path, fake_logger, fake_task):
    from rpc_attention.train.tasks import register_task

    assert get_callback("sparsity") is sparsity_callback
    register_task("sparsity-test-fake", fake_task(300), overwrite=True)
    cfg = {"task": "sparsity-test-fake", "train": {}}
    model = _vit(rpc_layers=[1], n_iter=3, lambd=0.05, threshold="lambda_over_mu")
    log = fake_logger
    before = torch.get_rng_state()
    ret = sparsity_callback(model, cfg, 3, tmp_path, log)
    assert torch.equal(torch.get_rng_state(), before)  # the training's random stream does not move
    assert ret["epoch"] == 3 and ret["probe"] == {"split": "val", "examples": 200, "task": "sparsity-test-fake"}
    (block,) = ret["blocks"]
    assert block["block"] == 1 and block["tokens"] == 200 * 17 and ret["verdict"] == block["verdict"]
    (rec,) = log.records
    assert rec["epoch"] == 3 and rec["split"] == "sparsity"
    assert rec["sparsity/max_frac_nonzero"] == block["frac_nonzero"]
    assert all(rec[f"sparsity/blocks.1.attn/{k}"] == block[k] for k in ACTIVITY_KEYS)
    # the probe is the first 200 validation examples, the same at every epoch
    x = fake_task(300).build_datasets(None)["val"].tensors[0][:200]
    assert measure_sparsity(model, lambda: model(x)) == ret["blocks"]
    # no PAP block: nothing logged, nothing returned, no data loaded
    assert sparsity_callback(_vit("symvit_tiny_patch16_224"), {"task": "no-such-task"}, 1, tmp_path, log) is None
    assert probe_sparsity(_vit("symvit_tiny_patch16_224"), {"task": "no-such-task"})["verdict"] is None
    assert len(log.records) == 1


def test_a_run_gets_the_given_callbacks_then_the_listed_ones_each_once():
    def mine(model, cfg, epoch, run_dir, logger):
        return None

    register_callback("sparsity-test-listed", mine, overwrite=True)
    names = [n for n, _ in resolve_callbacks(["sparsity-test-listed", "sparsity", "sparsity-test-listed"])]
    assert names == ["sparsity", "sparsity-test-listed"]  # the default (sparsity) first
    assert resolve_callbacks(None) == default_callbacks() == [("sparsity", sparsity_callback)]
    assert resolve_callbacks(None, []) == []  # callbacks=[]: the record is off
    assert resolve_callbacks(["sparsity"], []) == [("sparsity", sparsity_callback)]  # a run may still list it
    assert resolve_callbacks(["sparsity-test-listed"], [("x", mine)]) == [("x", mine), ("sparsity-test-listed", mine)]
    with pytest.raises(ValueError, match="unknown callback 'nope'"):
        resolve_callbacks(["nope"])


_TINY_PAP_RUN = {
    "task": "classification",
    "model": {"name": "rpc_symvit_tiny_patch16_224",
              "kwargs": {"patch_size": 7, "embed_dim": 16, "depth": 1, "num_heads": 2, "n_iter": 2,
                         "lambd": 0.05, "threshold": "lambda_over_mu", "drop_path_rate": 0.0}},
    "data": {"name": "fashion_mnist", "train_subset": 64, "test_subset": 64, "val_size": 32},
    "train": {"epochs": 1, "batch_size": 32, "threads": 1, "log_every": 100},
    "eval": {"batch_size": 64},
}


def test_library_run_training_records_sparsity_without_the_analysis_toolkit(tmp_path):
    """A fresh interpreter that imports only rpc_attention.train gets the S-activity record by default;
    ``callbacks=[]`` switches it off."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (f"import json, sys\nimport rpc_attention.train as T\ncfg = {_TINY_PAP_RUN!r}\n"
            f"run = T.run_training(cfg, {str(tmp_path / 'lib')!r})\n"
            f"off = T.run_training(cfg, {str(tmp_path / 'off')!r}, callbacks=[])\n"
            "assert 'rpc_attention.kpca' not in sys.modules, 'the analysis toolkit was imported'\n"
            "print(json.dumps([json.load(open(run / 'final_metrics.json')).get('sparsity'),\n"
            "                  'sparsity' in json.load(open(off / 'final_metrics.json'))]))\n")
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    record, off_has_it = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["epoch"] == 1 and record["probe"]["split"] == "val" and len(record["blocks"]) == 1
    assert record["verdict"] in ("fired", "acted as iterated attention")
    assert off_has_it is False


def test_every_pap_run_records_sparsity_each_epoch_and_in_final_metrics(tmp_path):
    from rpc_attention.train.trainer import run_training

    cfg = {
        "task": "classification",
        "model": {"name": "rpc_symvit_tiny_patch16_224",
                  "kwargs": {"patch_size": 7, "embed_dim": 16, "depth": 1, "num_heads": 2, "n_iter": 2,
                             "lambd": 0.05, "threshold": "lambda_over_mu", "drop_path_rate": 0.0}},
        "data": {"name": "fashion_mnist", "train_subset": 64, "test_subset": 64, "val_size": 32},
        "train": {"epochs": 2, "batch_size": 32, "threads": 1, "log_every": 100},
        "eval": {"batch_size": 64},
    }
    run = run_training(cfg, tmp_path / "run")  # train.callbacks lists nothing: the callback is a default
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in recs if r.get("split") == "sparsity"]
    assert [r["epoch"] for r in logged] == [1, 2]
    final = json.loads((run / "final_metrics.json").read_text())
    sp = final["sparsity"]
    assert sp["epoch"] == 2 and sp["probe"]["split"] == "val" and sp["probe"]["examples"] == 32
    assert sp["blocks"][0]["frac_nonzero"] == logged[-1]["sparsity/blocks.0.attn/frac_nonzero"]
    assert all(math.isfinite(sp["blocks"][0][k]) for k in ACTIVITY_KEYS)
    # `rpc-attention analyze --run` reports the same probe's S activity (kpca.json, summary.md, stdout)
    from rpc_attention.cli import main

    assert main(["analyze", "--run", str(run), "--out", str(tmp_path / "an"), "--limit", "2", "--no-figures",
                 "--protocol", "exact"]) == 0
    got = json.loads((tmp_path / "an" / "kpca.json").read_text())["sparsity"]
    assert got["probe"] == sp["probe"] and got["verdict"] == sp["verdict"]
    (block,) = got["blocks"]
    # the same float32 forward, maybe on another thread count: summation order moves the continuous
    # statistics by float32 round-off, and may move an entry lying within round-off of tau
    entries = block["tokens"] * 16  # S entries: tokens x width (heads x head dim)
    assert block["frac_nonzero"] == pytest.approx(sp["blocks"][0]["frac_nonzero"], abs=2 / entries)
    for k in ("s_over_k", "tau_mean", "abs_k_max"):
        assert block[k] == pytest.approx(sp["blocks"][0][k], rel=1e-4)
    assert "PAP's sparse step" in (tmp_path / "an" / "summary.md").read_text()
    # a model without PAP layers gets no record
    cfg["model"]["name"] = "symvit_tiny_patch16_224"
    for k in ("n_iter", "lambd", "threshold"):
        del cfg["model"]["kwargs"][k]
    run = run_training(cfg, tmp_path / "sym")
    assert "sparsity" not in json.loads((run / "final_metrics.json").read_text())
    assert '"sparsity"' not in (run / "metrics.jsonl").read_text()
