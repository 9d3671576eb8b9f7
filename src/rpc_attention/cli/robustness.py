"""``rpc-attention robustness``: layer-level dose-response of attention variants to sparse key corruption."""

from __future__ import annotations

import argparse

HELP = ("Layer-level robustness to sparse key corruption (entries, whole tokens, whole features): PAP variants vs "
        "symmetric, clipping, token-dropping and oracle controls")
EXTRA = "eval"  # the extra this command needs: pip install "rpc-attention[eval]"


def _floats(text: str):
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for robustness.md / .json / .png")
    parser.add_argument("--force", action="store_true", help="overwrite the files of an earlier run in --out")
    parser.add_argument("--run", default=None, help="trained run: its first attention block's keys on test images")
    parser.add_argument("--examples", type=int, default=64, help="test images of --run (default 64)")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the synthetic low-rank-plus-noise keys")
    parser.add_argument("--variant", action="append", default=None, metavar="NAME[=key:value,...]",
                        help="a PAP variant (repeatable), e.g. robust=threshold:mad,lambd:6,lowrank:keys,"
                             "shrink:hard,dual_step:0,n_iter:2; default: the official PAP and that robust variant")
    parser.add_argument("--magnitudes", type=_floats, default=[2, 5, 10, 30, 100],
                        help="corruption sizes in key standard deviations (default 2,5,10,30,100)")
    parser.add_argument("--densities", type=_floats, default=[0.01, 0.05, 0.2],
                        help="shares of key entries corrupted (default 0.01,0.05,0.2)")
    parser.add_argument("--patterns", default="entries,tokens,features",
                        help="corruption patterns: entries (scattered), tokens (whole key rows), features (whole "
                             "key columns); default all three")
    parser.add_argument("--clip", type=float, default=4.0, help="clipping control: median +- CLIP robust std (4)")
    parser.add_argument("--drop", type=float, default=6.0,
                        help="drop control: mask out tokens whose key row is DROP robust deviations out (6)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the keys and corruptions (default 0)")
    syn = parser.add_argument_group("synthetic keys")
    for flag, default in (("batch", 16), ("heads", 4), ("tokens", 64), ("head-dim", 16), ("rank", 4)):
        syn.add_argument(f"--{flag}", type=int, default=default, help=f"default {default}")
    syn.add_argument("--noise", type=float, default=0.1, help="noise added to the low-rank keys (default 0.1)")


def run(args: argparse.Namespace) -> int:
    from ..evaluate.predict import progress
    from ..kpca.key_robustness import DEFAULT_VARIANTS, parse_variant, robustness_study
    from ..kpca.key_robustness_report import robustness_markdown, write_robustness
    from . import UserError

    shape = dict(batch=args.batch, heads=args.heads, tokens=args.tokens, head_dim=args.head_dim, rank=args.rank)
    if min(shape.values()) < 1 or args.examples < 1 or args.noise < 0:
        raise UserError("--batch, --heads, --tokens, --head-dim, --rank and --examples must be >= 1, --noise >= 0")
    try:
        variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
        if len({v.name for v in variants}) != len(variants):
            raise ValueError("variant names must be distinct")
        synthetic = None if args.no_synthetic else dict(shape, noise=args.noise)
        result = robustness_study(variants, run_dir=args.run, synthetic=synthetic, magnitudes=args.magnitudes,
                                  densities=args.densities, examples=args.examples, seed=args.seed, clip=args.clip,
                                  progress=lambda cells: progress(cells, total=len(cells), desc="cells"),
                                  patterns=[p.strip() for p in args.patterns.split(",") if p.strip()], drop=args.drop)
        write_robustness(result, args.out, force=args.force)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        raise UserError(str(exc)) from None
    print(robustness_markdown(result))
    return 0
