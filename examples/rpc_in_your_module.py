"""RPC-Attention as a layer of your own PyTorch module.

``rpc_attention.nn.RPCAttention`` takes and returns ``(batch, tokens, dim)`` like any attention layer, so
it goes wherever ``nn.MultiheadAttention`` or timm's ``Attention`` would. This script builds one small
pre-LN transformer-block classifier three times, with

- ``plain``: ``rpc_attention.nn.Attention``, softmax attention with separate W_Q, W_K, W_V;
- ``symmetric``: ``rpc_attention.nn.SymmetricAttention``, ``softmax(s K K^T) V`` (the keys are the queries);
- ``rpc``: ``rpc_attention.nn.RPCAttention``, symmetric attention whose keys are cleaned by Principal
  Attention Pursuit (the same parameters as ``symmetric``, so its weights load into it unchanged),

trains each for a few steps on random sequences whose label is readable from the tokens, and prints the
first and last training loss, the accuracy on held-out sequences and, for RPC, how much of the keys PAP's
sparse part S took (``keep_state`` records PAP's final state, ``rpc_attention.functional.sparse_activity``
reads it; where S stays 0 the layer acts as iterated attention, not robust PCA:
docs/analysis.md#pap-sparse-step-activity). ``symmetric`` and ``rpc`` start from the same weights (one
seed, the same parameters).

Needs only the core: ``pip install rpc-attention`` (torch and numpy).

Run (seconds on a laptop CPU; nothing is written)::

    python examples/rpc_in_your_module.py
    python examples/rpc_in_your_module.py --steps 200 --n-iter 2 --lambd 1
    python examples/rpc_in_your_module.py --tiny          # the size the test runs
"""

import argparse
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn

from rpc_attention.functional import sparse_activity
from rpc_attention.nn import Attention, RPCAttention, SymmetricAttention

ATTENTIONS = ("plain", "symmetric", "rpc")


class TinyClassifier(nn.Module):
    """Linear token embedding, one pre-LN transformer block, mean pooling, a linear head."""

    def __init__(self, attn: nn.Module, in_features: int, dim: int, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None) -> Tensor:
        # attn_mask (bool, True = may attend, broadcastable to (B, heads, N, N)) reaches the attention as
        # it would a timm block's; PAP honours it in every iteration
        h = self.embed(x)
        h = h + self.attn(self.norm1(h), attn_mask=attn_mask)
        h = h + self.mlp(self.norm2(h))
        return self.head(self.norm(h).mean(dim=1))


def make_attention(kind: str, dim: int, heads: int, n_iter: int, lambd: float) -> nn.Module:
    if kind == "plain":
        return Attention(dim, num_heads=heads, qkv_bias=True)
    if kind == "symmetric":
        return SymmetricAttention(dim, num_heads=heads, qkv_bias=True)
    return RPCAttention(dim, num_heads=heads, qkv_bias=True, n_iter=n_iter, lambd=lambd)


def make_data(n: int, tokens: int, features: int, classes: int, gen: torch.Generator):
    """Gaussian token sequences; the label is the class whose feature has the largest mean over tokens."""
    x = torch.randn(n, tokens, features, generator=gen)
    return x, x[..., :classes].mean(dim=1).argmax(dim=-1)


def pap_sparsity(model: TinyClassifier, x: Tensor) -> Dict[str, float]:
    """How much of the keys PAP's sparse part S took in one forward of ``x`` (its final pass)."""
    attn = model.attn
    attn.keep_state = True  # the layer keeps S, L, Y of its last forward in attn.last_state
    try:
        with torch.no_grad():
            model(x)
        state = attn.last_state
    finally:
        attn.keep_state, attn.last_state = False, None
    # PAP's final keys are K2 = K - S - Y / mu, so the keys it was given are K2 + S + Y / mu
    keys = state.cleaned_keys + state.sparse + state.dual / state.mu
    return sparse_activity(state, keys)


def train_one(kind: str, args, data) -> Dict:
    (x, y), (x_test, y_test) = data
    torch.manual_seed(args.seed)
    model = TinyClassifier(make_attention(kind, args.dim, args.heads, args.n_iter, args.lambd), args.features,
                           args.dim, args.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses: List[float] = []
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % len(x)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        logits = model(x_test)
    result = {"model": model, "losses": losses, "logits": logits,
              "accuracy": float((logits.argmax(-1) == y_test).float().mean()),
              "params": sum(p.numel() for p in model.parameters())}
    if kind == "rpc":
        result["sparsity"] = pap_sparsity(model, x_test)
    return result


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attention", default=",".join(ATTENTIONS), help="comma-separated, from " + ", ".join(ATTENTIONS))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--n-iter", type=int, default=6, help="PAP iterations (softmax evaluations) of the RPC layer")
    p.add_argument("--lambd", type=float, default=4.0, help="PAP sparsity weight (official: 4)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--tiny", action="store_true", help="a few steps on short sequences (seconds)")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.tokens, args.dim, args.heads, args.n_iter = 8, 8, 16, 2, 3
    bad = [k for k in args.attention.split(",") if k not in ATTENTIONS]
    if bad:
        p.error(f"--attention: unknown {', '.join(bad)} (choose from {', '.join(ATTENTIONS)})")
    return args


def main(argv=None) -> Dict[str, Dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    data = (make_data(args.steps * args.batch, args.tokens, args.features, args.classes, gen),
            make_data(256, args.tokens, args.features, args.classes, gen))
    results = {}
    for kind in args.attention.split(","):
        res = results[kind] = train_one(kind, args, data)
        print(f"{kind:>9}: {res['params']} parameters, loss {res['losses'][0]:.3f} -> {res['losses'][-1]:.3f} "
              f"in {args.steps} steps, held-out accuracy {100 * res['accuracy']:.1f} %")
        if "sparsity" in res:
            rec = res["sparsity"]
            print(f"{'':>9}  PAP n_iter={args.n_iter} lambd={args.lambd:g}: S non-zero in "
                  f"{100 * rec['frac_nonzero']:.2f} % of key entries, ||S|| / ||K|| = {rec['s_over_k']:.3g}"
                  + ("" if rec["frac_nonzero"] > 0 else " (S = 0: the layer acted as iterated attention)"))
    return results


if __name__ == "__main__":
    main()
