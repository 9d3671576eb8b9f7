"""Float64 simulation of PAP under the sparse suite's key corruption (5 % of the key entries moved by
+-5 standard deviations of the keys), on random keys and values shaped like block 1 of the Fashion-MNIST
RPC-SymViT (17 tokens, 3 heads of width 32). Prints, per setting:

- with S = 0 (lambd = inf), for n_iter 1 / 2 / 4 / 6: the mean factor by which the final keys K2 move on
  the corrupted entries (dK2 / delta there; the identity K2_n = L_1 + ... + L_{n-1} - (n - 2) k predicts
  about -(n - 2)), and the relative change ||dK2||_F / ||K2||_F of the final keys against the relative
  change ||delta||_F / ||k||_F of the input keys;
- at the PCP-active preset's threshold (tau = lambd / mu, lambd 3.5, mu on the head width, 6 iterations):
  tau in units of the keys' std and the share of corrupted and of clean entries on which S is non-zero.

Random Gaussian keys are not a trained model's keys; the numbers describe the algorithm, not the model.

It also prints tau and S's activity in the default draw of `rpc-attention pap-demo`.

    python docs/figures/key_corruption.py            # 20 draws, a few seconds on one core
"""

from __future__ import annotations

import math

import torch

from rpc_attention.functional import pap_decompose

B, H, N, D = 1, 3, 17, 32
FRACTION, MAGNITUDE, STD = 0.05, 5.0, 0.3


def draw(seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, N, D, generator=g, dtype=torch.float64) * STD
    v = torch.randn(B, H, N, D, generator=g, dtype=torch.float64) * STD
    hit = torch.rand(B, H, N, D, generator=g, dtype=torch.float64) < FRACTION
    sign = torch.where(torch.rand(B, H, N, D, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    delta = hit * sign * MAGNITUDE * k.std()
    return k, v, hit, delta


def main(draws: int = 20) -> None:
    print("S = 0 (lambd = inf): n_iter, mean dK2/delta on corrupted entries, ||dK2||/||K2|| / (||delta||/||k||)")
    for n_iter in (1, 2, 4, 6):
        factors, ratios = [], []
        for seed in range(draws):
            k, v, hit, delta = draw(seed)
            clean = pap_decompose(k, v, n_iter=n_iter, lambd=math.inf).cleaned_keys
            moved = pap_decompose(k + delta, v, n_iter=n_iter, lambd=math.inf).cleaned_keys
            dk2 = moved - clean
            factors.append(float((dk2[hit] / delta[hit]).mean()))
            ratios.append(float((dk2.norm() / clean.norm()) / (delta.norm() / k.norm())))
        print(f"  n_iter {n_iter}: factor {sum(factors) / draws:+.2f}, relative change ratio {sum(ratios) / draws:.2f}")
    print("PCP-active threshold (lambda_over_mu, lambd 3.5, head_dim mu, 6 iterations):")
    taus, on_hit, on_clean = [], [], []
    for seed in range(draws):
        k, v, hit, delta = draw(seed)
        st = pap_decompose(k + delta, v, n_iter=6, lambd=3.5, threshold="lambda_over_mu", mu_mode="head_dim")
        nz = st.sparse != 0
        taus.append(float(st.tau.mean() / k.std()))
        on_hit.append(float(nz[hit].double().mean()))
        on_clean.append(float(nz[~hit].double().mean()))
    print(f"  tau = {sum(taus) / draws:.1f} key std; S non-zero on {100 * min(on_hit):.0f}-{100 * max(on_hit):.0f} % "
          f"of the corrupted entries (mean {100 * sum(on_hit) / draws:.0f} %) and {100 * sum(on_clean) / draws:.1f} % "
          "of the clean ones")


def pap_demo_regime(trials: int = 8, seed: int = 0) -> None:
    """tau and S activity in `rpc-attention pap-demo`'s default draw (the same generator calls: rank-4
    keys, 197 tokens, 3 heads of 64, 5 % of entries moved by +-5 std, official tau = lambd mu, lambd 4)."""
    g = torch.Generator().manual_seed(seed)
    b, h, n, d, rank = trials, 3, 197, 64, 4
    basis = torch.randn(b, h, rank, d, generator=g)
    coeff = torch.randn(b, h, n, rank, generator=g)
    keys = coeff @ basis / rank ** 0.5
    values = torch.randn(b, h, n, d, generator=g)
    hit = torch.rand(b, h, n, d, generator=g) < 0.05
    noise = torch.randn(b, h, n, d, generator=g).sign() * 5.0 * keys.std()
    st = pap_decompose((keys + hit * noise).double(), values.double(), n_iter=6, lambd=4.0)
    nz = st.sparse != 0
    print(f"pap-demo default draw: tau {float(st.tau.mean()):.2f} (max |k| {float(keys.abs().max()):.2f}, key std "
          f"{float(keys.std()):.2f}); S non-zero on {100 * float(nz[hit].double().mean()):.0f} % of the corrupted "
          f"entries and {100 * float(nz[~hit].double().mean()):.1f} % of the clean ones")


if __name__ == "__main__":
    main()
    pap_demo_regime()
