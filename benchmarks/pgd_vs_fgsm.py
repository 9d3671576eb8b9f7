"""PGD against FGSM on a tiny RPC-SymViT trained for two epochs on 2,000 Fashion-MNIST test images
5000-6999 (the test suite's fixture), scored on the first 200 test images, eps 1..6/255:
``python benchmarks/pgd_vs_fgsm.py`` (one thread, about a minute on an idle core)."""

import numpy as np
import timm
import torch

import rpc_attention.models  # noqa: F401  (registers the models in timm)
from rpc_attention.data.images import fashion_mnist
from rpc_attention.evaluate import suites as S
from rpc_attention.evaluate.attacks import InputSpace, make_attack

MEAN, STD = 0.2860, 0.3530


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("rpc_symvit_tiny_patch16_224", num_classes=10, img_size=28, in_chans=1, patch_size=7,
                              embed_dim=32, depth=1, num_heads=2, rpc_layers="all", n_iter=2)
    xi, yi = fashion_mnist("test")
    x = ((torch.from_numpy(np.array(xi[5000:7000])).float() / 255 - MEAN) / STD).unsqueeze(1)
    y = torch.from_numpy(np.array(yi[5000:7000])).long()
    opt = torch.optim.AdamW(model.parameters(), 3e-3)
    for _ in range(2):
        for i in range(0, 2000, 100):
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 100]), y[i:i + 100])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def main() -> None:
    torch.set_num_threads(1)
    model = tiny_model()
    xi, yi = fashion_mnist("test")
    x = torch.from_numpy(np.array(xi[:200])).float().div(255).unsqueeze(1)
    y = torch.from_numpy(np.array(yi[:200])).long()
    space = InputSpace(model, torch.tensor([MEAN]), torch.tensor([STD]), "pixel")

    def accuracy(name: str, eps: float, **kw) -> float:
        opts = dict(S.resolve_options(S.get_suite(name), {}), **kw)
        adv = make_attack(name, space, eps, opts)(x, y)
        with torch.no_grad():
            return float((space.image_model(adv).argmax(-1) == y).float().mean() * 100)

    print("eps    FGSM  PGD-20 last iterate  PGD-20 first misclassified  PGD-10 first misclassified")
    for k in range(1, 7):
        eps = k / 255
        print(f"{k}/255  {accuracy('fgsm', eps):5.1f}  {accuracy('pgd', eps, keep_best=False):19.1f}  "
              f"{accuracy('pgd', eps):26.1f}  {accuracy('pgd', eps, steps=10):26.1f}")


if __name__ == "__main__":
    main()
