"""Certify a ViT against one adversarial patch: double masking (PatchCleanser) with the library's API.

``rpc_attention.evaluate.masking`` builds the masks that cover the threat (every square patch of ``P``
pixels placed anywhere lies entirely inside at least one mask: ``mask_set``) and runs the model with a
mask's tokens dropped (``MaskedClassifier``: they are left out of the sequence, so their pixels cannot
move the logits). ``rpc_attention.evaluate.certify`` predicts with every pair of masks
(``pair_predictions``), takes the double-masking decision from that table (``double_masking``) and
certifies an image when every pair predicts its label (``certified``): then no patch of the threat can
change the decision (docs/robustness.md#certified-patch-defence). This script prints on ``--n`` test
images

- clean top-1: the model without masks (undefended);
- defended top-1: the double-masking decision on the clean images;
- certified top-1: the images certified, a lower bound on the defended top-1 under any patch of the threat;
- with ``--attack-steps K``: attacked top-1, the defended decision under PGD on the patch pixels at every
  patch position (``attack_defence``, the ``certify`` suite's adaptive attack); the certified images are
  attacked too, and none may break.

The model is a trained run (``--run DIR``, written by ``rpc-attention train``; its test split and
normalisation come from the run's config) or, without one, a small timm RPC-SymViT trained here for
``--steps`` steps on Fashion-MNIST with masking-aware training (``--token-drop``: each image drops a
random share of its tokens through the key mask, as ``train.token_drop`` does). Nothing is written.

Needs ``pip install 'rpc-attention[eval]'`` (timm and the evaluation suites), and Fashion-MNIST
(``apt-get install dataset-fashion-mnist``) without ``--run``.

Run::

    python examples/certify_patch.py                          # train here first (400 steps), 200 test images
    python examples/certify_patch.py --run runs/fmnist-rpc-symvit --n 500 --attack-steps 10 --attack-stride 7
    python examples/certify_patch.py --patch-pixels 5 --threat patch --masks-per-axis 2
    python examples/certify_patch.py --tiny                   # the size the test runs (seconds)

``rpc-attention eval --run DIR --suite certify`` runs the same measurement with per-example records.
"""

import argparse
from typing import Any, Dict, List, Tuple

import numpy as np
import timm
import torch
from torch import Tensor, nn

import rpc_attention.models  # noqa: F401  (registers rpc_symvit_* with timm)
from rpc_attention.data.images import dataset_info, fashion_mnist
from rpc_attention.evaluate.certify import (
    DefenceAttack,
    attack_defence,
    attack_positions,
    certified,
    double_masking,
    pair_predictions,
)
from rpc_attention.evaluate.inputs import load_eval_data, norm_stats
from rpc_attention.evaluate.masking import MaskedClassifier, drop_tokens_mask, mask_set, random_token_drop
from rpc_attention.evaluate.patch import Variant, patch_grid
from rpc_attention.train import load_run


def images(split: str, n: int) -> Tuple[Tensor, Tensor]:
    """The first ``n`` Fashion-MNIST images of ``split`` as ``[0, 1]`` floats ``[n, 1, 28, 28]`` and labels."""
    x, y = fashion_mnist(split)
    return torch.from_numpy(np.array(x[:n])).float().div(255).unsqueeze(1), torch.from_numpy(np.array(y[:n]))


MODEL = "rpc_symvit_tiny_patch16_224"


def model_kwargs(args) -> Dict[str, Any]:
    return dict(num_classes=10, img_size=28, in_chans=1, patch_size=7, embed_dim=args.embed_dim, depth=args.depth,
                num_heads=args.heads, rpc_layers=[0], n_iter=args.n_iter, lambd=args.lambd)


