"""Options of a KPCA analysis, shared by ``rpc-attention analyze`` and the studies' ``analyze`` stages.

The command line adds them with :func:`add_analysis_arguments`; a study stores them as settings in
the package's one ``KEY=VALUE`` grammar (its ``analyze_sets`` setting, e.g. ``["limit=8"]``), read
by :func:`options_from_settings`; :func:`analyze_run` is the analysis of one training run.
``fgsm_eps`` is in pixel units and takes fractions (``2/255``, ``2.5/255``) as everywhere else.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, get_type_hints

from ..overrides import parse_assignments, parse_number, typed_value, unknown_key

__all__ = ["AnalysisOptions", "add_analysis_arguments", "options_from_namespace", "options_from_settings",
           "analyze_run"]


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
    vhat_rank: str = "value"  # value (largest eigenvalues) | magnitude (largest |eigenvalue|, value_vectors.py)
    eig_signs: str = "eigh"  # eigh (as returned, both codes) | canonical (largest-|entry| positive)
    standardize_eps: float = 0.0  # `paper`'s standardisation eps (official: 0; the study's scripts: 1e-8)

    def analysis_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of :func:`rpc_attention.kpca.runner.run_analysis`."""
        return dict(protocols=self.protocols, perturb=self.perturb, fgsm_eps=self.fgsm_eps,
                    noise_sigma=self.noise_sigma, seed=self.seed, figures=self.figures,
                    vhat_rank=self.vhat_rank, eig_signs=self.eig_signs, standardize_eps=self.standardize_eps)


_D = AnalysisOptions()  # the defaults, written once above


def add_analysis_arguments(parser: argparse.ArgumentParser) -> None:
    """The analysis flags (everything but the model source and ``--out``); defaults from :class:`AnalysisOptions`."""
    g = parser.add_argument_group("analysis")
    g.add_argument("--protocol", choices=("paper", "exact", "both"), default="both",
                   help="paper: per-token standardised q,k (the paper's measurement); exact: the definitions; "
                        "both (default)")
    g.add_argument("--limit", type=int, default=_D.limit, metavar="N",
                   help=f"number of examples (the probe batch; default {_D.limit})")
    g.add_argument("--ema", action="store_true", help="--run: use the EMA weights")
    g.add_argument("--fgsm-eps", default="2/255", metavar="EPS",
                   help="FGSM budget in pixel units, e.g. 2/255 (default) or 2.5/255 (RPC study)")
    g.add_argument("--noise-sigma", type=float, default=_D.noise_sigma,
                   help="Gaussian noise std in pixel units (RPC study)")
    g.add_argument("--perturb", type=float, default=_D.perturb,
                   help="noise (absolute, per entry) of the perturbed-eigenvector control before QR (the reproduction study's)")
    g.add_argument("--seed", type=int, default=_D.seed,
                   help=f"seed of the random probe inputs and perturbations (default {_D.seed})")
    g.add_argument("--no-figures", action="store_true", help="write kpca.json and summary.md only")
    g.add_argument("--device", default=_D.device, help="torch device: cpu (default), cuda, cuda:1, ...")
    g.add_argument("--threads", type=int, default=_D.threads, help="torch threads (default: torch's)")
    g.add_argument("--vhat-rank", default=_D.vhat_rank, metavar="value|magnitude",
                   help="eigenpairs V_hat is built from: the largest eigenvalues (value, default) or the largest "
                        "|eigenvalue| (magnitude, the reproduction study's value_vectors.py)")
    g.add_argument("--eig-signs", default=_D.eig_signs, metavar="eigh|canonical",
                   help="eigenvector signs: as torch.linalg.eigh returns them (eigh, default, as both published "
                        "codes) or each column's largest-magnitude entry positive (canonical)")
    g.add_argument("--standardize-eps", type=float, default=_D.standardize_eps, metavar="EPS",
                   help="eps of the paper protocol's per-token standardisation (x - mean) / (std + eps): 0 as the "
                        "official code (default), 1e-8 as the reproduction study's scripts")


def _protocols(value: str) -> Tuple[str, ...]:
    if value not in ("paper", "exact", "both"):
        raise ValueError(f"protocol={value}: choose paper, exact or both")
    return ("paper", "exact") if value == "both" else (value,)


def _checked(options: AnalysisOptions) -> AnalysisOptions:
    if options.limit < 1:
        raise ValueError("--limit must be >= 1")
    if not 0 <= options.fgsm_eps <= 1:
        raise ValueError(f"--fgsm-eps is in pixel units [0, 1], got {options.fgsm_eps!r}; "
                         f"did you mean {options.fgsm_eps:g}/255?")
    from .analysis import GramSettings, check_conventions

    check_conventions(options.protocols, options.standardize_eps,
                      GramSettings(perturb=options.perturb, vhat_rank=options.vhat_rank, eig_signs=options.eig_signs))
    return options


def options_from_namespace(args: argparse.Namespace) -> AnalysisOptions:
    """The options parsed by a parser that :func:`add_analysis_arguments` set up; ValueError when bad."""
    return _checked(AnalysisOptions(
        protocols=_protocols(args.protocol), limit=args.limit, ema=args.ema,
        fgsm_eps=parse_number(args.fgsm_eps, "--fgsm-eps"), noise_sigma=args.noise_sigma, perturb=args.perturb,
        seed=args.seed, figures=not args.no_figures, device=args.device, threads=args.threads,
        vhat_rank=args.vhat_rank, eig_signs=args.eig_signs, standardize_eps=args.standardize_eps))


def options_from_settings(items: Sequence[str]) -> AnalysisOptions:
    """Options from ``KEY=VALUE`` settings such as ``["limit=2", "protocol=exact", "fgsm_eps=2.5/255"]``
    (the fields of :class:`AnalysisOptions`, with ``protocol=paper|exact|both`` for ``protocols``);
    ValueError naming an unknown key or a bad value."""
    kinds = {f.name: f.type for f in fields(AnalysisOptions) if f.name != "protocols"}
    hints = get_type_hints(AnalysisOptions)
    values: Dict[str, Any] = {}
    for key, value in parse_assignments(items, "analysis setting"):
        if key == "protocol":
            values["protocols"] = _protocols(str(value))
        elif key in kinds:
            values[key] = typed_value(key, value, hints[key], "analysis setting")
        else:
            raise unknown_key(key, list(kinds) + ["protocol"], "analysis setting", "analysis setting")
    return _checked(replace(AnalysisOptions(), **values))


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
