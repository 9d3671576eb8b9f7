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


def ref_hard_shrink(x, t):
    return torch.where(x.abs() > t, x, torch.zeros_like(x))


def ref_median(values):
    """The lower median (torch.median's convention for an even count), from a sorted list."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def ref_feature_medians(kk, vk):
    """Per feature, the median over the valid tokens."""
    rows = kk[vk]
    return torch.tensor([ref_median(rows[:, j].tolist()) for j in range(kk.shape[1])], dtype=kk.dtype)


def ref_tau(threshold, lambd, mu, kk, vk, causal):
    """The shrinkage threshold of one (batch, head) for each rule, written out directly."""
    if threshold == "mad":  # lambd * 1.4826 * median over (token, feature) of |k - per-feature median|
        centre = ref_feature_medians(kk, vk)
        deviations = (kk[vk] - centre).abs().flatten().tolist()
        return torch.tensor(lambd * 1.4826 * max(ref_median(deviations), 1e-12), dtype=kk.dtype)
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


def ref_outlier_rows(kk, vk, row_lambd):
    """The token rule for one (batch, head): valid tokens whose row score, the median over features of
    |k - per-feature median|, is above median + row_lambd * max(1.4826 * MAD, 1e-12) of the valid
    tokens' scores."""
    centre = ref_feature_medians(kk, vk)
    score = [ref_median([abs(float(kk[n, j]) - float(centre[j])) for j in range(kk.shape[1])])
             for n in range(kk.shape[0])]
    valid_score = [score[n] for n in range(kk.shape[0]) if vk[n]]
    mid = ref_median(valid_score)
    mad = ref_median([abs(x - mid) for x in valid_score])
    limit = mid + row_lambd * max(1.4826 * mad, 1e-12)
    return torch.tensor([bool(vk[n]) and score[n] > limit for n in range(kk.shape[0])])


def ref_pap(k, v, n_iter, lambd, C=None, threshold="lambda_mu", mu_mode="global", valid=None, causal=False,
            lowrank="values", shrink="soft", dual_step=1.0, row_lambd=None):
    """PAP for (B, H, N, d) float64 tensors, one (batch, head) at a time, as docs/method.md#the-loop writes it
    (with the options of docs/method.md#robust-variants: L in key space started at the per-feature
    median, hard shrinkage, a scaled dual step, the token rule putting whole outlier rows into S)."""
    def shrink_fn(x, t, rows):
        s = (ref_shrink if shrink == "soft" else ref_hard_shrink)(x, t)
        s[rows] = x[rows]  # a flagged token's whole row goes into S
        return s

    B, H, N, d = k.shape
    C = H * d if C is None else C
    out = torch.zeros(B, H, N, v.shape[-1], dtype=v.dtype)
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
            rows = torch.zeros(N, dtype=torch.bool) if row_lambd is None else ref_outlier_rows(kk, vk, row_lambd)
            L = torch.zeros_like(kk)
            if lowrank == "keys":
                L = ref_feature_medians(kk, vk).expand_as(kk).clone()
            Y = torch.zeros_like(kk)
            for _ in range(n_iter - 1):
                S = shrink_fn(kk - L + Y / mu, tau, rows)
                K2 = kk - S - Y / mu
                L = ref_softmax_attention(K2, K2, K2 if lowrank == "keys" else vv, 1 / math.sqrt(d), vk, causal)
                Y = Y + dual_step * mu * (kk - L - S)
            S = shrink_fn(kk - L + Y / mu, tau, rows)
            K2 = kk - S - Y / mu
            out[b, h] = ref_softmax_attention(K2, K2, vv, 1 / math.sqrt(d), vk, causal)
    return out


def rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)

