"""Per-layer kernel-PCA analysis of captured attention layers, aggregated with std.

:func:`analyze_captures` turns :class:`~rpc_attention.kpca.hooks.LayerCapture` records into
per-layer and model-level statistics under one measurement protocol:

* ``exact``: the definitions (docs/method.md#kernel-pca-view-of-attention) on the raw q, k, with the
  reproduction study's conventions (its norms, relative reconstruction errors, gamma = K_c a / (a N)
  with its noise-and-QR control, eigenvalues of K_c);
* ``paper``: the official KPCA code's measurement: q and k standardised per token over the head dim
  (unbiased std, no eps), the probe batch fixed, J_proj also as the log of its mean and in the
  official code's form (``jproj_official``: exp(q.q) without the softmax scale, log of the mean).

docs/analysis.md#protocols lists every formula and every remaining difference from the two codes.

Records are (layer, head, example); a layer's numbers are mean and std over its records and the
model level is the plain mean over all records. Failures (a layer or example where a stage raised)
are collected in ``failures``, never dropped silently; a layer whose value dimension exceeds its token
count (Dv > N: kernel PCA has fewer axes than values) gets no Gram analysis, said once per layer in its
``gram`` entry (:func:`gram_not_applicable`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import torch
from torch import Tensor

from ..functional.pap import sparse_term_activity
from . import metrics as M
from .hooks import LayerCapture

__all__ = ["PROTOCOLS", "ALIGN_METRICS", "GAMMA_VARIANTS", "summarise_values", "summarise_tokens", "GramSettings",
           "check_conventions", "conventions", "perturbed_eigvecs", "gram_not_applicable", "analyze_captures",
           "alignment_shape", "capture_chance", "chance_baselines", "pap_stats"]

PROTOCOLS = ("paper", "exact")
ALIGN_METRICS = ("direct_cosine", "optimal_cosine", "linear_cka", "rbf_cka")
GAMMA_VARIANTS = ("learned", "eigvec", "perturbed", "random")


def summarise_values(values: Iterable[float]) -> Dict[str, Optional[float]]:
    """``{"mean", "std", "n"}`` over the finite values (population std); ``n_nonfinite`` if any."""
    vals = [float(v) for v in values]
    fin = [v for v in vals if math.isfinite(v)]
    out: Dict[str, Optional[float]] = {"mean": None, "std": None, "n": len(fin)}
    if fin:
        t = torch.tensor(fin, dtype=torch.float64)
        out["mean"] = float(t.mean())
        out["std"] = float(t.std(unbiased=False))
    if len(fin) != len(vals):
        out["n_nonfinite"] = len(vals) - len(fin)
    return out


def summarise_tokens(values: Iterable[float], keep_percentile: float = 95.0) -> Dict[str, Optional[float]]:
    """Per-token distribution of a norm: ``mean`` and population ``std`` over the tokens themselves (not over
    (head, example) means), and the reproduction study's plotted statistics (``norms.py``): ``median``,
    ``q25``, ``q75`` of the tokens left after dropping those above the ``keep_percentile`` percentile
    (numpy's linear interpolation). Non-finite values are left out and counted in ``n_nonfinite``."""
    vals = np.asarray([float(v) for v in values], dtype=np.float64)
    fin = vals[np.isfinite(vals)]
    out: Dict[str, Optional[float]] = {"mean": None, "std": None, "n": int(fin.size)}
    if fin.size:
        kept = fin[fin <= np.percentile(fin, keep_percentile)]
        out.update(mean=float(fin.mean()), std=float(fin.std()), median=float(np.median(kept)),
                   q25=float(np.percentile(kept, 25)), q75=float(np.percentile(kept, 75)), n_kept=int(kept.size))
    if fin.size != vals.size:
        out["n_nonfinite"] = int(vals.size - fin.size)
    return out


@dataclass(frozen=True)
class GramSettings:
    """How the Gram analysis is measured (docs/analysis.md#protocols lists each choice's source).

    ``vhat_rank``: the eigenpairs V_hat is built from, ``value`` (the largest eigenvalues, the KPCA
    definition) or ``magnitude`` (the largest |eigenvalue|, the study's ``value_vectors.py``);
    ``eig_signs``: ``eigh`` (the signs ``torch.linalg.eigh`` returns, as both published codes) or
    ``canonical`` (:func:`rpc_attention.kpca.metrics.canonical_signs`); ``perturb``: the noise of the
    perturbed-eigenvector control; ``alignment``: whether the four alignment metrics are measured;
    ``gamma``: whether gamma and its controls are (the costlier half of the Gram analysis)."""

    alignment: bool = True
    gamma: bool = True
    perturb: float = 0.1
    vhat_rank: str = "value"
    eig_signs: str = "eigh"


def check_conventions(protocols: Iterable[str], standardize_eps: float, settings: GramSettings, gram: bool = True) -> None:
    """ValueError naming the first choice that is unknown or would have no effect under these protocols."""
    protocols = tuple(protocols)
    if settings.vhat_rank not in M.EIG_RANKS:
        raise ValueError(f"vhat_rank={settings.vhat_rank!r}: choose one of {', '.join(M.EIG_RANKS)}")
    if settings.eig_signs not in M.EIG_SIGNS:
        raise ValueError(f"eig_signs={settings.eig_signs!r}: choose one of {', '.join(M.EIG_SIGNS)}")
    if not (standardize_eps >= 0 and math.isfinite(standardize_eps)):
        raise ValueError(f"standardize_eps={standardize_eps!r}: must be a finite number >= 0")
    if standardize_eps and "paper" not in protocols:
        raise ValueError(f"standardize_eps={standardize_eps:g} has no effect under protocol "
                         f"{'/'.join(protocols)}: only `paper` standardises q and k")
    if settings.vhat_rank != "value" and not (gram and settings.alignment):
        raise ValueError("vhat_rank=magnitude has no effect without the alignment metrics (gram and alignment on)")
    if settings.eig_signs != "eigh" and not gram:
        raise ValueError("eig_signs=canonical has no effect without the Gram analysis (gram on)")


def conventions(protocol: str, standardize_eps: float, settings: GramSettings) -> Dict[str, str]:
    """The conventions that produced this protocol's numbers, by output key (written to ``kpca.json``)."""
    out = {
        "standardization": (f"q, k per token: (x - mean) / (std + {standardize_eps:g}), unbiased std"
                            if protocol == "paper" else "none (raw q, k)"),
        "std": "population std over the layer's (head, example) records of their token means",
        "phi2_tokens, h2_tokens": "over tokens: mean, population std; median, q25, q75 after dropping the "
                                  "tokens above the 95th percentile (the study's norms.py plot)",
        "rel_error_wrt_phi2, rel_error_wrt_h2": "ratio of the layer's means |mean phi2 - mean h2| / mean (norms.py); "
                                                "model: mean over layers",
        "rel_error_per_token_wrt_phi2, rel_error_per_token_wrt_h2": "mean over the layer's tokens of |phi2 - h2| / "
                                                                    "(phi2 or h2 + 1e-8) (Reconstruction/softmax.py); "
                                                                    "model: mean over layers",
        "gamma per_axis_std": "mean over (head, example) records of the pair std (ddof 1) within each record",
        "gamma per_axis_std_of_means": "population std over (head, example) records of their mean |dgamma| "
                                       "(the band of the study's gammas.py figure)",
        "vhat_rank": f"{settings.vhat_rank} ({'largest eigenvalues' if settings.vhat_rank == 'value' else 'largest |eigenvalue|, value_vectors.py'})",
        "eig_signs": settings.eig_signs,
        "perturbed_control": f"eigenvectors + {settings.perturb:g} x Gaussian noise, then QR",
    }
    if protocol == "paper":
        out["log_mean_jproj_official"] = "ln of the mean official J_proj over the pooled (layer: its; model: all) tokens"
        out["mean_layer_log_jproj_official"] = ("model: mean over layers of each layer's ln(mean official J_proj), "
                                                "the official code's logged figure (null if a layer's mean is <= 0)")
    return out


def _prep(t: Tensor, protocol: str, eps: float = 0.0) -> Tensor:
    return M.standardize_tokens(t, eps) if protocol == "paper" else t


def perturbed_eigvecs(vecs: Tensor, perturb: float, gen: torch.Generator) -> Tensor:
    """The reproduction study's control (``gammas.py``): the eigenvectors plus ``perturb`` x standard
    Gaussian noise (absolute, per entry), re-orthonormalised by QR, the first Dv columns."""
    noise = torch.randn(vecs.shape, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(vecs + perturb * noise)
    return q[..., : vecs.shape[-1]]


def _gamma_variants(k_c: Tensor, a_hat: Tensor, vecs: Tensor, perturb: float, gen: torch.Generator) -> Dict[str, Tensor]:
    """Per-head per-axis mean |gamma_i - gamma_j| for the learned a_hat and three controls."""
    pert = perturbed_eigvecs(vecs, perturb, gen)
    rnd = torch.randn(a_hat.shape, generator=gen, dtype=torch.float64)
    rnd = rnd - rnd.mean(dim=-2, keepdim=True)
    out = {}
    for key, a in (("learned", a_hat), ("eigvec", vecs), ("perturbed", pert), ("random", rnd)):
        out[key] = M.gamma_stats(k_c, a)
    return out


def _projection_records(cap: LayerCapture, b: int, q: Tensor, k: Tensor, v: Tensor, kv: Optional[Tensor],
                        acc: _LayerRecords, official: bool = False) -> None:
    """J_proj and its two terms for example ``b`` (per record, and per token in ``acc.tok``), appended to
    ``acc``; ``official`` adds the official code's form (``jproj_official``: mean over tokens of
    exp(q.q) / exp(2 q.k_0 - log attn_0^2) - ||h||^2)."""
    pl = M.projection_loss(q, k, v, cap.scale, causal=cap.causal, mask=cap.example_mask(b), query_valid=kv)
    for key in ("jproj", "phi2", "h2", "log_phi2", "log_h2"):
        acc.rec.setdefault(key, []).extend(pl[key].tolist())
    lp, lh = pl["token_log_phi2"], pl["token_log_h2"]
    rel = M.per_token_relative_errors(lp, lh)
    for key, t in (("phi2", lp.exp()), ("h2", lh.exp()), ("rel_wrt_h2", rel["wrt_h2"]), ("rel_wrt_phi2", rel["wrt_phi2"])):
        acc.tok.setdefault(key, []).extend(t.flatten().tolist())
    if official and not cap.causal and cap.example_mask(b) is None and kv is None:
        lpo = M.official_log_phi2(q, k, cap.scale)
        acc.rec.setdefault("jproj_official", []).extend((torch.exp(lpo).mean(-1) - pl["h2"]).tolist())


def _eigenpairs(k_c: Tensor, dv: int, settings: GramSettings) -> Dict[str, Tensor]:
    """The value-ranked eigenpairs (statistics, gamma) and the eigenvectors V_hat is built from, with the
    chosen sign convention."""
    eig = M.gram_eigen(k_c, dv)
    vhat_vecs = eig["vecs"] if settings.vhat_rank == "value" else M.gram_eigen(k_c, dv, "magnitude")["vecs"]
    if settings.eig_signs == "canonical":
        eig = {**eig, "vecs": M.canonical_signs(eig["vecs"])}
        vhat_vecs = M.canonical_signs(vhat_vecs)
    return {**eig, "vhat_vecs": vhat_vecs}


def _gram_records(cap: LayerCapture, b: int, k: Tensor, v: Tensor, kv: Optional[Tensor], acc: _LayerRecords,
                  settings: GramSettings, gen: torch.Generator) -> None:
    """Gram eigen-analysis, gamma and alignment of example ``b`` over its valid tokens (the causal mask
    does not enter: kernel PCA is defined on the set of keys), appended to ``acc``."""
    kk, vv = (k, v) if kv is None else (k[:, kv], v[:, kv])
    n, dv = kk.shape[-2], vv.shape[-1]
    if dv > n:
        raise ValueError(f"KPCA needs Dv <= N, got Dv={dv} > N={n}")
    g = M.centred_gram(kk, cap.scale)
    eig = _eigenpairs(g["k_c"], dv, settings)
    lam = eig["eig"].abs()  # the study's scale: eigenvalues of K_c (N lambda)
    for key, val in (("eig_max", lam.max(-1).values), ("eig_min", lam.min(-1).values),
                     ("eig_mean", lam.mean(-1)), ("eig_median", lam.median(-1).values)):
        acc.rec.setdefault(key, []).extend(val.tolist())
    gammas = _gamma_variants(g["k_c"], M.recover_a_hat(g["log_g"], vv), eig["vecs"], settings.perturb, gen) \
        if settings.gamma else {}
    for key, st in gammas.items():
        acc.gam[key].append(st["mean"])
        acc.gam_std[key].append(st["std"])
        acc.gam_rel[key].append(st["rel_mean"])
        if st["n_nonfinite"]:
            acc.failures.append({"layer": cap.name, "example": b, "stage": f"gamma/{key}",
                                 "error": f"{st['n_nonfinite']} (head, axis) pairs with a zero entry in a (gamma not finite); excluded"})
    if settings.alignment:
        v_hat = M.kpca_values(g["log_g"], eig["vhat_vecs"])
        for key, val in M.alignment_metrics(vv, v_hat).items():
            acc.rec.setdefault(key, []).extend(val.tolist())


class _LayerRecords:
    """What one layer's examples produce: per-record metric values, per-token norms, gamma statistics,
    failures."""

    def __init__(self, failures: List[dict]) -> None:
        self.rec: Dict[str, List[float]] = {}
        self.tok: Dict[str, List[float]] = {}
        self.gam: Dict[str, List[Tensor]] = {g: [] for g in GAMMA_VARIANTS}
        self.gam_std: Dict[str, List[Tensor]] = {g: [] for g in GAMMA_VARIANTS}
        self.gam_rel: Dict[str, List[Tensor]] = {g: [] for g in GAMMA_VARIANTS}
        self.failures = failures


def _gamma_summary(means: Tensor, stds: Optional[Tensor] = None, rels: Optional[Tensor] = None) -> Dict:
    """Per-axis statistics of a ``(records, Dv)`` matrix of per-record mean |dgamma| (and their pair stds)."""
    out: Dict[str, Any] = {"per_axis_mean": _nanmean0(means).tolist(),
                           "per_axis_std_of_means": _nanstd0(means).tolist()}
    if stds is not None:
        out["per_axis_std"] = _nanmean0(stds).tolist()
    if rels is not None:
        out["rel_mean"] = float(_nanmean0(rels.flatten()[:, None])[0])
    return {**out, **summarise_values(means.flatten().tolist())}


def _token_summary(tok: Dict[str, List[float]]) -> Dict[str, Any]:
    """Per-token norm distributions and the per-token relative errors of one layer (or all layers)."""
    out: Dict[str, Any] = {}
    if tok.get("phi2"):
        out["phi2_tokens"], out["h2_tokens"] = summarise_tokens(tok["phi2"]), summarise_tokens(tok["h2"])
        for key in ("h2", "phi2"):
            out[f"rel_error_per_token_wrt_{key}"] = summarise_values(tok[f"rel_wrt_{key}"])["mean"]
    return out


def _layer_summary(cap: LayerCapture, values: Tensor, n_ex: int, acc: _LayerRecords) -> Dict:
    layer = {
        "name": cap.name, "kind": cap.kind, "heads": cap.heads, "tokens": cap.tokens,
        "head_dim": int(cap.q.shape[-1]), "value_dim": int(values.shape[-1]), "examples": n_ex,
        "symmetric": cap.symmetric, "causal": cap.causal, "values": cap.v_eff_label,
        "keys": "pap_cleaned" if cap.kind == "rpc" else "raw",
    }
    for key, vals in acc.rec.items():
        layer[key] = summarise_values(vals)
    layer["log_mean_jproj"] = _log_mean(acc.rec.get("jproj", []))
    if acc.rec.get("jproj_official"):
        layer["log_mean_jproj_official"] = _log_mean(acc.rec["jproj_official"])
    layer.update(_relative_errors(acc.rec))
    layer.update(_token_summary(acc.tok))
    if acc.rec.get("jproj"):
        layer["frac_negative_jproj"] = sum(1 for x in acc.rec["jproj"] if x < 0) / len(acc.rec["jproj"])
    layer["gamma"] = {}
    for key in GAMMA_VARIANTS:
        if acc.gam[key]:
            layer["gamma"][key] = _gamma_summary(torch.cat(acc.gam[key], 0), torch.cat(acc.gam_std[key], 0),
                                                 torch.cat(acc.gam_rel[key], 0))
    return layer


def _relative_errors(rec: Dict[str, List[float]]) -> Dict[str, Optional[float]]:
    """The study's relative reconstruction errors of one layer (``norms.py``): with the layer's means of
    ||varphi(q)||^2 and ||h||^2, |phi2 - h2| / phi2 and |phi2 - h2| / h2."""
    phi2 = summarise_values(rec.get("phi2", []))["mean"]
    h2 = summarise_values(rec.get("h2", []))["mean"]
    if phi2 is None or h2 is None:
        return {}
    err = abs(phi2 - h2)
    return {"rel_error_wrt_phi2": err / phi2 if phi2 else None, "rel_error_wrt_h2": err / h2 if h2 else None}


def _mean_over_layers(layers: List[Dict], key: str, all_layers: bool = False) -> Optional[float]:
    """Plain mean of a per-layer number; ``all_layers``: None unless every layer has it (a log of a
    mean <= 0 makes the official average undefined, as its NaN would)."""
    vals = [L.get(key) for L in layers]
    fin = [v for v in vals if v is not None]
    if not fin or (all_layers and len(fin) != len(vals)):
        return None
    return sum(fin) / len(fin)


def _model_summary(all_rec: Dict[str, List[float]], all_tok: Dict[str, List[float]],
                   all_gamma: Dict[str, List[Tensor]], layers: List[Dict]) -> Dict:
    model = {key: summarise_values(vals) for key, vals in all_rec.items()}
    model["log_mean_jproj"] = _log_mean(all_rec.get("jproj", []))
    if all_rec.get("jproj_official"):
        model["log_mean_jproj_official"] = _log_mean(all_rec["jproj_official"])
        model["mean_layer_log_jproj_official"] = _mean_over_layers(layers, "log_mean_jproj_official", all_layers=True)
    model.update(_token_summary(all_tok))
    for key in ("rel_error_wrt_phi2", "rel_error_wrt_h2", "rel_error_per_token_wrt_phi2",
                "rel_error_per_token_wrt_h2"):  # both codes average the layers' errors
        model[key] = _mean_over_layers(layers, key)
    model["gamma"] = {}
    for key in GAMMA_VARIANTS:
        mats = all_gamma[key]
        if mats and len({m.shape[-1] for m in mats}) == 1:
            model["gamma"][key] = _gamma_summary(torch.cat(mats, 0))
        elif mats:
            model["gamma"][key] = summarise_values(torch.cat([m.flatten() for m in mats]).tolist())
    return model


def gram_not_applicable(captures: List[LayerCapture]) -> Dict[str, str]:
    """``{layer: reason}`` for the layers whose Gram analysis cannot run on any example: kernel PCA of
    N keys has at most N principal axes, so a value dimension Dv above the token count N leaves the
    value matrix V_hat undefined."""
    out = {}
    for cap in captures:
        dv = int(cap.values().shape[-1])
        if dv > cap.tokens:
            out[cap.name] = f"Dv={dv} > N={cap.tokens}"
    return out


def _analyze_layer(cap: LayerCapture, protocol: str, n_ex: int, gram: bool, settings: GramSettings,
                   standardize_eps: float, gen: torch.Generator, failures: List[dict]) -> _LayerRecords:
    """Every example of one captured layer: J_proj records, then (``gram``) the Gram analysis."""
    acc = _LayerRecords(failures)
    values = cap.values()
    for b in range(n_ex):
        q, k, v = _prep(cap.q[b], protocol, standardize_eps), _prep(cap.k[b], protocol, standardize_eps), values[b]
        if cap.symmetric:
            q = k
        kv = cap.key_valid(b)
        try:
            _projection_records(cap, b, q, k, v, kv, acc, official=protocol == "paper")
        except Exception as exc:
            failures.append({"layer": cap.name, "example": b, "stage": "jproj", "error": f"{type(exc).__name__}: {exc}"})
        if not gram:
            continue
        try:
            _gram_records(cap, b, k, v, kv, acc, settings, gen)
        except Exception as exc:
            failures.append({"layer": cap.name, "example": b, "stage": "gram", "error": f"{type(exc).__name__}: {exc}"})
    return acc


def analyze_captures(
    captures: List[LayerCapture],
    protocol: str = "exact",
    *,
    gram: bool = True,
    alignment: bool = True,
    gamma: bool = True,
    perturb: float = 0.1,
    seed: int = 0,
    max_examples: Optional[int] = None,
    vhat_rank: str = "value",
    eig_signs: str = "eigh",
    standardize_eps: float = 0.0,
) -> Dict:
    """Analyse every captured layer under ``protocol`` ("paper" or "exact").

    ``vhat_rank``, ``eig_signs`` (see :class:`GramSettings`) and ``standardize_eps`` (the eps of the
    ``paper`` standardisation; the study's scripts use 1e-8) are checked by :func:`check_conventions`;
    ``gamma=False`` leaves out gamma and its controls (the other numbers are unchanged).
    Returns ``{"protocol", "conventions", "layers": [...], "model": {...}, "failures": [...]}``; see the
    module doc.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    settings = GramSettings(alignment=alignment, gamma=gamma, perturb=perturb, vhat_rank=vhat_rank,
                            eig_signs=eig_signs)
    check_conventions((protocol,), standardize_eps, settings, gram)
    gen = torch.Generator().manual_seed(seed)
    skip_gram = gram_not_applicable(captures) if gram else {}
    layers, failures = [], []
    all_rec: Dict[str, List[float]] = {}
    all_tok: Dict[str, List[float]] = {}
    all_gamma: Dict[str, List[Tensor]] = {g: [] for g in GAMMA_VARIANTS}
    for cap in captures:
        t0 = time.perf_counter()
        n_ex = cap.batch if max_examples is None else min(cap.batch, max_examples)
        acc = _analyze_layer(cap, protocol, n_ex, gram and cap.name not in skip_gram, settings, standardize_eps,
                             gen, failures)
        layer = _layer_summary(cap, cap.values(), n_ex, acc)
        if cap.name in skip_gram:
            layer["gram"] = f"not applicable: {skip_gram[cap.name]}"
        for src, dst in ((acc.rec, all_rec), (acc.tok, all_tok)):
            for key, vals in src.items():
                dst.setdefault(key, []).extend(vals)
        for key in GAMMA_VARIANTS:
            if acc.gam[key]:
                all_gamma[key].append(torch.cat(acc.gam[key], 0))
        layer["seconds"] = round(time.perf_counter() - t0, 3)
        layers.append(layer)
    return {"protocol": protocol, "conventions": conventions(protocol, standardize_eps, settings), "layers": layers,
            "model": _model_summary(all_rec, all_tok, all_gamma, layers), "failures": failures}


def _nanstd0(t: Tensor) -> Tensor:
    """Population std over dim 0 of the finite entries (NaN where none)."""
    mean = _nanmean0(t)
    fin = torch.isfinite(t)
    dev = torch.where(fin, t - mean, torch.zeros_like(t))
    c = fin.sum(0)
    return torch.where(c > 0, ((dev * dev).sum(0) / c.clamp_min(1)).sqrt(), torch.full_like(mean, float("nan")))


def _nanmean0(t: Tensor) -> Tensor:
    fin = torch.isfinite(t)
    s = torch.where(fin, t, torch.zeros_like(t)).sum(0)
    c = fin.sum(0)
    return torch.where(c > 0, s / c.clamp_min(1), torch.full_like(s, float("nan")))


def _log_mean(vals: List[float]) -> Optional[float]:
    """Natural log of the mean J_proj (the paper's plotted quantity); None when the mean is <= 0."""
    fin = [v for v in vals if math.isfinite(v)]
    if not fin:
        return None
    m = sum(fin) / len(fin)
    return math.log(m) if m > 0 else None


def alignment_shape(cap: LayerCapture) -> tuple:
    """``(N, Dv)`` of a layer's alignment records: its valid tokens (those of example 0) and value dim."""
    kv = cap.key_valid(0)
    return (cap.tokens if kv is None else int(kv.sum()), int(cap.values().shape[-1]))


def capture_chance(captures: List[LayerCapture], draws: int = 8, seed: int = 0) -> Dict[str, Dict]:
    """:func:`chance_baselines` for every ``(N, Dv)`` shape the Gram analysis runs on in ``captures``."""
    return chance_baselines({(n, dv) for n, dv in map(alignment_shape, captures) if dv <= n}, draws=draws, seed=seed)


def chance_baselines(shapes: Iterable, draws: int = 8, seed: int = 0) -> Dict[str, Dict]:
    """Chance level of the alignment metrics for each distinct ``(N, Dv)``: independent Gaussian
    matrices of the same shapes. Keyed ``"NxDv"``."""
    out = {}
    for n, d in sorted(set((int(n), int(d)) for n, d in shapes)):
        if d <= n:
            out[f"{n}x{d}"] = M.random_alignment_baseline(n, d, draws=draws, seed=seed)
    return out


def pap_stats(captures: List[LayerCapture]) -> Dict[str, Dict[str, float]]:
    """Sparse part S of PAP per RPC layer: fraction of exact zeros, mean |S|, ||S||_F / ||K||_F,
    fraction of tokens with a non-zero S row, mean threshold tau. Keyed by layer name."""
    out = {}
    for cap in captures:
        if cap.pap is None:
            continue
        s = cap.pap["sparse"]
        act = sparse_term_activity(s, cap.pap["tau"], cap.k_raw)  # the kernel's one definition of S activity
        out[cap.name] = {
            "zero_fraction": 1.0 - act["frac_nonzero"],
            "mean_abs": float(s.abs().mean()),
            "rel_norm": act["s_over_k"],
            "token_fraction": act["frac_rows_nonzero"],
            "tau_mean": act["tau_mean"],
            "n_iter_run": int(cap.pap["n_iter_run"]),
        }
    return out
