"""Run the whole analysis on a :class:`~rpc_attention.kpca.sources.Probe` and write JSON, figures and
a markdown summary whose verdicts follow stated rules (see :data:`RULES`)."""

from __future__ import annotations

import logging
import math
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..files import atomic_write_json, atomic_write_text
from ..markdown import NOT_MEASURED, markdown_table
from ..train.sparsity import FIRED_RULE, measure_sparsity, probe_sparsity, sparsity_summary, sparsity_verdict
from .analysis import (
    ALIGN_METRICS,
    GramSettings,
    analyze_captures,
    capture_chance,
    check_conventions,
    gram_not_applicable,
    pap_stats,
)
from .hooks import AttentionCapture
from .sources import Probe

__all__ = ["RULES", "load_history", "run_analysis", "alignment_verdict", "gamma_verdict", "summary_markdown"]

log = logging.getLogger(__name__)

RULES = {
    "alignment": ("A metric supports 'the learned values are the KPCA value matrix V_hat' when it reaches 0.8 "
                  "(near-identical up to the metric's invariances); it is 'above chance' when it exceeds the "
                  "random-matrix baseline by more than 3 baseline std, 'below chance' when it is more than 3 baseline std "
                  "under it, otherwise it is 'at chance'."),
    "gamma": ("gamma = (K_c a_hat)/(a_hat N) is constant (= lambda) for an exact eigenvector. The learned a_hat is "
              "'consistent with eigenvectors' when its mean |gamma_i - gamma_j| is at most that of the perturbed "
              "control (the true eigenvectors plus 0.1 x Gaussian noise, re-orthonormalised by QR, as in the "
              "reproduction study); 'no better than random' when it is at least half of the random-vector control; "
              "otherwise 'in between'."),
    "jproj": ("J_proj is a projection residual only if ||h||^2 <= ||φ(q)||^2; a negative mean J_proj "
              "contradicts the projection reading. When the two terms differ by more than 10x, J_proj is "
              "dominated by the larger term. Over epochs, the change of J_proj is attributed to the term whose "
              "change is larger in absolute value."),
    "pap": ("For RPC layers, the sparse part S 'grows under perturbation' when ||S||_F/||K||_F under FGSM or "
            "noise exceeds the clean value by more than 5% relative; otherwise it is 'unchanged'."),
}


def load_history(run_dir: Path) -> List[Dict[str, Any]]:
    """The ``jproj/...`` records the ``jproj`` callback logged in ``run_dir/metrics.jsonl``."""
    from ..train.rundir import RunDir

    return [rec for rec in RunDir(run_dir).read_metrics(missing_ok=True) if any(str(k).startswith("jproj/") for k in rec)]


# ------------------------------------------------------------------ the analysis

def _capture(probe: Probe, x=None):
    with AttentionCapture(probe.model) as cap, torch.no_grad():
        if x is None:
            probe.forward()
        else:
            probe.forward_x(x)
    return cap


def _fgsm(probe: Probe, eps: float) -> torch.Tensor:
    x = probe.x01.detach().clone().requires_grad_(True)
    logits = probe.forward_x(x)
    labels = probe.labels if probe.labels is not None else logits.argmax(-1).detach()
    loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    (grad,) = torch.autograd.grad(loss, x)
    return (x + eps * grad.sign()).clamp(0.0, 1.0).detach()


