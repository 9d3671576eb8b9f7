"""Float64 references for the kernel tests, written straight from the method
(docs/method.md#the-loop): plain loops over (batch, head), one line per line of the definition.

Tolerances. Comparisons run in float64 unless a test is about a low-precision path. Float64 results of
the same formula computed in a different order (batched vs per-head loops, fused vs explicit, other
thread counts) differ by ~1e-15 (eps = 2.2e-16 on O(1) values); PAP's passes feed each pass's rounding
into the next keys, so its comparisons allow atol=1e-10 and a single attention 1e-12: far above rounding
on any CPU, far below any real discrepancy (a wrong step or mask moves outputs by >1e-3). Float32 and
lower-precision tests derive their tolerance from the dtype's epsilon and the magnitudes involved.
"""

import math

import torch


def ref_softmax_attention(q, k, v, scale, valid_keys=None, causal=False):
    """softmax(scale q k^T) v for one head; q (N, d), k (M, d), v (M, dv)."""
    scores = (q @ k.T) * scale
    n, m = scores.shape
    allowed = torch.ones(n, m, dtype=torch.bool)
    if valid_keys is not None:
        allowed &= valid_keys[None, :]
    if causal:
        allowed &= torch.ones(n, m, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def ref_shrink(x, t):
    return torch.sign(x) * torch.clamp(x.abs() - t, min=0)


def ref_tau(threshold, lambd, mu, kk, vk, causal):
    """The shrinkage threshold of one (batch, head) for each rule, written out directly."""
    if threshold == "lambda_mu":
        return lambd * mu
    if threshold == "lambda_over_mu":
        return lambd / mu
    n_tok, d = kk.shape
    if threshold == "candes":  # lambd / (sqrt(max(N, d)) mu), N = the valid keys mu was taken over
        if causal:
            counts = torch.tensor([[max(int(vk[: i + 1].sum()), 1)] for i in range(n_tok)], dtype=kk.dtype)
        else:
            counts = torch.tensor(max(int(vk.sum()), 1), dtype=kk.dtype)
        return lambd / (torch.sqrt(torch.clamp(counts, min=d)) * mu)
    assert threshold == "target_fraction"  # ceil(lambd * n) of the n valid |k| entries lie above tau
    mags = sorted(kk[vk].abs().flatten().tolist(), reverse=True)
    return torch.tensor(mags[min(math.ceil(lambd * len(mags)), len(mags) - 1)], dtype=kk.dtype)


def ref_pap(k, v, n_iter, lambd, C=None, threshold="lambda_mu", mu_mode="global", valid=None, causal=False):
    """PAP for (B, H, N, d) float64 tensors, one (batch, head) at a time, as docs/method.md#the-loop writes it."""
    B, H, N, d = k.shape
    C = H * d if C is None else C
    out = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            kk, vv = k[b, h], v[b, h]
            vk = valid[b] if valid is not None else torch.ones(N, dtype=torch.bool)
            width = d if mu_mode in ("head_dim", "causal_head_dim") else C
            if mu_mode in ("causal", "causal_head_dim"):
                mu = torch.zeros(N, 1, dtype=kk.dtype)
                for i in range(N):
                    sel = vk[: i + 1]
                    count = int(sel.sum())
                    total = float(kk[: i + 1][sel].abs().sum())
                    mu[i] = max(count, 1) * width / (4 * max(total, 1e-6))
            else:
                count = int(vk.sum())
                total = float(kk[vk].abs().sum())
                mu = torch.tensor(count * width / (4 * max(total, 1e-6)), dtype=kk.dtype)
            tau = ref_tau(threshold, lambd, mu, kk, vk, causal)
            L = torch.zeros_like(kk)
            Y = torch.zeros_like(kk)
            for _ in range(n_iter - 1):
                S = ref_shrink(kk - L + Y / mu, tau)
                K2 = kk - S - Y / mu
                L = ref_softmax_attention(K2, K2, vv, 1 / math.sqrt(d), vk, causal)
                Y = Y + mu * (kk - L - S)
            S = ref_shrink(kk - L + Y / mu, tau)
            K2 = kk - S - Y / mu
            out[b, h] = ref_softmax_attention(K2, K2, vv, 1 / math.sqrt(d), vk, causal)
    return out


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)

