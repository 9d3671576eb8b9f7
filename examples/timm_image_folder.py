"""Train a timm RPC-SymViT on your own images (a torchvision ImageFolder tree).

``import rpc_attention.models`` adds the SymViT / RPC-SymViT / Scaled-Attention ViTs to timm's registry,
so ``timm.create_model("rpc_symvit_tiny_patch16_224", ...)`` builds one like any timm model, and every
size is a keyword (``img_size``, ``patch_size``, ``embed_dim``, ``depth``, ``num_heads``) beside the RPC
options (``rpc_layers``, ``n_iter``, ``lambd``). This script trains one with a plain PyTorch loop on

    DIR/train/CLASS/*.png        (one folder per class; any format torchvision reads)
    DIR/val/CLASS/*.png          (optional: without it the accuracy is measured on the training images)

and prints the loss per epoch, the validation accuracy and how much PAP's sparse part took of the keys.
With ``--out OUT`` it saves ``OUT/model.safetensors`` and ``OUT/model.json`` (the model name, its keyword
arguments and the class names) and checks that timm loads the weights back into the same model; without
``--out`` nothing is written.

Needs ``pip install 'rpc-attention[train]'`` (timm, torchvision, safetensors and Pillow; the S share comes
from ``rpc_attention.train.sparsity``).

Run::

    python examples/timm_image_folder.py DIR
    python examples/timm_image_folder.py DIR --img-size 64 --patch-size 8 --epochs 10 --out runs/mine
    python examples/timm_image_folder.py DIR --model symvit_tiny_patch16_224      # the baseline, no PAP
    python examples/timm_image_folder.py DIR --tiny                               # the size the test runs

``rpc-attention train --preset fmnist-rpc-symvit --set data.name=imagefolder --set data.root=DIR`` trains
on the same tree with the library's trainer (checkpoints, resume, evaluation suites; docs/training.md).
"""

import argparse
import json
from pathlib import Path
from typing import Any, Dict

import timm
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

import rpc_attention.models  # noqa: F401  (registers the rpc_symvit_* / symvit_* models with timm)
from rpc_attention.train.sparsity import measure_sparsity


def folders(root: Path, img_size: int, mean: float, std: float):
    """The training and validation ImageFolders (the validation one is the training one without val/)."""
    if not (root / "train").is_dir():
        raise SystemExit(f"{root}: expected class folders under {root / 'train'} (DIR/train/CLASS/IMAGE)")
    # resize the shorter side, then centre-crop: images of any size and aspect ratio become img_size squares
    base = [transforms.Resize(img_size), transforms.CenterCrop(img_size)]
    tail = [transforms.ToTensor(), transforms.Normalize([mean] * 3, [std] * 3)]
    # ImageFolder reads every image as RGB (grey and RGBA files too)
    train = datasets.ImageFolder(str(root / "train"), transforms.Compose(base + [transforms.RandomHorizontalFlip()] + tail))
    val_dir = root / "val" if (root / "val").is_dir() else root / "train"
    val = datasets.ImageFolder(str(val_dir), transforms.Compose(base + tail))
    if val.classes != train.classes:
        raise SystemExit(f"{val_dir} and {root / 'train'} hold different class folders")
    return train, val, val_dir.name


def model_kwargs(args, num_classes: int) -> Dict[str, Any]:
    kw: Dict[str, Any] = dict(num_classes=num_classes, img_size=args.img_size, patch_size=args.patch_size,
                              embed_dim=args.embed_dim, depth=args.depth, num_heads=args.heads)
    if args.model.startswith("rpc_"):
        kw.update(rpc_layers=args.rpc_layers, n_iter=args.n_iter, lambd=args.lambd)
    return kw


def evaluate(model: nn.Module, loader: DataLoader):
    model.eval()
    correct, logits = 0, []
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            correct += int((out.argmax(-1) == y).sum())
            logits.append(out)
    return correct / len(loader.dataset), torch.cat(logits)