def _perturbation_study(probe: Probe, clean_caps, eps: float, noise: float, seed: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {"clean": pap_stats(clean_caps)}
    if not out["clean"]:
        return {}
    if probe.x01 is None or probe.forward_x is None:
        out["note"] = "FGSM/noise not run: the probe has no pixel-space images (not an image classifier)"
        return out
    out["settings"] = {"fgsm_eps": eps, "noise_sigma": noise, "space": "pixel [0,1], clipped",
                       "labels": "true labels" if probe.labels is not None else "model predictions"}
    adv = _fgsm(probe, eps)
    out["fgsm"] = pap_stats(_capture(probe, adv).captures)
    gen = torch.Generator().manual_seed(seed)
    noisy = (probe.x01 + noise * torch.randn(probe.x01.shape, generator=gen).to(probe.x01.device)).clamp(0, 1)
    out["noise"] = pap_stats(_capture(probe, noisy).captures)
    return out


def _add_pap_records(result: Dict[str, Any], probe: Probe, cap, fgsm_eps: float, noise_sigma: float,
                     seed: int) -> None:
    """PAP under perturbation, S activity and the run's J_proj history, into ``result``; a part that fails
    is recorded in ``result["failures"]`` and the others still run."""
    try:
        pap = _perturbation_study(probe, cap.captures, fgsm_eps, noise_sigma, seed)
    except Exception as exc:
        pap = {}
        result["failures"].append({"stage": "pap-perturbation", "error": f"{type(exc).__name__}: {exc}"})
    if pap:
        result["pap"] = pap
    try:
        result["sparsity"] = _sparsity(probe)
    except Exception as exc:
        result["failures"].append({"stage": "sparsity", "error": f"{type(exc).__name__}: {exc}"})
    if probe.run_dir is not None:
        hist = load_history(probe.run_dir)
        if hist:
            result["history"] = hist


def run_analysis(
    probe: Probe,
    out_dir,
    *,
    protocols: Sequence[str] = ("paper", "exact"),
    perturb: float = 0.1,
    fgsm_eps: float = 2.0 / 255,
    noise_sigma: float = 0.1,
    seed: int = 0,
    figures: bool = True,
    alignment: bool = True,
    vhat_rank: str = "value",
    eig_signs: str = "eigh",
    standardize_eps: float = 0.0,
) -> Dict[str, Any]:
    """Capture, analyse under each protocol, study PAP under perturbation, write everything.

    Files in ``out_dir``: ``kpca.json``, ``summary.md`` and (``figures=True``) PNGs. Returns the
    result dict (the JSON content). A part of the analysis that cannot run on this model (the Gram
    analysis when Dv > N) is logged once as a warning before the work starts and recorded as
    ``result["not_applicable"]``. ``vhat_rank``, ``eig_signs``, ``standardize_eps``: see
    :func:`rpc_attention.kpca.analysis.analyze_captures`; checked before the capture.
    """
    conv = dict(vhat_rank=vhat_rank, eig_signs=eig_signs, standardize_eps=standardize_eps)
    check_conventions(protocols, standardize_eps,
                      GramSettings(alignment=alignment, perturb=perturb, vhat_rank=vhat_rank, eig_signs=eig_signs))
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    cap = _capture(probe)
    if not cap.captures:
        raise ValueError("no supported attention module ran in the forward pass (rpc_attention.nn modules, "
                         "timm Attention, Hugging Face self-attention)")
    note = _not_applicable_note(cap.captures)
    if note:
        log.warning(note)
    result: Dict[str, Any] = {
        "meta": {**probe.description, "protocols": list(protocols), "dtype": "float64", "seed": seed,
                 "perturbed_control": perturb, **conv, "torch": torch.__version__, "python": platform.python_version(),
                 "layers": [c.name for c in cap.captures]},
        "rules": RULES,
        "not_applicable": note,
        "failures": list(cap.errors),
        "protocols": {},
    }
    for proto in protocols:
        res = analyze_captures(cap.captures, proto, perturb=perturb, seed=seed, alignment=alignment,
                               **{**conv, "standardize_eps": standardize_eps if proto == "paper" else 0.0})
        result["failures"].extend({**f, "protocol": proto} for f in res.pop("failures"))
        result["protocols"][proto] = res
    result["chance"] = capture_chance(cap.captures, seed=seed)
    _add_pap_records(result, probe, cap, fgsm_eps, noise_sigma, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    if figures:
        _add_figures(result, out_dir)
    result["meta"]["seconds"] = round(time.perf_counter() - t0, 2)  # capture to figures, not model loading
    atomic_write_json(out_dir / "kpca.json", result, sort_keys=False, default=str)
    atomic_write_text(out_dir / "summary.md", summary_markdown(result))
    return result


def _add_figures(result: Dict[str, Any], out_dir: Path) -> None:
    """The PNGs into ``out_dir``, their names into ``result["figures"]``; a failure is recorded, not raised."""
    from .plots import make_figures

    try:
        result["figures"] = make_figures(result, out_dir)
    except Exception as exc:
        result["failures"].append({"stage": "figures", "error": f"{type(exc).__name__}: {exc}"})


def _not_applicable_note(captures) -> str:
    """One line naming the layers without Gram analysis (Dv > N), or ``""``."""
    skipped = gram_not_applicable(captures)
    if not skipped:
        return ""
    reasons = sorted(set(skipped.values()))
    which = "every layer" if len(skipped) == len(captures) else f"{len(skipped)} of {len(captures)} layers"
    return (f"value alignment and gamma not measured in {which} ({'; '.join(reasons)}: kernel PCA of N keys has at "
            "most N axes, so it needs the head dimension Dv <= the token count N: a model with more heads or more "
            "tokens, e.g. a Fashion-MNIST preset trained with --set model.kwargs.num_heads=6); J_proj and its "
            "terms are measured")


def _sparsity(probe: Probe) -> Dict[str, Any]:
    """S activity of the PAP blocks: a training run's on its fixed probe (the one its training logged),
    any other model's on the analysis probe."""
    if probe.cfg is not None:
        return probe_sparsity(probe.model, probe.cfg)
    blocks = measure_sparsity(probe.model, probe.forward)
    return {"probe": {"split": probe.description.get("split") or probe.description.get("inputs"),
                      "examples": probe.description.get("examples")},
            "blocks": blocks, "verdict": sparsity_verdict(blocks)}


# ------------------------------------------------------------------ summary

def _m(d: Optional[dict], key: str = "mean") -> Optional[float]:
    if not isinstance(d, dict):
        return None
    v = d.get(key)
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _fmt(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4):
        return f"{x:.{digits}e}"
    return f"{x:.{digits}f}"


def _pooled_chance(result: dict, metric: str):
    ch = result.get("chance", {})
    if not ch:
        return None, None
    ms = [v[metric]["mean"] for v in ch.values()]
    ss = [v[metric]["std"] for v in ch.values()]
    return sum(ms) / len(ms), max(ss)


def alignment_verdict(value: Optional[float], chance_mean: Optional[float], chance_std: Optional[float]) -> str:
    if value is None:
        return NOT_MEASURED
    if value >= 0.8:
        return "supports"
    if chance_mean is not None and value > chance_mean + 3 * (chance_std or 0.0):
        return "above chance"
    if chance_mean is not None and value < chance_mean - 3 * (chance_std or 0.0):
        return "below chance"
    return "at chance"


def gamma_verdict(gm: dict) -> str:
    learned, pert, rnd = (_m(gm.get(k)) for k in ("learned", "perturbed", "random"))
    if learned is None or pert is None or rnd is None:
        return NOT_MEASURED
    if learned <= pert:
        return "consistent with eigenvectors"
    if learned >= 0.5 * rnd:
        return "no better than random"
    return "in between"


def _summary_table(result: dict, chance: Dict[str, tuple]) -> List[str]:
    """One row per protocol plus the chance row (norms written with the norm sign: ``|`` splits cells)."""
    header = ["protocol", "J_proj", "\u2016φ(q)\u2016²", "\u2016h\u2016²", "log mean J_proj", "optimal cos",
              "linear CKA", "RBF CKA", "direct cos", "mean abs dgamma learned / perturbed / random"]
    rows = []
    for proto, res in result["protocols"].items():
        mo = res["model"]
        g = mo.get("gamma", {})
        rows.append([proto, f"{_fmt(_m(mo.get('jproj')))} ± {_fmt(_m(mo.get('jproj'), 'std'))}",
                     _fmt(_m(mo.get("phi2"))), _fmt(_m(mo.get("h2"))), _fmt(mo.get("log_mean_jproj")),
                     _fmt(_m(mo.get("optimal_cosine"))), _fmt(_m(mo.get("linear_cka"))), _fmt(_m(mo.get("rbf_cka"))),
                     _fmt(_m(mo.get("direct_cosine"))),
                     f"{_fmt(_m(g.get('learned')))} / {_fmt(_m(g.get('perturbed')))} / {_fmt(_m(g.get('random')))}"])
    rows.append(["chance (random matrices)", "", "", "", "", _fmt(chance["optimal_cosine"][0]),
                 _fmt(chance["linear_cka"][0]), _fmt(chance["rbf_cka"][0]), _fmt(chance["direct_cosine"][0]), ""])
    return markdown_table(header, rows)


def _alignment_section(result: dict, chance: Dict[str, tuple]) -> List[str]:
    parts = []
    for proto, res in result["protocols"].items():
        mo = res["model"]
        verdicts = {k: alignment_verdict(_m(mo.get(k)), *chance[k]) for k in ("optimal_cosine", "linear_cka", "rbf_cka")}
        desc = ", ".join(f"{k.replace('_', ' ')} {_fmt(_m(mo.get(k)))} ({v}; chance {_fmt(chance[k][0])})"
                         for k, v in verdicts.items())
        if all(v == NOT_MEASURED for v in verdicts.values()):
            why = "not applicable to this model, see above" if result.get("not_applicable") else "see Failures"
            concl = f"{NOT_MEASURED} ({why}), so nothing is concluded"
        elif any(v == "supports" for v in verdicts.values()):
            concl = "at least one metric reaches the 0.8 support level, so the numbers support the claim for this metric"
        elif any(v == "above chance" for v in verdicts.values()):
            concl = ("the metrics exceed chance but stay far below 0.8: the numbers show some shared structure "
                     "and do not support the claim that V equals V_hat")
        else:
            concl = ("no metric exceeds the chance level (random matrices of the same shapes): the numbers do not "
                     "support the claim that V equals V_hat")
        parts.append(f"Under `{proto}`: {desc}; {concl}.")
    return ["## Value vectors vs. the KPCA value matrix (claim 2, reproduction-study metrics)", "",
            " ".join(parts) + " Rule: " + RULES["alignment"], ""]


def _gamma_section(result: dict) -> List[str]:
    parts = []
    for proto, res in result["protocols"].items():
        g = res["model"].get("gamma", {})
        eig = res["model"].get("eig_mean")
        parts.append(
            f"Under `{proto}`: mean |gamma_i - gamma_j| is {_fmt(_m(g.get('learned')))} for the learned values, "
            f"{_fmt(_m(g.get('eigvec')))} for the true eigenvectors, {_fmt(_m(g.get('perturbed')))} for perturbed "
            f"eigenvectors (noise and QR) and {_fmt(_m(g.get('random')))} for random vectors (mean |eigenvalue of "
            f"K_c| {_fmt(_m(eig))}): "
            f"{gamma_verdict(g)}.")
    return ["## Constant gamma (value columns as Gram eigenvectors)", "",
            " ".join(parts) + " Rule: " + RULES["gamma"], ""]


def _jproj_terms(proto: str, model: dict) -> str:
    phi2, h2, j = _m(model.get("phi2")), _m(model.get("h2")), _m(model.get("jproj"))
    s = f"Under `{proto}`: J_proj = {_fmt(j)}, ||φ(q)||^2 = {_fmt(phi2)}, ||h||^2 = {_fmt(h2)}"
    if j is not None and j < 0:
        s += "; the mean J_proj is negative (||h||^2 > ||φ(q)||^2), which contradicts reading h as a projection of φ(q)"
    if phi2 and h2:
        ratio = h2 / phi2
        if ratio > 10 or ratio < 0.1:
            big = "||h||^2" if ratio > 1 else "||φ(q)||^2"
            s += f"; the terms differ by {_fmt(max(ratio, 1 / ratio), 1)}x, so J_proj is dominated by {big}"
        else:
            s += f"; the terms are within 10x ({_fmt(ratio, 2)})"
    if "log_mean_jproj_official" in model:
        s += (f"; the official code's J_proj form: ln of the pooled mean {_fmt(model.get('log_mean_jproj_official'))}, "
              f"mean over layers of each layer's ln (the official code's logged figure) "
              f"{_fmt(model.get('mean_layer_log_jproj_official'))}")
    return s + "."


def _jproj_history(result: dict) -> List[str]:
    hist = result.get("history")
    if not hist or len(hist) < 2:
        return ["No J_proj history was logged for this model (train with `--set train.callbacks=[jproj]`), "
                "so nothing is said about how training changes J_proj."]
    parts = []
    for proto in result["protocols"]:
        keys = [f"jproj/{proto}/model/{t}" for t in ("jproj", "phi2", "h2")]
        rec = [r for r in hist if all(k in r and r[k] is not None for k in keys)]
        if len(rec) >= 2:
            dj, dp, dh = (rec[-1][k] - rec[0][k] for k in keys)
            driver = "||h||^2" if abs(dh) > abs(dp) else "||φ(q)||^2"
            parts.append(f"Over {len(rec)} logged epochs ({proto}): J_proj changed by {_fmt(dj)}, ||φ(q)||^2 by "
                         f"{_fmt(dp)} and ||h||^2 by {_fmt(dh)}, so the change is driven by {driver}.")
    return parts


def _jproj_section(result: dict) -> List[str]:
    parts = [_jproj_terms(proto, res["model"]) for proto, res in result["protocols"].items()]
    parts += _jproj_history(result)
    return ["## Projection loss J_proj (claim 1)", "", " ".join(parts) + " Rule: " + RULES["jproj"], ""]


def _pap_section(pap: Optional[dict]) -> List[str]:
    if not pap:
        return []
    parts = []
    for name, st in pap["clean"].items():
        s = (f"`{name}`: clean ||S||/||K|| = {_fmt(st['rel_norm'])}, zero fraction {_fmt(st['zero_fraction'])}, "
             f"tokens with non-zero S {_fmt(st['token_fraction'])}")
        for cond in ("fgsm", "noise"):
            if cond in pap and name in pap[cond]:
                r = pap[cond][name]["rel_norm"]
                grows = r > st["rel_norm"] * 1.05
                s += f"; {cond} {_fmt(r)} ({'grows' if grows else 'unchanged'})"
        parts.append(s + ".")
    if "note" in pap:
        parts.append(pap["note"] + ".")
    return ["## RPC layers: the sparse part S of PAP", "", " ".join(parts) + " Rule: " + RULES["pap"], ""]


def _sparsity_section(sp: dict) -> List[str]:
    if not sp.get("blocks"):
        return []
    probe = sp.get("probe") or {}
    lines = [f"## PAP's sparse step: {sp['verdict']}", "",
             f"S activity of each PAP block on {probe.get('examples')} {probe.get('split')} examples:", ""]
    return lines + [f"- {line}" for line in sparsity_summary(sp)] + ["", "Rule: " + FIRED_RULE, ""]


def _failures_section(failures: List[dict]) -> List[str]:
    if not failures:
        return []
    lines = [f"## Failures ({len(failures)}, all listed in kpca.json)", ""]
    groups: Dict[tuple, List[str]] = {}
    counts: Dict[tuple, int] = {}
    for f in failures:
        key = (f.get("protocol", ""), f.get("stage", ""), str(f.get("error", "")))
        groups.setdefault(key, [])
        counts[key] = counts.get(key, 0) + 1
        layer = f.get("layer")
        if layer is not None and layer not in groups[key]:
            groups[key].append(layer)
    for (proto, stage, err), layers in list(groups.items())[:30]:
        where = f" in {', '.join(layers[:6])}{' ...' if len(layers) > 6 else ''}" if layers else ""
        lines.append(f"- {proto + ' ' if proto else ''}{stage}: {err} ({counts[(proto, stage, err)]}x{where})")
    return lines + [""]


def summary_markdown(result: dict) -> str:
    """``summary.md``: the table of every protocol, then one paragraph per claim with its rule."""
    meta = result["meta"]
    lines = [f"# Kernel-PCA analysis: {meta.get('model') or meta.get('run') or 'model'}", ""]
    lines.append(f"Source: {meta.get('source')}; weights: {meta.get('weights', meta.get('run', 'n/a'))}; "
                 f"probe: {meta.get('examples')} examples ({meta.get('inputs', meta.get('split', ''))}); "
                 f"layers analysed: {len(meta.get('layers', []))}; float64. Every number names its protocol "
                 "(`paper`: per-token standardised q, k; `exact`: the definitions).")
    lines.append(f"Conventions: V_hat from the eigenpairs ranked by {meta.get('vhat_rank', 'value')}, eigenvector "
                 f"signs {meta.get('eig_signs', 'eigh')}, `paper` standardisation eps "
                 f"{meta.get('standardize_eps', 0.0):g} (every number's convention: kpca.json, `conventions`).")
    lines.append("")
    if result.get("not_applicable"):
        lines += [f"Not applicable to this model: {result['not_applicable']}.", ""]
    chance = {k: _pooled_chance(result, k) for k in ALIGN_METRICS}
    lines += _summary_table(result, chance) + [""]
    lines += _alignment_section(result, chance) + _gamma_section(result) + _jproj_section(result)
    lines += _pap_section(result.get("pap")) + _sparsity_section(result.get("sparsity") or {})
    lines += _failures_section(result.get("failures") or [])
    # the prose writes norms as "||x||"; the norm sign keeps them from reading as table cells
    return ("\n".join(lines) + "\n").replace("||", "\u2016")
