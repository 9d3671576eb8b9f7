#!/usr/bin/env python
"""The check to run on the first GPU this project gets (``make gpu-check``; at most ~10 min on one GPU).

Checks the CUDA paths that CPU tests cannot reach, then measures, and writes everything to one JSON
(default ``benchmarks/results/gpu_check.json``):

checks (each ``{"ok": bool, ...details}``)
  * ``pap_vs_float64``: ``pap_attention`` (6 iterations, fused path) on CUDA in float32 against the
    float64 CPU reference (the explicit path), relative max error;
  * ``sdpa_backend``: which SDPA kernel runs under the bench's ``sdpa_backend`` context in bf16, for a
    plain SDPA call, the symmetric kernel and PAP (from the CUDA kernel names in a profile: flash or
    memory-efficient, not math);
  * ``bf16_train_step``: one optimiser step under ``torch.autocast(..., torch.bfloat16)`` of each model
    family (SymViT, RPC-SymViT, FAN, RPC-FAN, Symlm, RPC-Symlm): finite loss, finite gradients, PAP's
    state in float32;
  * ``ddp``: one DDP step on every visible GPU (NCCL): the parameters agree across ranks afterwards;
  * ``cached_decoding``: RPC-Symlm's cached next-token log-probabilities against the full forward.

measures (bf16 autocast, forward and forward+backward, ``torch.utils.benchmark`` medians)
  * PAP(6) against 6 SDPA calls and against one, at N = 197 (DeiT) and N = 1024;
  * the speed-up of the fused PAP(6) over the official explicit formulation (``bench.official_pap``);
  * peak memory of each (``torch.cuda.max_memory_allocated`` over the call).

Without CUDA it prints one line and exits 0. ``--allow-cpu --quick`` runs every step on the CPU
(gloo instead of NCCL, tiny sizes), which is how the test suite keeps this script working.

    python benchmarks/gpu_check.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List

import torch

HERE = Path(__file__).resolve().parent
NO_CUDA = "gpu-check: no CUDA device here (torch.cuda.is_available() is False): nothing checked, nothing written"


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _inputs(b, h, n, d, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(b, h, n, d, generator=g).to(device, dtype)
    v = torch.randn(b, h, n, d, generator=g).to(device, dtype)
    return k, v


# ------------------------------------------------------------------------------------------ checks
def check_pap(device, quick) -> dict:
    from rpc_attention.functional import pap_attention

    k, v = _inputs(2, 3, 64 if quick else 197, 64, device)
    out = pap_attention(k, v, n_iter=6)
    ref = pap_attention(k.double().cpu(), v.double().cpu(), n_iter=6, fused=False)
    err = _rel_err(out, ref)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        err_bf16 = _rel_err(pap_attention(k, v, n_iter=6), ref)
    # float32 against float64: a few hundred ulps of rounding through 6 passes of attention
    return {"ok": err < 1e-4, "rel_max_err_fp32": err, "rel_max_err_bf16_autocast": err_bf16, "tolerance_fp32": 1e-4}


def _kernels(fn: Callable[[], object], device) -> List[str]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return sorted({e.key for e in prof.key_averages() if "attention" in e.key.lower() or "fmha" in e.key.lower()
                   or "flash" in e.key.lower() or "softmax" in e.key.lower()})


def _backend_of(names: List[str]) -> str:
    text = " ".join(names).lower()
    if "flash" in text:
        return "flash"
    if "efficient" in text or "fmha" in text or "mem_eff" in text or "cutlass" in text:
        return "efficient"
    return "math"


def check_sdpa_backend(device, quick) -> dict:
    import torch.nn.functional as F

    from rpc_attention.bench.measure import sdpa_backend
    from rpc_attention.functional import pap_attention, symmetric_attention

    k, v = _inputs(4, 3, 64 if quick else 197, 64, device, torch.bfloat16)
    cases = {"sdpa": lambda: F.scaled_dot_product_attention(k, k, v),
             "symmetric": lambda: symmetric_attention(k, v),
             "pap6": lambda: pap_attention(k, v, n_iter=6)}
    out = {}
    for name, fn in cases.items():
        with sdpa_backend(device), torch.no_grad():
            fn()
            names = _kernels(fn, device)
        out[name] = {"backend": _backend_of(names), "kernels": names[:12]}
    ok = all(r["backend"] in ("flash", "efficient") for r in out.values()) if device.type == "cuda" else True
    return {"ok": ok, **out}


def _vision_models(quick) -> Dict[str, tuple]:
    import timm

    import rpc_attention.models  # noqa: F401  (registers the models in timm)

    small = dict(img_size=32 if quick else 224, num_classes=10)
    vit = dict(small, patch_size=8 if quick else 16, embed_dim=48 if quick else 192, depth=2 if quick else 12,
               num_heads=3)
    fan = dict(small, depth=2) if quick else dict(small)
    return {"symvit": ("symvit_tiny_patch16_224", vit), "rpc-symvit": ("rpc_symvit_tiny_patch16_224", vit),
            "fan": ("fan_tiny_12_p16_224", fan), "rpc-fan": ("rpc_fan_tiny_12_p16_224", fan),
            "_create": (timm.create_model, None)}


def _spy_pap(record: list):
    import rpc_attention.functional.pap as pap

    original = pap.prepare_pap

    def spied(k, v, **kw):
        problem = original(k, v, **kw)
        record.append((str(k.dtype), str(problem.mu.dtype), str(problem.tau.dtype)))
        return problem

    pap.prepare_pap = spied
    return lambda: setattr(pap, "prepare_pap", original)


def _step(model, loss_fn, device) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pap_calls: list = []
    restore = _spy_pap(pap_calls)
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model)
        loss.backward()
    finally:
        restore()
    grads_ok = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    state_f32 = all(mu == tau == "torch.float32" for _, mu, tau in pap_calls)
    return {"ok": bool(math.isfinite(loss.item()) and grads_ok and state_f32), "loss": float(loss.item()),
            "loss_dtype": str(loss.dtype), "pap_calls": len(pap_calls),
            "pap_dtypes": sorted({f"k {k} mu {m} tau {t}" for k, m, t in pap_calls})}


def check_train_steps(device, quick) -> dict:
    from rpc_attention.models.lm import build_lm

    out = {}
    models = _vision_models(quick)
    create = models.pop("_create")[0]
    b = 4 if quick else 32
    for name, (arch, kwargs) in models.items():
        try:
            torch.manual_seed(0)
            model = create(arch, **kwargs).to(device).train()
            size = kwargs["img_size"]
            x, y = torch.randn(b, 3, size, size, device=device), torch.randint(0, 10, (b,), device=device)
            out[name] = _step(model, lambda m, x=x, y=y: torch.nn.functional.cross_entropy(m(x).float(), y), device)
        except Exception as exc:  # one family failing is a result, not the end of the check
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    lm = dict(vocab_size=1000, d_model=64, n_layer=2, n_head=4, d_inner=128, context=64 if quick else 256,
              dropout=0.0, adaptive=False)
    for name, extra in (("symlm", {}), ("rpc-symlm", dict(rpc_layers=[0, 1], n_iter=4))):
        try:
            torch.manual_seed(0)
            model = build_lm(None, **lm, **extra).to(device).train()
            idx = torch.randint(0, 1000, (b, lm["context"]), device=device)
            out[name] = _step(model, lambda m, idx=idx: -m(idx[:, :-1], targets=idx[:, 1:]).float().mean(), device)
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    return {"ok": all(r["ok"] for r in out.values()), **out}


def _ddp_worker(rank: int, world: int, port: int, device_type: str, quick: bool, result_dir: str) -> None:
    import torch.distributed as dist

    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device(f"cuda:{rank}") if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    models = _vision_models(quick)
    create = models.pop("_create")[0]
    arch, kwargs = models["rpc-symvit"]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(create(arch, **kwargs).to(device),
                                                      device_ids=[rank] if device_type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    size = kwargs["img_size"]
    x = torch.randn(4, 3, size, size, generator=g).to(device)
    y = torch.randint(0, 10, (4,), generator=g).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    opt.step()
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        diff = max(float((t - gathered[0]).abs().max()) for t in gathered)
        Path(result_dir, "ddp.json").write_text(json.dumps({"max_param_diff_across_ranks": diff,
                                                            "loss_rank0": float(loss.item())}))
    # every rank past its last collective before any tears down: a rank leaving while gloo's threads still
    # serve another's all_gather aborts the process ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


def check_ddp(device, quick) -> dict:
    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if device.type == "cuda" else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(world, port, device.type, quick, tmp), nprocs=world, join=True)
        res = json.loads(Path(tmp, "ddp.json").read_text())
    return {"ok": res["max_param_diff_across_ranks"] == 0.0, "world_size": world,
            "backend": "nccl" if device.type == "cuda" else "gloo", **res}


def check_cached_decoding(device, quick) -> dict:
    from rpc_attention.models.lm import build_lm

    torch.manual_seed(0)
    model = build_lm(None, vocab_size=500, d_model=64, n_layer=2, n_head=4, d_inner=128, context=64, dropout=0.0,
                     adaptive=False, rpc_layers=[0, 1], n_iter=4).to(device).eval()
    x = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(1)).to(device)
    prompt = 8
    with torch.no_grad():
        cache = model.new_cache()
        steps = [model.next_logprob(x[:, :prompt], cache)]
        steps += [model.next_logprob(x[:, i:i + 1], cache) for i in range(prompt, x.shape[1])]
        full = [model.next_logprob(x[:, :i]) for i in range(prompt, x.shape[1] + 1)]
    cached, uncached = torch.stack(steps, 1), torch.stack(full, 1)
    err = float((cached - uncached).abs().max())
    # float32 with different shapes: rounding of a few eps of the log-prob scale (the CPU test's bound)
    atol = 16 * torch.finfo(torch.float32).eps * float(uncached.abs().max())
    return {"ok": err <= atol, "max_abs_diff": err, "tolerance": atol,
            "same_argmax": bool(torch.equal(cached.argmax(-1), uncached.argmax(-1)))}


# ---------------------------------------------------------------------------------------- measures
def measure(device, quick) -> dict:
    from rpc_attention.bench import official_pap
    from rpc_attention.bench.measure import peak_bytes, sdpa_backend, time_call
    from rpc_attention.functional import pap_attention, symmetric_attention

    shapes = {"N=197": (64, 3, 197, 64), "N=1024": (8, 3, 1024, 64)}
    if quick:
        shapes = {"N=64": (2, 3, 64, 32)}
    min_run = 0.05 if quick else 0.5
    out = {}
    for label, shape in shapes.items():
        k0, v0 = _inputs(*shape, device)
        cases = {"sdpa x1": lambda k, v: symmetric_attention(k, v),
                 "sdpa x6": lambda k, v: [symmetric_attention(k, v) for _ in range(6)][-1],
                 "pap6": lambda k, v: pap_attention(k, v, n_iter=6),
                 "official6": lambda k, v: official_pap(k, v, n_iter=6)}
        rows = {}
        for name, f in cases.items():
            for mode in ("fwd", "fwd+bwd"):
                k, v = k0.clone().requires_grad_(mode != "fwd"), v0.clone().requires_grad_(mode != "fwd")

                def call(f=f, k=k, v=v, mode=mode):
                    with torch.autocast(device.type, dtype=torch.bfloat16), sdpa_backend(device):
                        if mode == "fwd":
                            with torch.no_grad():
                                return f(k, v)
                        y = f(k, v)
                    y.float().sum().backward()

                def synced(call=call):
                    call()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)

                try:
                    synced()
                    rows[f"{name} {mode}"] = {"s": time_call(synced, min_run), "peak_bytes": peak_bytes(call, device)}
                except Exception as exc:  # out of memory at this size is a result
                    rows[f"{name} {mode}"] = {"s": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}

        def ratio(a, b):
            x, y = rows[a].get("s"), rows[b].get("s")
            return x / y if x and y else None

        out[label] = {"shape_BHNd": list(shape), "rows": rows, "ratios": {
            mode: {"pap6 / sdpa x6": ratio(f"pap6 {mode}", f"sdpa x6 {mode}"),
                   "pap6 / sdpa x1": ratio(f"pap6 {mode}", f"sdpa x1 {mode}"),
                   "speed-up over official6": ratio(f"official6 {mode}", f"pap6 {mode}")}
            for mode in ("fwd", "fwd+bwd")}}
    return out


# -------------------------------------------------------------------------------------------- main
CHECKS = {"pap_vs_float64": check_pap, "sdpa_backend": check_sdpa_backend, "bf16_train_step": check_train_steps,
          "ddp": check_ddp, "cached_decoding": check_cached_decoding}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_check.json"), help="the JSON to write")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (testing)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (testing)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.allow_cpu:
        print(NO_CUDA)
        return 0
    from rpc_attention.bench.measure import environment

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    result = {"environment": environment(device), "checks": {}, "measures": None}
    for name, fn in CHECKS.items():
        t = time.time()
        try:
            result["checks"][name] = fn(device, args.quick)
        except Exception as exc:
            result["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                      "trace": traceback.format_exc()[-2000:]}
        result["checks"][name]["seconds"] = time.time() - t
        print(f"gpu-check: {name}: {'ok' if result['checks'][name]['ok'] else 'FAILED'} "
              f"({result['checks'][name]['seconds']:.1f} s)", flush=True)
    try:
        result["measures"] = measure(device, args.quick)
    except Exception as exc:
        result["measures"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    result["seconds"] = time.time() - t0
    result["ok"] = all(c["ok"] for c in result["checks"].values())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, out)
    print(f"gpu-check: {'all checks passed' if result['ok'] else 'some checks FAILED'}; "
          f"{result['seconds']:.0f} s; written to {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
