"""``rpc-attention analyze``: kernel-PCA analysis of a run, a timm model or a Hugging Face model."""

from __future__ import annotations

import argparse

HELP = "Kernel-PCA analysis (J_proj, Gram eigenvectors, value alignment, PAP sparse part) of a model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a training run directory (config.yaml + model.safetensors)")
    src.add_argument("--timm", metavar="NAME", help="a timm model name (random init unless --checkpoint)")
    src.add_argument("--hf", metavar="PATH_OR_CONFIG",
                     help="a local Hugging Face directory with config.json, or a built-in config: "
                          "bert-tiny-config, bert-mini-config, vit-tiny-config (random weights)")
    parser.add_argument("--checkpoint", metavar="FILE", help="weights for --timm (.safetensors or torch state dict)")
    parser.add_argument("--timm-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="extra timm.create_model keyword (repeatable), e.g. img_size=64")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (kpca.json, summary.md, *.png)")
    parser.add_argument("--protocol", choices=("paper", "exact", "both"), default="both",
                        help="paper: per-token standardised q,k (the paper's measurement); exact: the definitions")
    parser.add_argument("--limit", type=int, default=8, help="examples in the probe batch (default 8)")
    parser.add_argument("--ema", action="store_true", help="--run: use the EMA weights")
    parser.add_argument("--seq-len", type=int, default=128, help="--hf text models: random sequence length")
    parser.add_argument("--fgsm-eps", type=float, default=2.0, help="FGSM budget in 1/255 pixel units (RPC study)")
    parser.add_argument("--noise-sigma", type=float, default=0.1, help="Gaussian noise std in pixel units (RPC study)")
    parser.add_argument("--perturb", type=float, default=0.01, help="relative noise of the perturbed-eigenvector control")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def _kwarg(item: str):
    import yaml

    if "=" not in item:
        from . import UserError

        raise UserError(f"--timm-kwarg expects KEY=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    return k.strip(), yaml.safe_load(v)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from . import UserError
    from ..kpca import sources
    from ..kpca.report import run_analysis

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.limit < 1:
        raise UserError("--limit must be >= 1")
    try:
        if args.run:
            probe = sources.probe_from_run(args.run, limit=args.limit, device=args.device, ema=args.ema)
        elif args.timm:
            kw = dict(_kwarg(i) for i in args.timm_kwarg)
            probe = sources.probe_from_timm(args.timm, checkpoint=args.checkpoint, limit=args.limit, seed=args.seed,
                                            device=args.device, **kw)
        else:
            probe = sources.probe_from_hf(args.hf, limit=args.limit, seed=args.seed, seq_len=args.seq_len,
                                          device=args.device)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    protocols = ("paper", "exact") if args.protocol == "both" else (args.protocol,)
    try:
        result = run_analysis(probe, args.out, protocols=protocols, perturb=args.perturb,
                              fgsm_eps=args.fgsm_eps / 255.0, noise_sigma=args.noise_sigma, seed=args.seed,
                              figures=not args.no_figures)
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    for proto, res in result["protocols"].items():
        mo = res["model"]
        row = {k: (mo.get(k) or {}).get("mean") for k in ("optimal_cosine", "linear_cka", "rbf_cka", "jproj", "phi2", "h2")}
        print(f"[{proto}] " + ", ".join(f"{k}={v:.4g}" if v is not None else f"{k}=n/a" for k, v in row.items()))
    print(f"chance: {json.dumps({k: {m: round(v[m]['mean'], 4) for m in v} for k, v in result['chance'].items()})}")
    if result["failures"]:
        print(f"{len(result['failures'])} failure(s) recorded in kpca.json")
    print(f"wrote {args.out}/kpca.json, summary.md and {len(result.get('figures', []))} figure(s) "
          f"in {result['meta']['seconds']} s")
    return 0
