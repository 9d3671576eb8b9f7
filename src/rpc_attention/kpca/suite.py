"""The ``kpca`` evaluation suite: the paper's two kernel-PCA claims as summary numbers of one trained
classifier, so a study can decide them per seed.

* **Projection loss (claim 1).** ``jproj_<protocol>`` is the model-level J_proj of the trained model
  (the plain mean over its (layer, head, example) records, :func:`~rpc_attention.kpca.analysis.analyze_captures`'s
  ``model["jproj"]["mean"]``) and ``jproj_init_<protocol>`` the same number for the model the run started
  from, rebuilt exactly from the run's config and seed (:func:`rpc_attention.train.seeding.initial_model`,
  the function the trainer builds its model with).
* **Value alignment (claim 2).** ``optimal_cosine_<protocol>`` and ``linear_cka_<protocol>`` compare the
  learned values V (Scaled Attention: the effective values) with the KPCA value matrix V_hat built from
  the top eigenvectors of the centred Gram matrix K_c; ``..._chance_<protocol>`` is the same metric between
  independent Gaussian matrices of the same (N, Dv) shapes (:func:`~rpc_attention.kpca.analysis.capture_chance`,
  seeded by the suite's ``seed``), weighted like the model's records.

``<protocol>`` is ``paper`` (q and k standardised per token, the official code's measurement) or ``exact``
(the definitions); docs/analysis.md#protocols has both. The probe is the first ``limit`` (default 8)
examples of the evaluation split, the same images for every model. Every number is computed by the
analysis toolkit in float64; this module only captures, aggregates and names them.

The suite lives in the ``kpca`` floor (it needs the analysis and the trainer), above ``evaluate``, so
``evaluate``'s built-in list cannot import it: :func:`rpc_attention.kpca.register_suites` registers it,
as :func:`rpc_attention.kpca.register_callbacks` does the ``jproj`` callback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from ..data.images import eval_split_name
from ..evaluate.inputs import Normalized, data_name, eval_indices, load_eval_data, norm_stats
from ..evaluate.per_example import encode_indices
from ..evaluate.suites import CommonOptions, Cost, register_suite
from .analysis import PROTOCOLS, alignment_shape, analyze_captures, capture_chance, gram_not_applicable
from .hooks import AttentionCapture, LayerCapture

__all__ = ["SUITE", "JPROJ_PAPER", "JPROJ_EXACT", "JPROJ_INIT_PAPER", "JPROJ_INIT_EXACT", "OPTIMAL_COSINE_PAPER",
           "OPTIMAL_COSINE_EXACT", "OPTIMAL_COSINE_CHANCE_PAPER", "OPTIMAL_COSINE_CHANCE_EXACT", "LINEAR_CKA_PAPER",
           "LINEAR_CKA_EXACT", "LINEAR_CKA_CHANCE_PAPER", "LINEAR_CKA_CHANCE_EXACT", "METRICS", "COST", "KpcaOptions",
           "init_model", "kpca_suite", "register"]

SUITE = "kpca"

# The summary metrics, per protocol (paper, exact).
JPROJ_PAPER, JPROJ_EXACT = "jproj_paper", "jproj_exact"
JPROJ_INIT_PAPER, JPROJ_INIT_EXACT = "jproj_init_paper", "jproj_init_exact"
OPTIMAL_COSINE_PAPER, OPTIMAL_COSINE_EXACT = "optimal_cosine_paper", "optimal_cosine_exact"
OPTIMAL_COSINE_CHANCE_PAPER, OPTIMAL_COSINE_CHANCE_EXACT = "optimal_cosine_chance_paper", "optimal_cosine_chance_exact"
LINEAR_CKA_PAPER, LINEAR_CKA_EXACT = "linear_cka_paper", "linear_cka_exact"
LINEAR_CKA_CHANCE_PAPER, LINEAR_CKA_CHANCE_EXACT = "linear_cka_chance_paper", "linear_cka_chance_exact"

# (metric, protocol, what) with what one of: jproj, jproj_init, <alignment metric>, <alignment metric>_chance
_TABLE = (
    (JPROJ_PAPER, "paper", "jproj"), (JPROJ_EXACT, "exact", "jproj"),
    (JPROJ_INIT_PAPER, "paper", "jproj_init"), (JPROJ_INIT_EXACT, "exact", "jproj_init"),
    (OPTIMAL_COSINE_PAPER, "paper", "optimal_cosine"), (OPTIMAL_COSINE_EXACT, "exact", "optimal_cosine"),
    (OPTIMAL_COSINE_CHANCE_PAPER, "paper", "optimal_cosine_chance"),
    (OPTIMAL_COSINE_CHANCE_EXACT, "exact", "optimal_cosine_chance"),
    (LINEAR_CKA_PAPER, "paper", "linear_cka"), (LINEAR_CKA_EXACT, "exact", "linear_cka"),
    (LINEAR_CKA_CHANCE_PAPER, "paper", "linear_cka_chance"), (LINEAR_CKA_CHANCE_EXACT, "exact", "linear_cka_chance"),
)
METRICS = tuple(m for m, _, _ in _TABLE)
_ALIGNMENT = ("optimal_cosine", "linear_cka")

# Cost in forward-pass equivalents per example: two forward passes (trained and initial model) plus the
# float64 analysis, which dominates. Measured on a trained fmnist-symvit with num_heads=6 (docs/analysis.md,
# "The kpca evaluation suite"): 0.4-0.8 CPU s per example on the loaded 2-core machine, taken as 0.45 s, i.e.
# 1,500 forward passes at the estimates' 0.3 s per 1,000.
COST = Cost(forward=1500, backward=0)


@dataclass(frozen=True)
class KpcaOptions(CommonOptions):
    """``limit``: the probe (the first examples of the evaluation split), 8 as the analysis;
    ``chance_draws``: the random matrix pairs per shape of the chance baselines (8, as the analysis)."""

    limit: Optional[int] = 8
    chance_draws: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.chance_draws) < 1:
            raise ValueError(f"kpca.chance_draws must be >= 1, got {self.chance_draws}")


def init_model(cfg: Mapping[str, Any]) -> nn.Module:
    """The model the training run of ``cfg`` started from, in eval mode on the CPU: built by the trainer's
    own :func:`~rpc_attention.train.seeding.initial_model` from the run's config and ``train.seed``; the
    caller's RNG states are left as they were."""
    from ..train.seeding import initial_model

    return initial_model(dict(cfg), keep_rng=True).eval()


