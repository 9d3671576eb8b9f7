#!/usr/bin/env python
"""Cost of the robust PAP path (docs/method.md#robust-variants, docs/robustness.md#cost), one CPU thread.

Three measurements, each the median of 5 rounds after warm-up calls (run under ``nice`` and report
``uptime``: on a shared machine the absolute times move with the load, the ratios less):

1. medians: ``torch.median`` against numpy's introselect (what the kernel uses on the CPU) at the
   per-feature (over tokens) and the pooled (over tokens and features) medians of PAP's key shapes;
2. one layer, no-grad and forward+backward: symmetric attention, the robust options on the plain loop
   (``pap_loop``, the definition), on the fast path (``pap_attention``), and the official 6-iteration PAP;
3. the quick study's model (width 96, 6 blocks, 6 heads, 17 tokens): SymViT, official RPC 6iter/layer1,
   robust RPC 2iter/layer1 (training step on 64 images with AdamW; inference on 500 images).

    nice -n 10 python benchmarks/robust_path.py
    nice -n 10 python benchmarks/robust_path.py --profile   # torch profiler tables of the robust layer instead
"""

import statistics
import sys
import time

import numpy as np
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the SymViT family)
from rpc_attention import functional as RF
from rpc_attention.functional.pap import pap_loop, prepare_pap

ROBUST = dict(n_iter=2, lambd=6.0, threshold="mad", lowrank="keys", shrink="hard", dual_step=0.0)
SHAPES = ((64, 6, 17, 16), (8, 3, 197, 64))


def timed(fn, calls: int, rounds: int = 5) -> float:
    """Median over rounds of the mean time (ms) of ``calls`` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(out)


def _median_times(x: torch.Tensor) -> str:
    flat = x.flatten(-2)
    mid, flat_mid = (x.shape[2] - 1) // 2, (flat.shape[-1] - 1) // 2
    return (f"per feature torch {timed(lambda: x.median(dim=-2), 20):.2f} ms, numpy "
            f"{timed(lambda: np.partition(x.numpy(), mid, axis=-2), 20):.2f} ms; pooled torch "
            f"{timed(lambda: flat.median(dim=-1), 20):.2f} ms, numpy "
            f"{timed(lambda: np.partition(flat.numpy(), flat_mid, axis=-1), 20):.2f} ms")


def medians() -> None:
    for shape in SHAPES:
        print(f"median {shape}: {_median_times(torch.randn(*shape))}")


def _robust_loop(k, v):
    return pap_loop(prepare_pap(k, v, **ROBUST), v, n_iter=2)[0]


def _layer_times(fn, shape, calls: int) -> str:
    k, v = torch.randn(*shape), torch.randn(*shape)
    kg, vg = k.clone().requires_grad_(), v.clone().requires_grad_()
    with torch.no_grad():
        infer = timed(lambda: fn(k, v), calls)
    train = timed(lambda: fn(kg, vg).sum().backward(), calls)
    return f"no-grad {infer:7.2f} ms  fwd+bwd {train:7.2f} ms"


def layers() -> None:
    cases = {"symmetric": lambda k, v: RF.symmetric_attention(k, v), "robust loop": _robust_loop,
             "robust fast path": lambda k, v: RF.pap_attention(k, v, **ROBUST),
             "official 6 iter": lambda k, v: RF.pap_attention(k, v)}
    for shape, calls in zip(SHAPES, (100, 10)):
        for name, fn in cases.items():
            print(f"layer {shape} {name:17s} {_layer_times(fn, shape, calls)}")


def models() -> None:
    kw = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96, depth=6, num_heads=6)
    specs = {"SymViT": ("symvit_tiny_patch16_224", {}),
             "official RPC 6iter/layer1": ("rpc_symvit_tiny_patch16_224", dict(rpc_layers=[0], n_iter=6)),
             "robust RPC 2iter/layer1": ("rpc_symvit_tiny_patch16_224", dict(rpc_layers=[0], **ROBUST))}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    xe = torch.randn(500, 1, 28, 28, generator=g)
    built = {n: timm.create_model(name, **kw, **extra) for n, (name, extra) in specs.items()}
    opts = {n: torch.optim.AdamW(m.parameters()) for n, m in built.items()}
    times = {n: ([], []) for n in built}
    for r in range(6):  # interleaved rounds; round 0 warms up
        for n, m in built.items():
            m.train()
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opts[n].zero_grad()
            loss.backward()
            opts[n].step()
            train = time.perf_counter() - start
            m.eval()
            start = time.perf_counter()
            with torch.no_grad():
                m(xe)
            if r:
                times[n][0].append(train)
                times[n][1].append(time.perf_counter() - start)
    base = times["SymViT"]
    for n, (tr, ev) in times.items():
        ratio_tr = statistics.median(a / b for a, b in zip(tr, base[0]))
        ratio_ev = statistics.median(a / b for a, b in zip(ev, base[1]))
        print(f"model {n:26s} train step {statistics.median(tr):.3f} s ({ratio_tr:.2f} x)  "
              f"inference {statistics.median(ev):.3f} s ({ratio_ev:.2f} x)")


def profile_layer() -> None:
    """Where the robust layer of a ViT-tiny spends its time (8 images at 224 x 224: 197 tokens, 3 heads)."""
    from torch.profiler import ProfilerActivity, profile

    model = timm.create_model("rpc_symvit_tiny_patch16_224", num_classes=1000, rpc_layers=[0], **ROBUST)
    attn, h = model.blocks[0].attn, torch.randn(8, 197, 192)
    with torch.no_grad():
        for _ in range(3):
            attn(h)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                attn(h)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    hg = h.clone().requires_grad_()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            attn(hg).sum().backward()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    torch.set_num_threads(1)
    if "--profile" in sys.argv[1:]:
        profile_layer()
        sys.exit(0)
    medians()
    layers()
    models()
