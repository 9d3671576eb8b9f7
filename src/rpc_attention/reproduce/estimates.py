"""Time estimates per stage kind, from constants calibrated on the development machine (2 shared CPU
cores, torch 2.14 CPU, one process). They only feed ``--dry-run`` and the report's "estimate" column;
nothing depends on them being right. Recalibrate by running a study and comparing the ``seconds`` in
``DIR/stages/*.done.json`` with ``estimate_s`` (the report prints both side by side).

Units: "sample-passes" = examples x (forward+backward passes); costs are seconds per 1,000.
"""

from __future__ import annotations

from typing import Optional

from ..evaluate.suites import Cost

# seconds per 1,000 training samples (forward + backward + optimiser), per model family, at the
# preset sizes used by the fmnist/wiki studies (width 64-96, depth 4-6, 28x28 images with patch 4,
# or 64-token LM contexts); RPC variants add PAP_EXTRA per extra softmax evaluation per layer.
# vision: per 1k images (process CPU time of a training step on the fmnist-* presets is ~1.5 ms/image on
# one thread; two threads give ~1 ms); lm: per 1k sequences of the wiki-* presets (context 128);
# seg: per 1k 64x64 scenes.
# The constants are fitted to the stage times (DIR/stages/*.done.json "seconds") of the three-seed `quick`
# study on an idle 2-core machine with two threads; docs/reproduce.md#cost-estimates lists those times.
TRAIN_S_PER_1K = {"vision": 1.35, "lm": 18.5, "seg": 6.0, "scaled": 1.45}
PAP_EXTRA = 0.05          # relative cost of one extra softmax evaluation in one layer (small models)
TRAIN_OVERHEAD_S = 10.0   # model build, data load, final evaluation, checkpoint
# seconds per 1,000 forward passes (batch inference) and forward+backward passes (attacks)
FWD_S_PER_1K = 0.3
FWDBWD_S_PER_1K = 1.1
EVAL_OVERHEAD_S = 0.7
CORRUPT_S_PER_1K_IMAGES = 1.2   # imagecorruptions on 28x28 images
ANALYZE_S = 4.0
COMPARE_S = 5.0
REPORT_S = 6.0


def pap_factor(n_iter: int = 1, rpc_layers: int = 0, depth: int = 1) -> float:
    extra = max(int(n_iter) - 1, 0) * max(int(rpc_layers), 0) / max(int(depth), 1)
    return 1.0 + PAP_EXTRA * extra * max(int(depth), 1)


def train_estimate(family: str, samples: int, factor: float = 1.0) -> float:
    return TRAIN_OVERHEAD_S + TRAIN_S_PER_1K.get(family, 2.0) * samples / 1000.0 * factor


def eval_estimate(cost: Cost, n_examples: int, factor: float = 1.0, copies: int = 1,
                  n_eps: Optional[int] = None, steps: Optional[int] = None) -> float:
    """Seconds for a suite of cost ``cost`` (the suite's :class:`~rpc_attention.evaluate.suites.Cost`)
    on ``n_examples`` (``copies`` corrupted copies each; ``n_eps`` budgets of a sweep and ``steps``
    gradient steps per budget where the study sets them)."""
    if cost.full_split_s is not None:
        return cost.full_split_s * factor * (1.0 if n_examples >= 10000 else max(0.2, n_examples / 10000))
    fwd, bwd = cost.passes(n_eps, steps)
    t = EVAL_OVERHEAD_S + n_examples * copies * (fwd * FWD_S_PER_1K + bwd * FWDBWD_S_PER_1K) / 1000.0 * factor
    if cost.corrupts:
        t += CORRUPT_S_PER_1K_IMAGES * n_examples * copies / 1000.0
    return t
