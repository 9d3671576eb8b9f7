"""``rpc-attention pap-demo``: how far plain and RPC attention move under sparse key corruption."""

from __future__ import annotations

import argparse

from ..markdown import markdown_table

HELP = "Short PAP demonstration: plain vs RPC attention on keys with injected sparse corruption"
EXTRA = None  # the core suffices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=197, help="sequence length N (default: DeiT's 197)")
    parser.add_argument("--heads", type=int, default=3, help="attention heads (default 3)")
    parser.add_argument("--head-dim", type=int, default=64, help="width of each head (default 64)")
    parser.add_argument("--rank", type=int, default=4, help="rank of the clean keys")
    parser.add_argument("--fraction", type=float, default=0.05, help="fraction of key entries corrupted")
    parser.add_argument("--magnitude", type=float, default=5.0, help="corruption size in key standard deviations")
    parser.add_argument("--lambd", type=float, default=4.0, help="PAP sparsity weight lambda (default 4)")
    parser.add_argument("--trials", type=int, default=8, help="random draws averaged (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")


def corruption_table(args: argparse.Namespace):
    """Rows of (method, relative output change) averaged over trials."""
    import torch

    from .. import functional as RF

    g = torch.Generator().manual_seed(args.seed)
    b, h, n, d = args.trials, args.heads, args.tokens, args.head_dim
    basis = torch.randn(b, h, args.rank, d, generator=g)
    coeff = torch.randn(b, h, n, args.rank, generator=g)
    keys = coeff @ basis / args.rank ** 0.5  # low-rank clean keys
    values = torch.randn(b, h, n, d, generator=g)
    hit = torch.rand(b, h, n, d, generator=g) < args.fraction
    noise = torch.randn(b, h, n, d, generator=g).sign() * args.magnitude * keys.std()
    corrupted = keys + hit * noise

    def rel_change(fn):
        clean, dirty = fn(keys), fn(corrupted)
        return float(((dirty - clean).norm(dim=-1) / clean.norm(dim=-1).clamp_min(1e-12)).mean())

    rows = [("symmetric attention (plain)", 1, rel_change(lambda k: RF.symmetric_attention(k, values)))]
    for n_iter in (1, 2, 4, 6):
        rows.append((f"RPC / PAP lambda={args.lambd:g}", n_iter,
                     rel_change(lambda k, n=n_iter: RF.pap_attention(k, values, n_iter=n, lambd=args.lambd))))
    return rows


def run(args: argparse.Namespace) -> int:
    from . import UserError

    if not 0 <= args.fraction <= 1:
        raise UserError(f"--fraction must be in [0, 1], got {args.fraction}")
    if min(args.tokens, args.heads, args.head_dim, args.rank, args.trials) < 1:
        raise UserError("--tokens, --heads, --head-dim, --rank and --trials must be positive")
    rows = corruption_table(args)
    print(f"Keys: rank {args.rank}, N={args.tokens}, {args.heads} heads of {args.head_dim}; "
          f"{args.fraction:.0%} of entries corrupted by +-{args.magnitude:g} std; mean over {args.trials} draws.")
    print("Relative change of each head's output when the keys are corrupted (lower = more robust):\n")
    table = markdown_table(["attention", "softmax evaluations", "relative output change"],
                           [[name, n_iter, f"{change:.4f}"] for name, n_iter, change in rows], align="lrr")
    print("\n".join(table))
    return 0
