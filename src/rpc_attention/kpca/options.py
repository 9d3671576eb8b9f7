"""Options of a KPCA analysis, shared by ``rpc-attention analyze`` and the studies' ``analyze`` stages.

The command line adds them with :func:`add_analysis_arguments`; a study stores them as settings in
the package's one ``KEY=VALUE`` grammar (its ``analyze_sets`` setting, e.g. ``["limit=8"]``), read
by :func:`options_from_settings`; :func:`analyze_run` is the analysis of one training run.
``fgsm_eps`` is in pixel units and takes fractions (``2/255``, ``2.5/255``) as everywhere else.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from ..overrides import parse_assignments, parse_number, unknown_key

__all__ = ["AnalysisOptions", "add_analysis_arguments", "options_from_namespace", "parse_analysis_args",
           "options_from_settings", "analyze_run"]


@dataclass(frozen=True)
class AnalysisOptions:
    """What to measure and how; ``limit`` counts examples (the probe batch), ``fgsm_eps`` is in pixel units."""

    protocols: Tuple[str, ...] = ("paper", "exact")
    limit: int = 8
    ema: bool = False
    fgsm_eps: float = 2.0 / 255
    noise_sigma: float = 0.1
    perturb: float = 0.1
    seed: int = 0
    figures: bool = True
    device: str = "cpu"
    threads: Optional[int] = None

    def analysis_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of :func:`rpc_attention.kpca.runner.run_analysis`."""
        return dict(protocols=self.protocols, perturb=self.perturb, fgsm_eps=self.fgsm_eps,
                    noise_sigma=self.noise_sigma, seed=self.seed, figures=self.figures)


def add_analysis_arguments(parser: argparse.ArgumentParser) -> None:
    """The analysis flags (everything but the model source and ``--out``)."""
    g = parser.add_argument_group("analysis")
    g.add_argument("--protocol", choices=("paper", "exact", "both"), default="both",
                   help="paper: per-token standardised q,k (the paper's measurement); exact: the definitions; "
                        "both (default)")
    g.add_argument("--limit", type=int, default=8, metavar="N",
                   help="number of examples (the probe batch; default 8)")
    g.add_argument("--ema", action="store_true", help="--run: use the EMA weights")
    g.add_argument("--fgsm-eps", default="2/255", metavar="EPS",
                   help="FGSM budget in pixel units, e.g. 2/255 (default) or 2.5/255 (RPC study)")
    g.add_argument("--noise-sigma", type=float, default=0.1, help="Gaussian noise std in pixel units (RPC study)")
    g.add_argument("--perturb", type=float, default=0.1,
                   help="noise (absolute, per entry) of the perturbed-eigenvector control before QR (default 0.1, the reproduction study's)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random probe inputs and perturbations (default 0)")
    g.add_argument("--no-figures", action="store_true", help="write kpca.json and summary.md only")
    g.add_argument("--device", default="cpu", help="torch device: cpu (default), cuda, cuda:1, ...")
    g.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")


def options_from_namespace(args: argparse.Namespace) -> AnalysisOptions:
    """The options parsed by a parser that :func:`add_analysis_arguments` set up; ValueError when bad."""
    if args.limit < 1:
        raise ValueError("--limit must be >= 1")
    protocols = ("paper", "exact") if args.protocol == "both" else (args.protocol,)
    return AnalysisOptions(protocols=protocols, limit=args.limit, ema=args.ema, fgsm_eps=_pixel_eps(args.fgsm_eps),
                           noise_sigma=args.noise_sigma, perturb=args.perturb, seed=args.seed,
                           figures=not args.no_figures, device=args.device, threads=args.threads)


def _pixel_eps(value) -> float:
    eps = parse_number(value, "--fgsm-eps")
    if not 0 <= eps <= 1:
        raise ValueError(f"--fgsm-eps is in pixel units [0, 1], got {value!r}; did you mean {value}/255?")
    return eps


_SETTING_FLAGS = {"protocol": "--protocol", "limit": "--limit", "ema": "--ema", "fgsm_eps": "--fgsm-eps",
                  "noise_sigma": "--noise-sigma", "perturb": "--perturb", "seed": "--seed",
                  "figures": "--no-figures", "device": "--device", "threads": "--threads"}


def options_from_settings(items: Sequence[str]) -> AnalysisOptions:
    """Options from ``KEY=VALUE`` settings such as ``["limit=2", "protocol=exact", "fgsm_eps=2.5/255"]``
    (the keys are the flags' names with underscores); ValueError naming an unknown key or a bad value."""
    argv = []
    for key, value in parse_assignments(items, "analysis setting"):
        if key not in _SETTING_FLAGS:
            raise unknown_key(key, _SETTING_FLAGS, "analysis setting", "analysis setting")
        flag = _SETTING_FLAGS[key]
        if key in ("ema", "figures"):
            if not isinstance(value, bool):
                raise ValueError(f"analysis setting {key}={value}: expected true or false")
            argv += [flag] if value == (key == "ema") else []
        else:
            argv += [flag, str(value)]
    return parse_analysis_args(argv)


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
    ``summary.md``, figures); returns the result :func:`rpc_attention.kpca.runner.run_analysis` gives."""
    from .runner import run_analysis
    from .sources import probe_from_run

    if options.threads:
        import torch

        torch.set_num_threads(options.threads)
    probe = probe_from_run(str(Path(run_dir)), limit=options.limit, device=options.device, ema=options.ema)
    return run_analysis(probe, out_dir, **options.analysis_kwargs())
