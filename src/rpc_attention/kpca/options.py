"""Options of a KPCA analysis, shared by ``rpc-attention analyze`` and the studies' ``analyze`` stages.

The command line adds them with :func:`add_analysis_arguments`; a study stores them as the same
argument list (its ``analyze_args`` setting, e.g. ``["--limit", "8"]``), read back by
:func:`parse_analysis_args`; :func:`analyze_run` is the analysis of one training run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

__all__ = ["AnalysisOptions", "add_analysis_arguments", "options_from_namespace", "parse_analysis_args",
           "analyze_run"]


@dataclass(frozen=True)
class AnalysisOptions:
    """What to measure and how; ``fgsm_eps`` is in 1/255 pixel units, as on the command line."""

    protocols: Tuple[str, ...] = ("paper", "exact")
    limit: int = 8
    ema: bool = False
    fgsm_eps: float = 2.0
    noise_sigma: float = 0.1
    perturb: float = 0.01
    seed: int = 0
    figures: bool = True
    device: str = "cpu"
    threads: Optional[int] = None

    def analysis_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of :func:`rpc_attention.kpca.report.run_analysis`."""
        return dict(protocols=self.protocols, perturb=self.perturb, fgsm_eps=self.fgsm_eps / 255.0,
                    noise_sigma=self.noise_sigma, seed=self.seed, figures=self.figures)


def add_analysis_arguments(parser: argparse.ArgumentParser) -> None:
    """The analysis flags (everything but the model source and ``--out``)."""
    parser.add_argument("--protocol", choices=("paper", "exact", "both"), default="both",
                        help="paper: per-token standardised q,k (the paper's measurement); exact: the definitions")
    parser.add_argument("--limit", type=int, default=8, help="examples in the probe batch (default 8)")
    parser.add_argument("--ema", action="store_true", help="--run: use the EMA weights")
    parser.add_argument("--fgsm-eps", type=float, default=2.0, help="FGSM budget in 1/255 pixel units (RPC study)")
    parser.add_argument("--noise-sigma", type=float, default=0.1, help="Gaussian noise std in pixel units (RPC study)")
    parser.add_argument("--perturb", type=float, default=0.01, help="relative noise of the perturbed-eigenvector control")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def options_from_namespace(args: argparse.Namespace) -> AnalysisOptions:
    """The options parsed by a parser that :func:`add_analysis_arguments` set up; ValueError when bad."""
    if args.limit < 1:
        raise ValueError("--limit must be >= 1")
    protocols = ("paper", "exact") if args.protocol == "both" else (args.protocol,)
    return AnalysisOptions(protocols=protocols, limit=args.limit, ema=args.ema, fgsm_eps=args.fgsm_eps,
                           noise_sigma=args.noise_sigma, perturb=args.perturb, seed=args.seed,
                           figures=not args.no_figures, device=args.device, threads=args.threads)


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"analysis options: {message}")


def parse_analysis_args(argv: Sequence[str]) -> AnalysisOptions:
    """Options from an argument list such as ``["--limit", "2", "--protocol", "exact"]``."""
    parser = _RaisingParser(prog="analyze", add_help=False)
    add_analysis_arguments(parser)
    return options_from_namespace(parser.parse_args(list(argv)))


def analyze_run(run_dir, out_dir, options: AnalysisOptions = AnalysisOptions()) -> Dict[str, Any]:
    """KPCA analysis of the training run in ``run_dir``, written to ``out_dir`` (``kpca.json``,
    ``summary.md``, figures); returns the result :func:`rpc_attention.kpca.report.run_analysis` gives."""
    from .report import run_analysis
    from .sources import probe_from_run

    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    probe = probe_from_run(str(Path(run_dir)), limit=options.limit, device=options.device, ema=options.ema)
    return run_analysis(probe, out_dir, **options.analysis_kwargs())
