"""Family-wise error of the verdict rule with both variance sources, measured on simulated studies.

Each simulated study has m claims with no effect; each claim's per-seed differences are its test examples'
shared part (the same for every seed), each seed's own example noise and a seed effect (centred exponential,
skewness 2, or normal); the rule decides every family with and without the example part
(``report.power.family_decisions``, the report's own rule on arrays). Prints one row per case:

    python benchmarks/decision_simulation.py --studies 40000
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "report"))

from test_decision_simulation import _studies  # noqa: E402  (the tests' simulator: one definition)

from rpc_attention.markdown import markdown_table  # noqa: E402
from rpc_attention.report.power import (  # noqa: E402
    CONTRADICT,
    EQUIVALENT_CODE,
    REPRODUCE,
    SMALLER_CODE,
    family_decisions,
)

CASES = [(4, 3, 1.0, 5.0), (13, 5, 1.0, 10.0), (4, 10, 0.2, 10.0), (2, 21, 1.0, 2.0), (13, 10, 1.0, 3.0)]


FULL_CASES = [(13, 6, 1.0, 5.0), (18, 10, 1.0, 10.0), (4, 21, 0.5, 2.0)]


def full_rule(studies: int) -> None:
    """The five-verdict rule (with the test against the target): the family-wise rate of any false verdict
    (reproduced at delta <= margin, contradicted at delta >= -margin, equivalent at |delta| >= margin, smaller
    at delta >= target) with every claim's true effect at zero, at the margin, half-way to the target and at the
    target; margin 0.5, target 2 (in units of the seed sd), 200 shared examples per claim."""
    rows = []
    margin, target = 0.5, 2.0
    for m, n, seed_sd, shared in FULL_CASES:
        for effect in (0.0, margin, (margin + target) / 2, target):
            rng = np.random.default_rng(7 + m * n + int(10 * effect))
            d, se = _studies(rng, studies, m, n, examples=200, seed_sd=seed_sd, shared_sd=shared, own_sd=3.0,
                             effect=effect)
            codes = family_decisions(d, np.full(m, margin), se, target=np.full(m, target))
            false = (((codes == REPRODUCE) & (effect <= margin)) | ((codes == CONTRADICT) & (effect >= -margin))
                     | ((codes == EQUIVALENT_CODE) & (abs(effect) >= margin))
                     | ((codes == SMALLER_CODE) & (effect >= target)))
            rows.append([m, n, seed_sd, shared, f"{effect:g}", f"{float(false.any(axis=-1).mean()):.4f}",
                         f"{float((codes != 0).mean()):.3f}"])
    print("\n".join(markdown_table(["claims", "seeds", "seed sd", "shared example sd", "true effect",
                                    "family-wise error, five verdicts", "share decided"], rows)))
    print(f"\n{studies} studies per row; margin {margin}, target {target}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=40000)
    args = ap.parse_args()
    rows = []
    for m, n, seed_sd, shared in CASES:
        for skew in (True, False):
            rng = np.random.default_rng(2026 + m * n)
            d, se = _studies(rng, args.studies, m, n, examples=200, seed_sd=seed_sd, shared_sd=shared, own_sd=3.0,
                             skew=skew)
            rate = lambda codes: float(np.mean(np.isin(codes, (REPRODUCE, CONTRADICT)).any(axis=-1)))  # noqa: E731
            rows.append([m, n, seed_sd, shared, "exponential" if skew else "normal",
                         f"{rate(family_decisions(d, np.zeros(m), se)):.4f}",
                         f"{rate(family_decisions(d, np.zeros(m))):.4f}"])
    mc = 3.5 * math.sqrt(0.05 * 0.95 / args.studies)
    full_rule(args.studies)
    print("\n".join(markdown_table(["claims", "seeds", "seed sd", "shared example sd", "seed effects",
                                    "family-wise error, the rule", "seed test alone"], rows)))
    print(f"\n{args.studies} null studies per row, 200 examples per claim (each seed's own example sd 3); 3.5 "
          f"Monte-Carlo standard errors of a 5 % rate: {mc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
