"""The decoding benchmark's machinery on toy sizes (it measures; it asserts no timings)."""

import json
from pathlib import Path

import pytest
import torch

from rpc_attention.bench import decode as bd


def test_smoke_run_has_every_pair_and_context(tmp_path):
    pytest.importorskip("transformers")
    results = bd.run_decode(bd.decode_config("smoke"), progress=False)
    models = {(r["model"], r["context"]) for r in results["rows"]}
    assert models == {(m, t) for m in ("symlm", "rpc-symlm", "llama-sdpa", "llama-rpc") for t in (16, 32)}
    by = {(r["model"], r["context"]): r for r in results["rows"]}
    for q in results["ratios"]:
        assert q["step_ratio"] == by[(q["model"], q["context"])]["step_s"] / by[(q["base"], q["context"])]["step_s"]
    # the RPC caches hold n_iter cleaned-key tensors per PAP layer instead of the raw keys
    smoke = bd.decode_config("smoke")
    d_head = smoke.symlm["d_model"] // smoke.symlm["n_head"]
    per_tensor = 16 * smoke.symlm["d_model"] * 4  # one (1, H, t, d) float32 tensor at t = 16
    assert per_tensor == 16 * smoke.symlm["n_head"] * d_head * 4
    extra = by[("rpc-symlm", 16)]["cache_bytes"] - by[("symlm", 16)]["cache_bytes"]
    assert extra == 2 * ((smoke.n_iter - 1) * per_tensor + 2 * smoke.symlm["n_head"] * 4)
    assert by[("llama-rpc", 16)]["cache_bytes"] > by[("llama-sdpa", 16)]["cache_bytes"]
    paths = bd.write_decode_results(results, str(tmp_path), "smoke")
    assert json.loads(Path(paths["json"]).read_text())["config"]["contexts"] == [16, 32]
    assert "rpc-symlm / symlm | 16" in Path(paths["md"]).read_text()


def test_unknown_configuration_is_refused():
    with pytest.raises(ValueError, match="unknown decode benchmark configuration"):
        bd.decode_config("huge")


def test_tensor_bytes_follows_nested_caches():
    t = torch.zeros(2, 3)
    assert bd._tensor_bytes([{"a": t, "b": [t, torch.zeros(4, dtype=torch.float64)]}]) == 24 + 32


def test_cli_runs_the_decoding_benchmark_and_refuses_options_it_ignores(tmp_path, capsys):
    pytest.importorskip("transformers")
    from rpc_attention.cli import main

    assert main(["bench", "--only", "decode", "--smoke", "--repeats", "1", "--out", str(tmp_path)]) == 2
    assert "--repeats do(es) nothing with --only decode" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main(["bench", "--only", "decode", "--smoke", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-decode-smoke-cpu.json", "bench-decode-smoke-cpu.md"]
    assert "| llama-rpc / llama-sdpa | 32 |" in capsys.readouterr().out
