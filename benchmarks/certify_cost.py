#!/usr/bin/env python
"""Cost of the certified patch defence (docs/robustness.md#certified-patch-defence), one CPU thread, in CPU
time (``time.process_time``: on a shared machine it moves less with the load than wall time).

On the quick study's models (28x28 images, patch 7, width 96, 6 blocks, 6 heads; untrained: the cost does not
depend on the weights, except for how often the single masks disagree) it times, as the median of 5 rounds
after warm-up:

1. one plain forward of a batch of images (the undefended classifier, no mask);
2. the masked forwards of the same images with M masks, batched (every masked copy in one batch of
   ``images x M``): the work of the defence on images whose single masks agree;
3. the full pair table (``M (M + 1) / 2`` masked copies per image, in batches of ``images x M``, as the
   suite runs it: ``pair_predictions``): the work of the certificate;

each with the masked tokens left out of the sequence (the suite's path) and, for comparison, kept and
hidden by the key mask (``gather=False``),

and reports (2) / (M x 1) and (3) / (M (M + 1) / 2 x 1): a ratio at or below 1 means the defence costs no
more than its mask count times one forward pass. The threats: one 7x7 patch anywhere (9 masks) and one
token (16 masks).

    nice -n 10 python benchmarks/certify_cost.py
    python benchmarks/certify_cost.py --smoke     # tiny shapes, seconds (the test suite runs this)
"""

import os
import statistics
import sys
import time

import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the SymViT family)
from rpc_attention.evaluate.certify import pair_predictions
from rpc_attention.evaluate.inputs import Normalized
from rpc_attention.evaluate.masking import MaskedClassifier, mask_set
from rpc_attention.evaluate.patch import patch_grid

MODELS = {
    "SymViT": ("symvit_tiny_patch16_224", {}),
    "RPC-SymViT 6iter/layer1": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 6}),
    "robust PAP 2iter/layer1": ("rpc_symvit_tiny_patch16_224", {"rpc_layers": [0], "n_iter": 2, "lambd": 6.0,
                                                                "threshold": "mad", "lowrank": "keys",
                                                                "shrink": "hard", "dual_step": 0.0}),
}


def timed(fn, args: tuple, rounds: int = 5) -> float:
    """Median over rounds of the CPU time of one call ``fn(*args)`` (ms), after 2 warm-up calls."""
    for _ in range(2):
        fn(*args)
    out = []
    for _ in range(rounds):
        start = time.process_time()
        fn(*args)
        out.append((time.process_time() - start) * 1e3)
    return statistics.median(out)


def main(smoke: bool = False) -> list:
    torch.set_num_threads(1)
    size = dict(embed_dim=16, depth=1, num_heads=2) if smoke else dict(embed_dim=96, depth=6, num_heads=6)
    images, rounds = (2, 1) if smoke else (20, 5)
    x = torch.rand(images, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    stats = (torch.tensor([0.286]), torch.tensor([0.353]))
    lines = ["| model | threat | masks M | path | 1 forward (ms) | M masked forwards (ms) | ratio to M x 1 | "
             "pair table (ms) | ratio to M(M+1)/2 x 1 |", "|---|---|---|---|---|---|---|---|---|"]
    for label, (name, kw) in MODELS.items():
        vit = timm.create_model(name, img_size=28, patch_size=7, in_chans=1, num_classes=10, **size, **kw).eval()
        grid = patch_grid(vit, x.shape)
        with torch.no_grad():
            plain = timed(Normalized(vit, *stats), (x,), rounds)
            for threat in ("patch", "token"):
                masks = mask_set(grid, threat)
                m = masks.count
                pairs = m * (m + 1) // 2
                singles_x, singles = x.repeat_interleave(m, 0), masks.dropped.repeat(images, 1)
                for path, gather in (("shortened", True), ("key mask", False)):
                    model = MaskedClassifier(vit, *stats, grid, gather=gather)
                    one = timed(model, (singles_x, singles), rounds)
                    table = timed(pair_predictions, (model, x, masks, images * m, "cpu"), rounds)
                    lines.append(f"| {label} | {threat} | {m} | {path} | {plain:.2f} | {one:.2f} | "
                                 f"{one / (m * plain):.2f} | {table:.1f} | {table / (pairs * plain):.2f} |")
    return lines


if __name__ == "__main__":
    smoke = "--smoke" in sys.argv
    print(f"{2 if smoke else 20} images, 1 thread, CPU time; load average {os.getloadavg()}")
    print("\n".join(main(smoke)))
