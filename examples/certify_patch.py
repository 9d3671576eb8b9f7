"""Certify a ViT against an adversarial patch with double masking (PatchCleanser).

A patch of ``p x p`` pixels anywhere in the image lies inside at least one mask of a mask set that covers the
threat. Double masking predicts with every single mask and, where they disagree, with pairs of masks; an image
is **certified** when the prediction with every pair of masks (a mask twice included) is its label: then no
patch of the threat can change the decision, whatever its pixels. This script

1. trains a small timm RPC-SymViT for a few steps on synthetic images (a bright or dark background with
   noise: replace ``make_data`` by your own ``[0, 1]`` images and labels),
2. builds the mask set for a patch of one token's size and the masked classifier (masked tokens are left out
   of the sequence, so no masked pixel reaches the attention),
3. prints clean, defended (the double-masking decision) and certified top-1,
4. pastes random patches at random places on the certified images and checks that the decision holds, a
   sanity check rather than an attack; the adaptive attack on the defence is
   ``rpc-attention eval --run RUN --suite certify --set certify.attack_steps=20`` (docs/robustness.md).

Needs ``pip install 'rpc-attention[eval]'``. Run (seconds on a laptop CPU; nothing is written)::

    python examples/certify_patch.py
    python examples/certify_patch.py --steps 200 --images 200 --img-size 32 --patch-size 4
    python examples/certify_patch.py --tiny          # the size the test runs
"""

import argparse
from typing import Any, Dict

import timm
import torch
from torch import nn

import rpc_attention.models  # noqa: F401  (registers rpc_symvit_* with timm)
from rpc_attention.evaluate.certify import certified, double_masking, pair_predictions
from rpc_attention.evaluate.masking import MaskedClassifier, mask_set
from rpc_attention.evaluate.patch import patch_grid

MEAN, STD = torch.tensor([0.5]), torch.tensor([0.5])


def make_data(n: int, size: int, gen: torch.Generator):
    """Grey images in [0, 1]: class 1 has a bright background, class 0 a dark one, both with noise."""
    y = torch.randint(0, 2, (n,), generator=gen)
    x = (0.3 + 0.4 * y.view(-1, 1, 1, 1) + 0.15 * torch.randn(n, 1, size, size, generator=gen)).clamp(0, 1)
    return x, y


def train(model: nn.Module, args, gen: torch.Generator) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    model.train()
    for _ in range(args.steps):
        x, y = make_data(args.batch, args.img_size, gen)
        loss = nn.functional.cross_entropy(model((x - MEAN) / STD), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def decide(judge: MaskedClassifier, x: torch.Tensor, masks, batch: int):
    """The double-masking decision on ``x`` and the pair table it came from."""
    table = pair_predictions(judge, x, masks, batch, "cpu")
    return double_masking(table, 2)[0], table


def random_patches(x: torch.Tensor, pixels: int, gen: torch.Generator) -> torch.Tensor:
    """``x`` with one square of ``pixels`` random pixel values at a random place in each image."""
    out = x.clone()
    h, w = x.shape[-2:]
    for i in range(len(x)):
        top = int(torch.randint(0, h - pixels + 1, (1,), generator=gen))
        left = int(torch.randint(0, w - pixels + 1, (1,), generator=gen))
        out[i, :, top:top + pixels, left:left + pixels] = torch.rand(x.shape[1], pixels, pixels, generator=gen)
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--img-size", type=int, default=28)
    p.add_argument("--patch-size", type=int, default=7, help="the ViT's token size; the threat is one token's size")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--images", type=int, default=64, help="test images to certify")
    p.add_argument("--tries", type=int, default=4, help="random patches per certified image")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--tiny", action="store_true", help="a few steps on 16 images (seconds)")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.images, args.tries = 30, 16, 2
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = timm.create_model("rpc_symvit_tiny_patch16_224", num_classes=2, img_size=args.img_size,
                              patch_size=args.patch_size, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                              rpc_layers=[0], n_iter=2, lambd=4.0)
    losses = train(model, args, gen)
    x, y = make_data(args.images, args.img_size, gen)
    grid = patch_grid(model, tuple(x.shape))
    masks = mask_set(grid, "patch", args.patch_size)
    judge = MaskedClassifier(model, MEAN, STD, grid, "tokens")
    with torch.no_grad():
        clean = judge(x, torch.zeros(len(x), grid.rows * grid.cols, dtype=torch.bool)).argmax(-1) == y
    labels, table = decide(judge, x, masks, 256)
    defended, cert = labels == y, certified(table, y)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; {masks.count} masks "
          f"({masks.describe()})")
    print(f"clean top-1 {100 * clean.float().mean():.1f} %, defended {100 * defended.float().mean():.1f} %, "
          f"certified {100 * cert.float().mean():.1f} % of {len(x)} images")
    held = torch.ones(0, dtype=torch.bool)
    if cert.any():
        xc, yc = x[cert], y[cert]
        held = torch.cat([decide(judge, random_patches(xc, args.patch_size, gen), masks, 256)[0] == yc
                          for _ in range(args.tries)])
        print(f"random {args.patch_size}x{args.patch_size} patches on the certified images: the decision held in "
              f"{int(held.sum())} of {len(held)}")
    return {"losses": losses, "clean": clean, "defended": defended, "certified": cert, "held": held,
            "masks": masks.count}


if __name__ == "__main__":
    main()