def train(model: nn.Module, loader: DataLoader, args) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    losses = []
    for epoch in range(args.epochs):
        model.train()
        total, seen = 0.0, 0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, seen = total + float(loss.detach()) * len(y), seen + len(y)
        losses.append(total / seen)
        print(f"epoch {epoch + 1}/{args.epochs}: training loss {losses[-1]:.4f}")
    return losses


def save_and_reload(model: nn.Module, args, kwargs: Dict[str, Any], classes, x: torch.Tensor) -> float:
    """Write the weights and settings to ``--out``, build the model again from them through timm, and
    return the largest logit difference between the two on ``x`` (0 when the weights round-trip)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), str(out / "model.safetensors"))
    (out / "model.json").write_text(json.dumps({"model": args.model, "kwargs": kwargs, "classes": classes}, indent=1))
    # the overlay names the class count too: timm re-initialises a classifier whose size differs from the
    # pretrained config's (1000 classes unless told), which would drop the trained head
    overlay = dict(file=str(out / "model.safetensors"), num_classes=kwargs["num_classes"])
    again = timm.create_model(args.model, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs).eval()
    with torch.no_grad():
        return float((again(x) - model(x)).abs().max())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="image folder: DIR/train/CLASS/IMAGE (and DIR/val/CLASS/IMAGE)")
    p.add_argument("--model", default="rpc_symvit_tiny_patch16_224", help="a timm model name")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--embed-dim", type=int, default=96)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--rpc-layers", default="0", help="blocks running PAP (rpc_* models): 'all', '0', '0,2'")
    p.add_argument("--n-iter", type=int, default=6)
    p.add_argument("--lambd", type=float, default=4.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--mean", type=float, default=0.5, help="per-channel normalisation of [0, 1] pixels")
    p.add_argument("--std", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None, help="folder for model.safetensors and model.json (default: none)")
    p.add_argument("--tiny", action="store_true", help="a 2-block model of width 32, 2 epochs, 2 PAP iterations")
    args = p.parse_args(argv)
    if args.tiny:
        args.embed_dim, args.depth, args.heads, args.n_iter, args.epochs = 32, 2, 2, 2, 2
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_set, val_set, val_name = folders(args.root, args.img_size, args.mean, args.std)
    kwargs = model_kwargs(args, len(train_set.classes))
    model = timm.create_model(args.model, **kwargs)
    rpc = getattr(model, "rpc_cfg", {})  # what the library's models record of their attention
    pap = (f"PAP in blocks {rpc['rpc_layers']}, n_iter={rpc['n_iter']}, lambd={rpc['lambd']:g}"
           if rpc.get("rpc_layers") else "no PAP block")
    print(f"{args.model}: {sum(p.numel() for p in model.parameters())} parameters, {pap}; "
          f"{len(train_set)} training images, {len(train_set.classes)} classes")
    gen = torch.Generator().manual_seed(args.seed)
    losses = train(model, DataLoader(train_set, batch_size=args.batch, shuffle=True, generator=gen), args)
    val_loader = DataLoader(val_set, batch_size=args.batch)
    accuracy, logits = evaluate(model, val_loader)
    print(f"{val_name} accuracy: {100 * accuracy:.1f} % of {len(val_set)} images")
    x = next(iter(val_loader))[0]
    for rec in measure_sparsity(model, lambda: model(x)):
        print(f"{rec['layer']}: S non-zero in {100 * rec['frac_nonzero']:.2f} % of key entries ({rec['verdict']})")
    result = {"model": model, "classes": train_set.classes, "losses": losses, "accuracy": accuracy, "logits": logits,
              "kwargs": kwargs}
    if args.out:
        result["reload_max_diff"] = save_and_reload(model, args, kwargs, train_set.classes, x)
        print(f"saved to {args.out}; reloaded through timm, largest logit difference {result['reload_max_diff']:g}")
    return result


if __name__ == "__main__":
    main()