def train_here(args) -> Tuple[nn.Module, Tensor, Tensor, List[float]]:
    """A small RPC-SymViT (4x4 grid of 7-pixel tokens, PAP in block 0) trained masking-aware; ``(model, mean,
    std, losses)``."""
    info = dataset_info("fashion_mnist")
    mean, std = torch.tensor(info["mean"]), torch.tensor(info["std"])
    torch.manual_seed(args.seed)
    model = timm.create_model(MODEL, **model_kwargs(args))
    x, y = images("train", args.steps * args.batch)
    x = (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    grid = patch_grid(model, tuple(x.shape))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    model.train()
    losses = []
    for step in range(args.steps):
        xb, yb = x[step * args.batch:(step + 1) * args.batch], y[step * args.batch:(step + 1) * args.batch]
        # masking-aware training: the model learns to classify with tokens missing, as the masks leave them
        dropped = random_token_drop(len(yb), grid.cells, args.token_drop)
        loss = nn.functional.cross_entropy(model(xb, attn_mask=drop_tokens_mask(dropped, grid.prefix)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % max(1, args.steps // 5) == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps}: training loss {losses[-1]:.4f}")
    return model.eval(), mean, std, losses


def attack(judge: MaskedClassifier, model: nn.Module, x: Tensor, y: Tensor, masks, args) -> Tensor:
    """Bool ``[N]``: which images keep the right double-masking decision under PGD on the patch pixels at
    every patch position (gradients through the full-length masked passes: ``gather=False``)."""
    keyed = {"gather": False} if args.masking == "tokens" else {}
    grad = MaskedClassifier(model, judge.mean.flatten(), judge.std.flatten(), judge.grid, args.masking, **keyed)
    positions = attack_positions(judge.grid, masks, args.attack_stride, tuple(x.shape[-2:]))
    print(f"attack: {args.attack_steps} PGD steps at {len(positions)} patch positions")
    return attack_defence(judge, {"model": grad}, x, y, masks, [Variant("ce")], positions,
                          DefenceAttack(args.attack_steps, args.attack_step_size),
                          {"device": "cpu", "batch_size": args.eval_batch}, int(model.num_classes), args.seed)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=None, help="a run directory of rpc-attention train (default: train one here)")
    p.add_argument("--n", type=int, default=200, help="test images")
    p.add_argument("--threat", choices=("patch", "token"), default="patch",
                   help="patch: one square anywhere; token: one token replaced")
    p.add_argument("--patch-pixels", type=int, default=0, help="the patch's side in pixels (0: the token size)")
    p.add_argument("--masks-per-axis", type=int, default=0, help="fewer, larger masks (0: stride 1)")
    p.add_argument("--masking", choices=("tokens", "pixels"), default="tokens")
    p.add_argument("--attack-steps", type=int, default=None, help="PGD steps of the adaptive attack (0, the default: "
                   "no attack; --tiny: 2)")
    p.add_argument("--attack-step-size", type=float, default=0.05)
    p.add_argument("--attack-stride", type=int, default=0, help="pixels between patch positions (0: the token size)")
    p.add_argument("--eval-batch", type=int, default=256)
    # training here (without --run)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--token-drop", type=float, default=0.5, help="masking-aware training: drop up to this share")
    p.add_argument("--embed-dim", type=int, default=48)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--n-iter", type=int, default=2)
    p.add_argument("--lambd", type=float, default=4.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--tiny", action="store_true", help="60 training steps of a 1-block model, 32 images, 2 attack steps")
    args = p.parse_args(argv)
    if args.tiny:
        args.steps, args.lr, args.embed_dim, args.depth, args.heads, args.n = 60, 3e-3, 32, 1, 2, 32
    if args.attack_steps is None:
        args.attack_steps = 2 if args.tiny else 0
    if args.attack_steps and args.threat != "patch":
        p.error("--attack-steps: the attack runs on the patch threat (its positions include the token-aligned ones)")
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run:
        model, cfg = load_run(args.run)
        x, y = load_eval_data(cfg, "test", args.n)  # [0, 1] pixels; the normalisation is the run's
        mean, std = norm_stats(cfg, x.shape[1])
        losses: List[float] = []
    else:
        model, mean, std, losses = train_here(args)
        x, y = images("test", args.n)
    grid = patch_grid(model, tuple(x.shape))
    judge = MaskedClassifier(model, mean, std, grid, args.masking)
    masks = mask_set(grid, args.threat, args.patch_pixels if args.threat == "patch" else 0, args.masks_per_axis)
    print(masks.describe())
    with torch.no_grad():
        clean = judge(x, torch.zeros(len(x), grid.cells, dtype=torch.bool)).argmax(-1) == y
    table = pair_predictions(judge, x, masks, args.eval_batch, "cpu")   # [N, M, M]: every pair of masks
    labels, passes = double_masking(table, int(model.num_classes))
    defended, cert = labels == y, certified(table, y)
    res: Dict[str, Any] = {"model": model, "losses": losses, "masks": masks, "table": table, "clean": clean, "defended": defended,
                           "certified": cert, "clean_top1": 100 * float(clean.float().mean()),
                           "defended_top1": 100 * float(defended.float().mean()),
                           "certified_top1": 100 * float(cert.float().mean())}
    print(f"{len(y)} test images: clean top-1 {res['clean_top1']:.1f} %, defended top-1 {res['defended_top1']:.1f} % "
          f"({float(passes.float().mean()):.1f} masked passes per image), certified top-1 {res['certified_top1']:.1f} %")
    if args.attack_steps:
        survived = defended.clone()
        idx = defended.nonzero().flatten()   # the certified ones too: the certificate says none breaks
        if len(idx):
            survived[idx] = attack(judge, model, x[idx], y[idx], masks, args)
        res["survived"], res["attacked_top1"] = survived, 100 * float(survived.float().mean())
        res["certified_broken"] = int((cert & ~survived).sum())
        print(f"attacked top-1 {res['attacked_top1']:.1f} %; certified images broken: {res['certified_broken']}")
    return res


if __name__ == "__main__":
    main()
