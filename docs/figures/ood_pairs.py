"""AUROC of the `ood` suite's three scores (-max softmax, -max logit, energy) for a trained Fashion-MNIST
run against several OOD sets built from the embedded data: the suite's default (MNIST-5k digits), inverted
digits, inverted / vertically flipped / 90-degree-rotated Fashion-MNIST test images, uniform and Gaussian
noise images, and scikit-learn's 8x8 digits upscaled to 28x28. In-distribution: the run's first N test
images; each OOD set has N images (seeded). Used to choose the studies' OOD set and score
(docs/robustness.md#ood-imagenet-oar); the suite itself offers MNIST digits, the 8x8 digits
(``ood.ood_set``) and ImageNet-O.

    python docs/figures/ood_pairs.py RUN_DIR [N]      # N = 1000: about a minute on one core
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from rpc_attention.data import images
from rpc_attention.evaluate.inputs import Normalized, load_eval_data, norm_stats
from rpc_attention.evaluate.ood import SCORES, auroc, match_format, ood_scores
from rpc_attention.evaluate.predict import predict_logits
from rpc_attention.train import run_loader


def ood_sets(x_in: torch.Tensor, n: int) -> dict:
    """The candidate OOD sets, each ``[n, C, H, W]`` in [0, 1] shaped like ``x_in``."""
    g = torch.Generator().manual_seed(0)
    digits = np.asarray(images.mnist5k()[0])[:n]
    small = images.digits8x8()[0][:n]
    return {
        "MNIST-5k digits (the default)": match_format(digits, x_in),
        "inverted MNIST digits": 1 - match_format(digits, x_in),
        "inverted Fashion-MNIST": 1 - x_in,
        "vertically flipped Fashion-MNIST": x_in.flip(-2),
        "Fashion-MNIST rotated 90 degrees": x_in.rot90(1, (-2, -1)),
        "uniform noise": torch.rand(x_in.shape, generator=g),
        "Gaussian noise (0.5 +- 0.25)": (0.5 + 0.25 * torch.randn(x_in.shape, generator=g)).clamp(0, 1),
        "scikit-learn 8x8 digits (ood_set=digits8x8)": match_format(small, x_in),
    }


def main(run: str, n: int) -> None:
    torch.set_num_threads(1)
    model, cfg, _, _ = run_loader(run)("cpu")
    model.eval()
    x_in, _ = load_eval_data(cfg, "test", n)
    scorer = Normalized(model, *norm_stats(cfg, x_in.shape[1]))
    s_in = ood_scores(predict_logits(scorer, x_in, 250, "cpu", desc="in-distribution"))
    print(f"AUROC (%) of {n} {cfg['data'].get('name')} test images against each OOD set; scores: "
          + ", ".join(SCORES))
    for name, x_out in ood_sets(x_in, n).items():
        s_out = ood_scores(predict_logits(scorer, x_out, 250, "cpu", desc=name))
        print(f"{name:44s} " + " / ".join(f"{100 * auroc(s_in[k], s_out[k]):.1f}" for k in SCORES))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
