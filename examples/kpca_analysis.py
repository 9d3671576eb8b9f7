"""The kernel-PCA analysis of any timm model's attention (``rpc_attention.kpca``).

The kernel-PCA reading of self-attention (Teo & Nguyen, NeurIPS 2024) says that a head projects its query
feature varphi(q) onto principal axes of the keys' feature space, with the values as the coefficients.
``rpc_attention.kpca`` measures what that predicts, layer by layer and in float64 (docs/analysis.md):

- ``jproj`` = ||varphi(q)||^2 - ||h||^2, the projection loss, with its two terms ``phi2`` and ``h2``;
- the alignment of the learned values V with the values V_hat that kernel PCA of the keys gives
  (``optimal_cosine``, ``linear_cka``, ...), printed next to the same metric between independent
  Gaussian matrices of the same shape (``chance_baselines``);
- for PAP blocks (``rpc_symvit_*``), how much of the keys the sparse part S took (``pap_stats``).

``AttentionCapture(model)`` hooks every attention module it knows (this library's, timm's ``Attention``,
Hugging Face self-attention), so one forward of a batch records q, k and v; ``analyze_captures`` does
the rest. The Gram-matrix metrics need a head dimension no larger than the token count (a layer with more
is reported as not applicable). The model here is randomly initialised (``pretrained=False``) and fed
seeded random images; ``--checkpoint FILE`` loads weights you have (a state dict, ``.safetensors`` or a
``torch.save`` file).

Needs ``pip install 'rpc-attention[eval]'`` (timm and the analysis toolkit's scipy / scikit-learn).

Run (nothing is written unless ``--out FILE.json``)::

    python examples/kpca_analysis.py                                     # timm's vit_tiny at 128x128 (65 tokens), 2 images
    python examples/kpca_analysis.py --model deit_small_patch16_224 --img-size 224 --checkpoint deit_s.safetensors
    python examples/kpca_analysis.py --model rpc_symvit_tiny_patch16_224 --kwarg lambd=0.5
    python examples/kpca_analysis.py --tiny     # the size the test runs: 16x16 images, 4-pixel patches, 2 blocks

``rpc-attention analyze --timm NAME --out DIR`` runs the same analysis from the command line, with FGSM and
noise probes, figures and a written verdict.
"""

import argparse
import ast
import json
from typing import Any, Dict, List, Optional

import timm
import torch

import rpc_attention.models  # noqa: F401  (registers symvit_* / rpc_symvit_* with timm)
from rpc_attention.kpca import AttentionCapture, analyze_captures, chance_baselines, pap_stats


def parse_kwargs(items: List[str]) -> Dict[str, Any]:
    """``NAME=VALUE`` strings as ``timm.create_model`` keywords (``VALUE`` a Python literal, else a string)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--kwarg {item!r}: expected NAME=VALUE")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value
    return out


def load_weights(model: torch.nn.Module, path: str) -> None:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)


def capture(model: torch.nn.Module, x: torch.Tensor):
    with AttentionCapture(model) as cap, torch.no_grad():
        model(x)
    if cap.errors:
        print("not captured:", "; ".join(f"{e['layer']}: {e['error']}" for e in cap.errors))
    return cap.captures


def shapes(captures) -> set:
    """The (tokens, value dim) of each layer, for its chance level."""
    return {(c.tokens, int(c.values().shape[-1])) for c in captures}


def _m(stat: Optional[Dict]) -> float:
    return float("nan") if not stat or stat.get("mean") is None else stat["mean"]


def report(protocol: str, res: Dict, chance: Dict[str, Dict]) -> None:
    print(f"protocol {protocol}:")
    for layer in res["layers"]:
        level = chance.get(f"{layer['tokens']}x{layer['value_dim']}")
        align = (f"optimal cosine {_m(layer.get('optimal_cosine')):.4f} (chance "
                 f"{level['optimal_cosine']['mean']:.4f} +- {level['optimal_cosine']['std']:.4f})"
                 if level and "optimal_cosine" in layer else f"alignment {layer.get('gram', 'not computed')}")
        print(f"  {layer['name']} ({layer['kind']}, N={layer['tokens']}, d={layer['head_dim']}): "
              f"jproj {_m(layer['jproj']):.4g} = phi2 {_m(layer['phi2']):.4g} - h2 {_m(layer['h2']):.4g}; {align}")
    model = res["model"]
    print(f"  model: jproj {_m(model.get('jproj')):.4g}, optimal cosine {_m(model.get('optimal_cosine')):.4f}")
    for failure in res["failures"]:
        print(f"  failed: {failure}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_tiny_patch16_224", help="any timm model name (random init)")
    p.add_argument("--img-size", type=int, default=128, help="128: 65 tokens, enough for head dim 64")
    p.add_argument("--kwarg", action="append", default=[], metavar="NAME=VALUE",
                   help="a timm.create_model keyword (repeatable), e.g. patch_size=8, depth=4, lambd=0.5")
    p.add_argument("--checkpoint", default=None, help="weights to load (state dict: .safetensors or torch.save)")
    p.add_argument("--batch", type=int, default=2, help="probe images")
    p.add_argument("--protocol", choices=("exact", "paper", "both"), default="exact",
                   help="exact: the definitions on the raw q, k; paper: the official code's standardised q, k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default; 1 on a busy machine)")
    p.add_argument("--out", default=None, help="write every number to this JSON file (default: nothing written)")
    p.add_argument("--tiny", action="store_true", help="16x16 images, patch_size=4, depth=2, embed_dim=32, num_heads=4 "
                   "(head dim 8 <= 17 tokens, so every metric applies); --kwarg still overrides")
    args = p.parse_args(argv)
    if args.tiny:
        args.img_size = 16
        args.kwarg = ["patch_size=4", "depth=2", "embed_dim=32", "num_heads=4"] + args.kwarg
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    kwargs = dict({"img_size": args.img_size}, **parse_kwargs(args.kwarg))
    model = timm.create_model(args.model, pretrained=False, **kwargs).eval()
    if args.checkpoint:
        load_weights(model, args.checkpoint)
    # uniform random pixels, normalised with the model's own mean and std, as its real inputs would be
    data = timm.data.resolve_data_config({}, model=model)
    c = int(kwargs.get("in_chans", data["input_size"][0]))
    mean, std = (data["mean"], data["std"]) if len(data["mean"]) == c else ((0.5,) * c, (0.5,) * c)
    x01 = torch.rand(args.batch, c, args.img_size, args.img_size, generator=torch.Generator().manual_seed(args.seed))
    x = (x01 - torch.tensor(mean).view(c, 1, 1)) / torch.tensor(std).view(c, 1, 1)
    captures = capture(model, x)
    print(f"{args.model} {kwargs}: {len(captures)} attention layers captured on {args.batch} random images")
    chance = chance_baselines(shapes(captures), seed=args.seed)
    out: Dict[str, Any] = {"model": args.model, "kwargs": kwargs, "chance": chance, "pap": pap_stats(captures)}
    for protocol in (("exact", "paper") if args.protocol == "both" else (args.protocol,)):
        out[protocol] = analyze_captures(captures, protocol, seed=args.seed)
        report(protocol, out[protocol], chance)
    for name, stats in out["pap"].items():
        print(f"PAP {name}: S non-zero in {100 * (1 - stats['zero_fraction']):.2f} % of key entries, "
              f"||S|| / ||K|| = {stats['rel_norm']:.3g}, mean threshold {stats['tau_mean']:.3g}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
