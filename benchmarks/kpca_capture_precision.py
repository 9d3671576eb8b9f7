"""What computing q, k, v in float32 instead of float64 does to the kernel-PCA gamma spreads.

The seeded random-init probe of ``rpc-attention analyze --timm MODEL`` (8 images, seed 0) is analysed twice
under each protocol: with q, k, v of the float64 capture (``AttentionCapture``: the hooked input through
float64 copies of the layer's weights), and with the layer's own float32 ``qkv`` projection of the same
hooked input cast to float64 (what the timm capture did before it computed in float64). Prints the
model-level mean |gamma_i - gamma_j| of the learned values and the three controls, and the per-layer change
of the learned values' spread. timm models with identity q_norm / k_norm (ViT, DeiT) only.

    PYTHONPATH=src python benchmarks/kpca_capture_precision.py deit_tiny_patch16_224
"""

import dataclasses
import sys

import torch

from rpc_attention.kpca.analysis import analyze_captures
from rpc_attention.kpca.hooks import AttentionCapture, find_attention_modules
from rpc_attention.kpca.sources import probe_from_timm


def float32_captures(probe):
    """The float64 captures, and copies whose q, k, v come from the float32 qkv projection."""
    mods = {n: m for n, m, _ in find_attention_modules(probe.model)}
    inputs = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: inputs.__setitem__(n, args[0].detach()))
             for n, m in mods.items()]
    with AttentionCapture(probe.model) as cap, torch.no_grad():
        probe.forward()
    for h in hooks:
        h.remove()
    caps32 = []
    for c in cap.captures:
        m, x = mods[c.name], inputs[c.name]
        b, n, _ = x.shape
        with torch.no_grad():
            qkv = m.qkv(x).reshape(b, n, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4).double()
        q, k, v = qkv.unbind(0)
        caps32.append(dataclasses.replace(c, q=q, k=k, v=v))
    return cap.captures, caps32


def main(name: str) -> None:
    torch.set_num_threads(1)
    caps64, caps32 = float32_captures(probe_from_timm(name))
    for proto in ("paper", "exact"):
        r64, r32 = analyze_captures(caps64, proto), analyze_captures(caps32, proto)
        for g in r64["model"]["gamma"]:
            a, b = r64["model"]["gamma"][g]["mean"], r32["model"]["gamma"][g]["mean"]
            print(f"{proto} gamma {g}: float64 {a:.4g}, float32 {b:.4g} ({(b / a - 1) * 100:+.1f} %)")
        change = [(L32["gamma"]["learned"]["mean"] / L64["gamma"]["learned"]["mean"] - 1) * 100
                  for L64, L32 in zip(r64["layers"], r32["layers"])]
        print(f"{proto} learned gamma per layer, change %: " + ", ".join(f"{c:+.1f}" for c in change))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "deit_tiny_patch16_224")
