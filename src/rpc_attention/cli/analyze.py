"""``rpc-attention analyze``: kernel-PCA analysis of a run, a timm model or a Hugging Face model."""

from __future__ import annotations

import argparse

HELP = "Kernel-PCA analysis (J_proj, Gram eigenvectors, value alignment, PAP sparse-step activity) of a model"
EXTRA = "eval"  # the extra this command needs: pip install "rpc-attention[eval]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model (one of --run, --timm, --hf)")
    src = model.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a training run directory (config.yaml + model.safetensors)")
    src.add_argument("--timm", metavar="NAME", help="a timm model name (random init unless --checkpoint)")
    src.add_argument("--hf", metavar="PATH_OR_CONFIG",
                     help="a local Hugging Face directory with config.json, or a built-in config: "
                          "bert-tiny-config, bert-mini-config, vit-tiny-config (random weights)")
    model.add_argument("--checkpoint", metavar="FILE", help="weights for --timm (.safetensors or torch state dict)")
    model.add_argument("--set", dest="sets", action="append", default=[], metavar="model.kwargs.NAME=VALUE",
                       help="timm.create_model keyword for --timm (repeatable; YAML values), e.g. "
                            "--set model.kwargs.img_size=64")
    model.add_argument("--timm-kwarg", action="append", default=[], metavar="NAME=VALUE",
                       help="alias of --set model.kwargs.NAME=VALUE")
    model.add_argument("--seq-len", type=int, default=128, help="--hf text models: random sequence length")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (kpca.json, summary.md, *.png)")
    parser.add_argument("--force", action="store_true", help="replace an earlier analysis in --out")
    from ..kpca.options import add_analysis_arguments  # needs the [eval] extra: see build_parser

    add_analysis_arguments(parser)


def timm_kwargs(args: argparse.Namespace) -> dict:
    """``--set model.kwargs.NAME=VALUE`` and the ``--timm-kwarg NAME=VALUE`` alias as a keyword dict."""
    from ..overrides import parse_assignments
    from . import UserError

    try:
        pairs = parse_assignments(args.sets, "--set")
        pairs += [(f"model.kwargs.{k}", v) for k, v in parse_assignments(args.timm_kwarg, "--timm-kwarg")]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    kwargs = {}
    for key, value in pairs:
        name = key[len("model.kwargs."):] if key.startswith("model.kwargs.") else ""
        if not name or "." in name:
            raise UserError(f"--set {key}: analyze takes model settings only, as model.kwargs.NAME=VALUE "
                            "(the analysis options are flags: --limit, --protocol, ...)")
        kwargs[name] = value
    if kwargs and not args.timm:
        raise UserError("model.kwargs settings apply to --timm models only")
    return kwargs


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import time

    import torch

    from ..kpca import sources
    from ..kpca.options import options_from_namespace
    from ..kpca.runner import run_analysis
    from . import UserError

    try:
        opts = options_from_namespace(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    kw = timm_kwargs(args)
    if os.path.exists(os.path.join(args.out, "kpca.json")) and not args.force:
        raise UserError(f"{args.out} already holds an analysis (kpca.json); give another --out, or --force to "
                        f"replace it")
    t0 = time.perf_counter()  # the whole command after parsing: model and data loading included
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        if args.run:
            probe = sources.probe_from_run(args.run, limit=opts.limit, device=opts.device, ema=opts.ema)
        elif args.timm:
            probe = sources.probe_from_timm(args.timm, checkpoint=args.checkpoint, limit=opts.limit, seed=opts.seed,
                                            device=opts.device, **kw)
        else:
            probe = sources.probe_from_hf(args.hf, limit=opts.limit, seed=opts.seed, seq_len=args.seq_len,
                                          device=opts.device)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    try:
        result = run_analysis(probe, args.out, **opts.analysis_kwargs())
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from None
    for proto, res in result["protocols"].items():
        mo = res["model"]
        row = {k: (mo.get(k) or {}).get("mean") for k in ("optimal_cosine", "linear_cka", "rbf_cka", "jproj", "phi2", "h2")}
        print(f"[{proto}] " + ", ".join(f"{k}={v:.4g}" if v is not None else f"{k}=n/a" for k, v in row.items()))
    print(f"chance: {json.dumps({k: {m: round(v[m]['mean'], 4) for m in v} for k, v in result['chance'].items()})}")
    from ..train.sparsity import sparsity_summary

    sp = result.get("sparsity") or {}
    if sp.get("blocks"):
        print(f"PAP sparse step ({sp['probe'].get('examples')} {sp['probe'].get('split')} examples): {sp['verdict']}")
        for line in sparsity_summary(sp):
            print("  " + line)
    if result["failures"]:
        print(f"{len(result['failures'])} failure(s) recorded in kpca.json")
    print(f"wrote {args.out}/kpca.json, summary.md and {len(result.get('figures', []))} figure(s) "
          f"in {time.perf_counter() - t0:.1f} s (after start-up)")
    return 0