def _check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    model = cfg.get("model")
    if not isinstance(model, Mapping) or not model.get("name"):
        raise ValueError("the kpca suite compares a trained model with its initialisation, rebuilt from a training "
                         "run's config (model.name, train.seed); this model has no run config (use --run DIR)")
    from ..train.config import TrainConfig

    TrainConfig.from_dict(dict(cfg))  # the seed the initialisation is rebuilt with must be readable


def _capture(model: nn.Module, cfg: Mapping[str, Any], x01: torch.Tensor, batch_size: int, device: str,
             which: str) -> List[LayerCapture]:
    """The attention layers' q, k, v (float64, CPU) of ``model`` on the probe images, batch by batch."""
    net = Normalized(model, *norm_stats(cfg, x01.shape[1])).to(device).eval()
    with AttentionCapture(model) as cap, torch.no_grad():
        for i in range(0, len(x01), batch_size):
            net(x01[i:i + batch_size].to(device))
    if cap.errors:
        err = cap.errors[0]
        raise ValueError(f"{which} model: layer {err['layer']} could not be captured ({err['error']})")
    if not cap.captures:
        raise ValueError(f"{which} model: no supported attention module ran in the forward pass")
    return cap.captures


def _weighted_chance(captures: List[LayerCapture], chance: Dict[str, Dict], metric: str) -> float:
    """The chance level of ``metric`` for these layers: each layer's shape's baseline, weighted by its
    (head, example) records, as the model-level metric weights them."""
    total = weight = 0.0
    for cap in captures:
        n, dv = alignment_shape(cap)
        w = float(cap.heads * cap.batch)
        total += w * chance[f"{n}x{dv}"][metric]["mean"]
        weight += w
    return total / weight


