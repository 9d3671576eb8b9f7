"""The bf16 autocast path of the GPU presets (``train.amp: bf16``), run on the CPU: a few training steps
and the final evaluation of SymViT, RPC-SymViT, Symlm and RPC-Symlm under ``torch.autocast("cpu",
dtype=torch.bfloat16)``. The matrix products run in bf16 (checked on the linear layers' outputs, in
training and under no_grad in the evaluation); PAP keeps its keys, mu and its shrinkage threshold tau in
float32 (checked on every PAP call); the loss is finite and the run is saved."""

import json
import math

import pytest
import torch
from corpora import random_wikitext, wikitext_settings

import rpc_attention.functional.pap as pap
from rpc_attention.train import resolve_config, run_training

VISION = ["data.train_subset=128", "data.val_size=64", "data.test_subset=64", "train.batch_size=32",
          "model.kwargs.embed_dim=32", "model.kwargs.depth=2", "model.kwargs.num_heads=2", "train.log_every=1",
          "eval.batch_size=64", "train.threads=0"]


def _corpus(tmp):
    return [*wikitext_settings(random_wikitext(tmp / "wt"), tmp / "cache"), "model.kwargs.n_layer=2", "model.kwargs.d_model=16", "model.kwargs.n_head=2", "model.kwargs.d_inner=32",
            "model.kwargs.context=16", "model.kwargs.cutoffs=[6]", "train.log_every=1", "train.threads=0"]


@pytest.fixture
def spy(monkeypatch):
    """Records the dtypes of linear outputs (with grad on or off) and of every PAP problem."""
    seen = {"linear": set(), "pap": []}

    def on_forward(module, args, output):
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen["linear"].add((output.dtype, torch.is_grad_enabled()))

    handle = torch.nn.modules.module.register_module_forward_hook(on_forward)
    prepare = pap.prepare_pap

    def spied(k, v, **kw):
        problem = prepare(k, v, **kw)
        seen["pap"].append({"k": k.dtype, "keys": problem.keys.dtype, "mu": problem.mu.dtype,
                            "tau": problem.tau.dtype, "grad": torch.is_grad_enabled()})
        return problem

    monkeypatch.setattr(pap, "prepare_pap", spied)
    yield seen
    handle.remove()


@pytest.mark.parametrize("preset", ["fmnist-symvit", "fmnist-rpc-symvit", "wiki-symlm", "wiki-rpc-symlm"])
def test_bf16_autocast_trains_and_evaluates_on_cpu_with_pap_state_in_float32(tmp_path, spy, preset):
    small = VISION if preset.startswith("fmnist") else _corpus(tmp_path)
    cfg = resolve_config(preset, small + ["train.amp=bf16", "train.device=cpu", "train.max_steps=3"])
    assert cfg["train"]["amp"] == "bf16"
    run = run_training(cfg, tmp_path / "run", callbacks=[])
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if json.loads(line).get("split") == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert (run / "model.safetensors").is_file()
    final = json.loads((run / "final_metrics.json").read_text())
    assert any(isinstance(v, float) and math.isfinite(v) for v in final.values())  # the evaluation ran
    # bf16 matrix products in training (grad on) and in the evaluation (grad off)
    assert {(torch.bfloat16, True), (torch.bfloat16, False)} <= spy["linear"]
    if "rpc" in preset:
        calls = spy["pap"]
        assert calls and any(c["k"] == torch.bfloat16 for c in calls)  # PAP received bf16 keys...
        assert {c["grad"] for c in calls} == {True, False}
        for c in calls:  # ...and kept its state and thresholds in float32
            assert c["keys"] == c["mu"] == c["tau"] == torch.float32, c
    else:
        assert spy["pap"] == []
