"""``make gpu-check`` (``benchmarks/gpu_check.py``), the check prepared for the first GPU: without CUDA it
says so in one line and writes nothing; with ``--allow-cpu --quick`` every check and measurement runs on
the CPU (gloo instead of NCCL), so the script cannot rot while no GPU is lent."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(*args, cwd):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_without_cuda_it_prints_one_line_and_writes_nothing(tmp_path):
    res = _run("--out", str(tmp_path / "gpu.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines() == [
        "gpu-check: no CUDA device here (torch.cuda.is_available() is False): nothing checked, nothing written"]
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.slow
def test_every_check_and_measure_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    res = _run("--allow-cpu", "--quick", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["checks"]) == {"pap_vs_float64", "sdpa_backend", "bf16_train_step", "ddp", "cached_decoding"}
    assert result["ok"] and all(c["ok"] for c in result["checks"].values())
    steps = result["checks"]["bf16_train_step"]
    assert set(steps) >= {"symvit", "rpc-symvit", "fan", "rpc-fan", "symlm", "rpc-symlm"}
    assert steps["rpc-symvit"]["pap_calls"] > 0 and steps["rpc-symlm"]["pap_calls"] > 0
    assert all("mu torch.float32 tau torch.float32" in d for d in steps["rpc-symvit"]["pap_dtypes"])
    assert result["checks"]["ddp"]["world_size"] == 2 and result["checks"]["ddp"]["backend"] == "gloo"
    (shape,) = result["measures"].values()
    assert set(shape["ratios"]["fwd+bwd"]) == {"pap6 / sdpa x6", "pap6 / sdpa x1", "speed-up over official6"}
    assert all(r["s"] for r in shape["rows"].values())