def _mean(model_summary: Dict[str, Any], key: str, what: str) -> float:
    """The model-level mean of ``key``; a ValueError when no record of it is finite."""
    value = (model_summary.get(key) or {}).get("mean")
    if value is None:
        raise ValueError(f"{what}: no finite {key} record (see the analysis' failures)")
    return float(value)


def kpca_suite(model: nn.Module, cfg: Mapping[str, Any], run_dir, opts: Dict[str, Any]) -> Dict[str, Any]:
    device, seed, bs = opts["device"], int(opts["seed"]), int(opts["batch_size"])
    x01, _ = load_eval_data(cfg, "test", opts.get("limit"))
    if len(x01) == 0:
        raise ValueError("the evaluation split is empty")
    caps = _capture(model, cfg, x01, bs, device, "trained")
    skipped = gram_not_applicable(caps)
    if skipped:
        reasons = "; ".join(sorted(set(skipped.values())))
        raise ValueError(f"V_hat is undefined in {len(skipped)} of {len(caps)} layers ({reasons}): kernel PCA of N "
                         "keys has at most N axes, so the head dimension Dv must not exceed the token count N "
                         "(e.g. train the Fashion-MNIST presets with --set model.kwargs.num_heads=6)")
    init_caps = _capture(init_model(cfg), cfg, x01, bs, device, "initial")
    chance = capture_chance(caps, draws=int(opts["chance_draws"]), seed=seed)
    values: Dict[tuple, float] = {}
    rows, failures = [], []
    for proto in PROTOCOLS:
        trained = analyze_captures(caps, proto, gamma=False, seed=seed)
        init = analyze_captures(init_caps, proto, gram=False, seed=seed)
        for which, res in (("trained", trained), ("init", init)):
            failures.extend({**f, "protocol": proto, "model": which} for f in res["failures"])
            mo = res["model"]
            rows.append({"model": which, "protocol": proto, "jproj": _mean(mo, "jproj", f"{which} model, {proto}"),
                         "jproj_std": mo["jproj"]["std"], "records": mo["jproj"]["n"],
                         "phi2": mo["phi2"]["mean"], "h2": mo["h2"]["mean"],
                         **{k: mo[k]["mean"] for k in _ALIGNMENT if which == "trained"}})
        values[(proto, "jproj")] = rows[-2]["jproj"]
        values[(proto, "jproj_init")] = rows[-1]["jproj"]
        for key in _ALIGNMENT:
            values[(proto, key)] = _mean(trained["model"], key, f"trained model, {proto}")
            values[(proto, f"{key}_chance")] = _weighted_chance(caps, chance, key)
    rows.append({"model": "chance (Gaussian matrices)", "protocol": "both",
                 **{k: values[("exact", f"{k}_chance")] for k in _ALIGNMENT}})

    out: Dict[str, Any] = {
        "metrics": {name: values[(proto, what)] for name, proto, what in _TABLE},
        "rows": rows,
        "data": {"dataset": data_name(cfg), "split": eval_split_name(dict(cfg), "test"), "n_examples": len(x01),
                 "indices": encode_indices(eval_indices(cfg, "test", opts.get("limit")))},
        "n_examples": len(x01),
        "protocol": ("kernel-PCA claims: model-level J_proj of the trained and the initial model, optimal cosine and "
                     "linear CKA of V against V_hat and their Gaussian chance levels, under the paper and exact "
                     "protocols, float64"),
        "chance": chance,  # every random-matrix baseline, by "NxDv" shape (written to kpca.json only)
        "settings": {"layers": sorted({c.name for c in caps}),
                     "init": "rebuilt from the run config: global RNGs seeded with train.seed, then the task's "
                             "build_model (the trainer's initial_model)"},
    }
    if failures:
        out["failures"] = failures
    return out


def register() -> None:
    """Register the ``kpca`` suite (re-registering replaces it)."""
    register_suite(SUITE, kpca_suite, options=KpcaOptions, check=_check, metrics=METRICS, cost=COST,
                   description="kernel-PCA claims: J_proj trained vs initial, V vs V_hat (optimal cosine, "
                               "linear CKA) vs chance, paper and exact protocols")
