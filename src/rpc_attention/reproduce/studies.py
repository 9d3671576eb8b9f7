"""Study builder: which models to train (trainer presets + overrides, seeds), which suites to run on
them, which analyses, and which claims of the paper each comparison tests.

The studies are data (:mod:`rpc_attention.reproduce.study_data`: typed settings, model rows, claims);
``get_study(name, settings)`` builds a :class:`Study` from them and :func:`build_stages` turns it into
the ordered stage list run by :class:`~rpc_attention.reproduce.pipeline.Pipeline`. Study settings are
changed with ``rpc-attention reproduce --set KEY=VALUE`` (``seeds=0,1,2``, ``eval_limit=500``,
``data.imagenet=PATH``, ``suites=[clean,pgd]`` ...); every study lists its settings in ``--list``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..evaluate.suites import get_suite
from . import estimates as E
from . import paper_data as PD
from . import study_data as D
from .pipeline import Stage
from .specs import ClaimSpec, EvalSpec, ModelSpec, Study, StudyError, parse_settings, settings_dict

__all__ = ["ModelSpec", "EvalSpec", "ClaimSpec", "Study", "STUDIES", "get_study", "build_stages",
           "parse_settings", "StudyError", "list_studies"]


def _require_paths(settings: Dict[str, Any], keys: Sequence[str], study: str) -> None:
    for k in keys:
        v = settings.get(k)
        if not v:
            raise StudyError(f"study {study!r} needs {k}: pass --set {k}=PATH ({D.PATH_HELP.get(k, 'a data path')})")
        if not Path(str(v)).expanduser().exists():
            raise StudyError(f"--set {k}={v}: no such file or directory ({D.PATH_HELP.get(k, '')})")


def _models(rows: Sequence[D.ModelRow], s: Dict[str, Any], seeds: List[int], overrides: List[str], samples: int,
            depth: int) -> List[ModelSpec]:
    """The models of ``rows`` with their presets from the settings ``s``, trained with ``seeds``."""
    out = []
    for r in rows:
        if not s[r.preset]:  # an empty preset setting leaves the model out
            continue
        n_iter, layers = r.pap
        cost = r.cost * E.pap_factor(n_iter, depth if layers is None else layers, depth) if n_iter > 1 else r.cost
        callbacks = list(r.callbacks) if not r.callbacks_if or s.get(r.callbacks_if) else []
        out.append(ModelSpec(key=r.key, label=r.label, preset=s[r.preset],
                             overrides=list(overrides) + list(r.overrides), family=r.family, role=r.role,
                             seeds=list(seeds), train_samples=samples, cost=cost, callbacks=callbacks,
                             base=r.base, model_kwargs=dict(r.model_kwargs)))
    return out


def _claims(claims: Sequence[ClaimSpec], suites: Sequence[str]) -> List[ClaimSpec]:
    """The claims whose suite the study runs."""
    return [c for c in claims if c.suite in suites]


def _vision_evals(s: Dict[str, Any], keys: List[str], suites: Sequence[str],
                  known: Optional[Sequence[str]] = None) -> List[EvalSpec]:
    """The evaluations of ``suites`` on the models ``keys``, each asked for as the suite says
    (:class:`~rpc_attention.evaluate.suites.StudyUse`): its example limit, sweep, names, copies and
    models (``known``: every model key a study setting may name, the study's models by default)."""
    out = []
    for name in suites:
        try:
            suite = get_suite(name)
        except ValueError as exc:
            raise StudyError(f"--set suites: {exc}") from None
        if "classification" not in suite.tasks:
            raise StudyError(f"--set suites: {name!r} is not an image-classification suite")
        out.append(_study_eval(s, suite, keys, known))
    return out


def _study_eval(s: Dict[str, Any], suite, keys: List[str], known: Optional[Sequence[str]] = None) -> EvalSpec:
    use, name = suite.study, suite.name
    sets: List[str] = []
    n_eps = steps = None
    if use.sweep:
        eps = s["eps"]
        sets.append(f"{name}.eps={eps}")
        n_eps = len(str(eps).split(",")) if ":" not in str(eps) else 6
    if use.steps and s.get(f"{name}_steps"):
        steps = int(s[f"{name}_steps"])
        sets.append(f"{name}.steps={steps}")
    copies = use.copies
    if use.names:
        names = s.get(use.names) or []
        sets += [f"{name}.names={','.join(names)}"] if names else []
        copies = use.copies * (len(names) or use.all_names)
    if use.extra_sets:
        sets += list(s.get(use.extra_sets) or [])
    if use.models and s.get(use.models):  # the suite runs on the listed models only
        listed = [str(m) for m in s[use.models]]
        unknown = sorted(set(listed) - set(known or keys))
        if unknown:
            raise StudyError(f"--set {use.models}: no model {', '.join(unknown)} (models: {', '.join(known or keys)})")
        keys = [k for k in keys if k in listed]  # a listed model the study leaves out (empty preset) is skipped
    return EvalSpec(suite=name, models=keys, sets=sets, limit=s.get(use.limit) or s.get("eval_limit"), n_eps=n_eps,
                    steps=steps, copies=copies, baseline_model="symvit" if use.baseline else None)


def _add_fan(st: Study, models: List[ModelSpec], evals: List[EvalSpec]) -> None:
    """Append the FAN comparison to a study: its models, its evaluations (corruption errors normalised
    by SymFAN) and the paper's FAN claims for the suites it runs."""
    st.models.extend(models)
    for ev in evals:
        if ev.baseline_model:
            ev.baseline_model = "symfan"
    st.evals.extend(evals)
    st.claims += _claims(D.FAN_CLAIMS, {ev.suite for ev in evals})


# ------------------------------------------------------------------------------------------ fmnist
def _fmnist_common(s: Dict[str, Any]) -> tuple:
    """Trainer overrides of the shortened schedules (without the model overrides) and the samples seen."""
    # Shortened schedules through the trainer's own keys: the cosine schedule spans `epochs` of
    # `train_subset` images, so a short run still decays its learning rate.
    epochs, bs, subset = int(s["epochs"]), int(s["batch_size"]), int(s.get("train_subset") or 0)
    common = [f"train.epochs={epochs}", f"train.batch_size={bs}"]
    if subset:
        common.append(f"data.train_subset={subset}")
    if s.get("val_size") is not None:
        common.append(f"data.val_size={int(s['val_size'])}")
    if s.get("test_subset"):
        common.append(f"data.test_subset={int(s['test_subset'])}")
    if s.get("subset_seed"):
        common.append(f"data.subset_seed={int(s['subset_seed'])}")
    if s.get("test_offset"):
        common.append(f"data.test_offset={int(s['test_offset'])}")
    return common, epochs * (subset or (60000 - int(s.get("val_size") or 0)))


def _add_lm(st: Study, s: Dict[str, Any], seeds: List[int]) -> None:
    """The Symlm / RPC-Symlm pair on the embedded corpus, its perplexity suites and claims."""
    lm_seeds = [int(x) for x in (s.get("lm_seeds") or seeds)]
    steps, bs = int(s["lm_steps"]), int(s["lm_batch_size"])
    common = [f"train.max_steps={steps}", f"train.batch_size={bs}"] + list(s.get("lm_overrides") or [])
    lm = _models(D.WIKI_LM, s, lm_seeds, common, steps * bs, depth=2)
    if len(lm_seeds) < len(seeds):
        st.notes.append(f"The language-model pair is trained with {len(lm_seeds)} seed(s) "
                        f"({', '.join(map(str, lm_seeds))}) and the vision models with {len(seeds)}: an LM "
                        "training costs as much as several vision ones here. Its rows have a seed interval and a "
                        "paired t test only with two or more seeds, so with one seed its verdicts are "
                        "\"unresolved (one seed)\" (the example interval over token blocks is still shown).")
    st.models.extend(lm)
    lk = [m.key for m in lm]
    lim = int(s.get("lm_eval_limit") or 0) or None
    sets = list(s.get("lm_eval_sets") or [])
    st.evals += [EvalSpec(suite="ppl", models=lk, sets=[f"ppl.{x}" for x in sets], limit=lim),
                 EvalSpec(suite="wordswap", models=lk, sets=[f"wordswap.{x}" for x in sets] + ["wordswap.clean=false"],
                          limit=lim)]
    st.claims += list(D.LM_CLAIMS)


def _fmnist_study(name: str, s: Dict[str, Any]) -> Study:
    seeds = [int(x) for x in s["seeds"]]
    if not seeds:
        raise StudyError("--set seeds=...: at least one seed")
    suites = list(s["suites"])
    common, samples = _fmnist_common(s)
    models = _models(D.FMNIST_VISION, s, seeds, common + list(s.get("train_overrides") or []), samples,
                     int(s["depth"]))
    evals = _vision_evals(s, [m.key for m in models], suites, [r.key for r in D.FMNIST_VISION])
    analyses = [{"model": "symvit", "sets": list(s.get("analyze_sets") or [])}]
    keys = {m.key for m in models}
    claims = [c for c in _claims(D.VISION_CLAIMS + D.PCP_CLAIMS + D.ROBUST_CLAIMS, suites) if c.rpc in keys]
    st = Study(name, D.TEXTS[name].description, models, evals, analyses, None, claims, s)
    if s.get("lm"):
        _add_lm(st, s, seeds)
    return st


def _fmnist_full(name: str, s: Dict[str, Any]) -> Study:
    st = _fmnist_study(name, s)
    seeds = list(s["seeds"])
    common, samples = st.models[0].overrides, st.models[0].train_samples
    scaled = _models(D.SCALED, s, seeds, common, samples, depth=1)
    st.models.extend(scaled)
    st.evals.append(EvalSpec(suite="clean", models=[m.key for m in scaled], limit=None))
    st.claims += list(D.SCALED_CLAIMS)
    seg_epochs = int(s["seg_epochs"])
    seg_ov = [f"train.epochs={seg_epochs}"] + list(s.get("seg_overrides") or [])
    seg = _models(D.SEG, s, seeds, seg_ov, seg_epochs * 3000, depth=1)
    st.models.extend(seg)
    sk = [m.key for m in seg]
    st.evals += [EvalSpec(suite="seg", models=sk, sets=["seg.save_examples=4"], limit=s.get("seg_limit") or None),
                 EvalSpec(suite="seg-corruptions", models=sk, limit=s.get("seg_corruption_limit") or None, copies=75)]
    st.claims += list(D.SEG_CLAIMS)
    fan_common, fan_samples = _fmnist_common(s)
    fan = _models(D.FAN, s, seeds, fan_common + list(s.get("fan_overrides") or []), fan_samples, int(s["fan_depth"]))
    _add_fan(st, fan, _vision_evals(s, [m.key for m in fan], ("clean", "fgsm", "pgd", "corruptions")))
    return st


# ------------------------------------------------------------------------------- cluster studies
def _imagenet_evals(s: Dict[str, Any], keys: List[str], root: str) -> List[EvalSpec]:
    lim = s.get("eval_limit") or None
    alim = s.get("attack_limit") or None
    strong = s.get("strong_attack_limit") or None
    evals = [EvalSpec(suite="clean", models=keys, limit=lim or 50000),
             EvalSpec(suite="fgsm", models=keys, sets=["fgsm.eps=1:6/255"], limit=alim or 50000, n_eps=6),
             EvalSpec(suite="pgd", models=keys, sets=["pgd.eps=1:6/255"], limit=alim or 50000, n_eps=6),
             EvalSpec(suite="autoattack", models=keys, limit=strong),
             EvalSpec(suite="square", models=keys, limit=strong)]
    if s.get("data.imagenet_c"):
        # mCE normalised by the SymViT's own errors (as on Fashion-MNIST), next to the raw mean error
        evals.append(EvalSpec(suite="corruptions", models=keys, sets=[f"corruptions.root={s['data.imagenet_c']}"],
                              limit=lim or 50000, copies=75, baseline_model="symvit"))
    if s.get("data.imagenet_o"):
        evals.append(EvalSpec(suite="ood", models=keys, sets=[
            f"ood.imagenet_o={s['data.imagenet_o']}", f"ood.imagenet_val={Path(root) / 'val'}",
            f"ood.classes={s['data.imagenet_o_classes']}"], limit=lim, copies=2))
    for tag in ("a", "r"):
        if s.get(f"data.imagenet_{tag}"):
            evals.append(EvalSpec(suite=f"imagenet-{tag}", models=keys, sets=[
                f"imagenet-{tag}.root={s[f'data.imagenet_{tag}']}",
                f"imagenet-{tag}.classes={s[f'data.imagenet_{tag}_classes']}"], limit=lim, copies=1))
    return evals


def _imagenet(name: str, s: Dict[str, Any]) -> Study:
    _require_paths(s, ["data.imagenet"], name)
    for k in ("data.imagenet_c", "data.imagenet_o", "data.imagenet_a", "data.imagenet_r"):
        if s.get(k):
            _require_paths(s, [k] + ([f"{k}_classes"] if k != "data.imagenet_c" else []), name)
    seeds = [int(x) for x in s["seeds"]]
    root = str(Path(s["data.imagenet"]).expanduser())
    samples = 300 * 1_281_167
    models = _models(D.IMAGENET_VISION, s, seeds, [f"data.root={root}"] + list(s["train_overrides"]), samples, 12)
    evals = _imagenet_evals(s, [m.key for m in models], root)
    suites = [ev.suite for ev in evals if not ev.suite.startswith("imagenet-")]
    st = Study(name, D.TEXTS[name].description, models, evals, [{"model": "symvit", "sets": []}], None,
               _claims(D.VISION_CLAIMS, suites), s, device=str(s["device"]))
    fan = _models(D.FAN, s, seeds, [f"data.root={root}"] + list(s["fan_overrides"]), samples, 12)
    fan_evals = [copy.deepcopy(ev) for ev in evals if ev.suite not in ("autoattack", "square")]
    for ev in fan_evals:
        ev.models = [m.key for m in fan]
    _add_fan(st, fan, fan_evals)
    return st


def _wikitext103(name: str, s: Dict[str, Any]) -> Study:
    _require_paths(s, ["data.wikitext103"], name)
    root = str(Path(s["data.wikitext103"]).expanduser())
    models = _models(D.WT103_LM, s, [int(x) for x in s["seeds"]], [f"data.root={root}"] + list(s["lm_overrides"]),
                     500_000 * 96 * 256, depth=16)
    keys = [m.key for m in models]
    evals = [EvalSpec(suite="ppl", models=keys), EvalSpec(suite="wordswap", models=keys)]
    return Study(name, D.TEXTS[name].description, models, evals, [], None, list(D.LM_CLAIMS), s,
                 device=str(s["device"]))


def _lm_gap(name: str, s: Dict[str, Any]) -> Study:
    seeds = [int(x) for x in s["seeds"]]
    if len(seeds) < 2:
        raise StudyError("--set seeds=...: the lm-gap study pairs seeds; give at least two")
    steps, bs = int(s["lm_steps"]), int(s["lm_batch_size"])
    common = [f"train.max_steps={steps}", f"train.batch_size={bs}"] + list(s.get("lm_overrides") or [])
    models = _models(D.LM_GAP_MODELS, s, seeds, common, steps * bs, depth=4)
    lim = int(s.get("lm_eval_limit") or 0) or None
    evals = [EvalSpec(suite="ppl", models=[m.key for m in models],
                      sets=[f"ppl.{x}" for x in s.get("lm_eval_sets") or []], limit=lim)]
    return Study(name, D.TEXTS[name].description, models, evals, [], None, list(D.LM_GAP_CLAIMS), s)


def _patch_study(name: str, s: Dict[str, Any]) -> Study:
    """The quick study's vision models that the patch study keeps, its two robust variants and the key controls
    (on the SymViT's runs), the patch suite on all of them and a claim per model against SymViT."""
    seeds = [int(x) for x in s["seeds"]]
    if not seeds:
        raise StudyError("--set seeds=...: at least one seed")
    if not s["preset_symvit"]:
        raise StudyError("--set preset_symvit=...: the patch study compares every model with SymViT")
    common, samples = _fmnist_common(s)
    overrides = common + list(s.get("train_overrides") or [])
    # each control at its study setting's level (clip_level, drop_level)
    controls = [replace(r, model_kwargs=r.model_kwargs + (
        ("key_control_level", float(s[f"{dict(r.model_kwargs)['key_control']}_level"])),))
        for r in D.PATCH_CONTROLS] if s.get("controls") else []
    rows = D.FMNIST_VISION + D.PATCH_VARIANTS + tuple(controls)
    models = _models(rows, s, seeds, overrides, samples, int(s["depth"]))
    keys = [m.key for m in models]
    evals = _vision_evals(s, keys, list(s["suites"]), [r.key for r in rows])
    claims = [c for c in _claims(D.PATCH_CLAIMS, s["suites"]) if c.rpc in keys]
    return Study(name, D.TEXTS[name].description, models, evals, [], None, claims, s)


# ------------------------------------------------------------------------------------------- paper
# which setting holds each suite's example count in a pilot run (a plan gives every claim its own)
_PAPER_LIMITS = {"clean": "clean_limit", "corruptions": "corruption_limit", "ood": "ood_limit", "fgsm": "fgsm_limit",
                 "pgd": "pgd_limit", "autoattack": "autoattack_limit", "square": "square_limit", "seg": "seg_limit",
                 "seg-corruptions": "seg_corruption_limit", "ppl": None, "wordswap": None, "kpca": "kpca_limit"}


def _paper_suite_sets(suite: str, s: Dict[str, Any]) -> tuple:
    """``(eval --set options, n_eps, steps, copies)`` of one suite as the paper study runs it."""
    if suite in ("fgsm", "pgd"):
        n_eps = len(str(s["eps"]).split(",")) if ":" not in str(s["eps"]) else 6
        sets = [f"{suite}.eps={s['eps']}"] + ([f"pgd.steps={int(s['pgd_steps'])}"] if suite == "pgd" else [])
        return sets, n_eps, int(s["pgd_steps"]) if suite == "pgd" else None, 1
    if suite == "corruptions":
        names = list(s["corruptions"])
        return ([f"corruptions.names={','.join(names)}"] if names else []), None, None, 5 * (len(names) or 15)
    if suite == "ood":
        return list(s["ood_sets"]), None, None, 2
    if suite == "seg":
        return ["seg.save_examples=4"], None, None, 1
    if suite == "seg-corruptions":
        return [], None, None, 75
    if suite in ("ppl", "wordswap"):
        sets = [f"{suite}.{x}" for x in s["lm_eval_sets"]] + (["wordswap.clean=false"] if suite == "wordswap" else [])
        return sets, None, None, 1
    return [], None, None, 1


def _paper_models(s: Dict[str, Any], seeds_of: Dict[str, List[int]]) -> List[ModelSpec]:
    """The models the claims use, each trained on the union of its claims' seeds (in first-use order)."""
    common, samples = _fmnist_common(s)
    vision = _models(PD.PAPER_VISION + D.SCALED, s, [], common + list(s["train_overrides"]), samples, int(s["depth"]))
    seg_epochs = int(s["seg_epochs"])
    seg_common = [f"train.epochs={seg_epochs}"] + ([f"data.seed={int(s['seg_data_seed'])}"]
                                                   if s.get("seg_data_seed") else [])
    seg = _models(PD.PAPER_SEG, s, [], seg_common, seg_epochs * 3000, depth=4)
    layers, steps, bs = int(s["lm_layers"]), int(s["lm_steps"]), int(s["lm_batch_size"])
    if layers < 4:
        raise StudyError(f"--set lm_layers={layers}: PAP runs in the first quarter of the layers; give at least 4")
    quarter = list(range(layers // 4))
    lm_common = [f"train.max_steps={steps}", f"train.batch_size={bs}", f"model.kwargs.n_layer={layers}"]
    lm = _models(D.WIKI_LM, s, [], lm_common, steps * bs, depth=layers)
    for m in lm:  # the estimates' LM constant is for the presets' 4 layers: cost grows with depth
        if m.role == "rpc":
            m.overrides.append(f"model.kwargs.rpc_layers=[{','.join(map(str, quarter))}]")
            m.label = f"RPC-Symlm ({layers} layers, 4 iters in blocks 1-{len(quarter)})"
            m.cost = E.pap_factor(4, len(quarter), layers) * layers / 4
        else:
            m.label = f"Symlm ({layers} layers)"
            m.cost = layers / 4
    out = []
    for m in vision + seg + lm:
        if m.key in seeds_of:
            m.seeds = list(seeds_of[m.key])
            out.append(m)
    return out


def _paper_seeds(rows: List[tuple]) -> tuple:
    """``({model: seeds}, {(suite, model): {"seeds", "limit"}})``: every model on the union of its claims'
    seeds; one evaluation per (suite, model) on its claims' seeds, with the most examples any of them asks."""
    seeds_of: Dict[str, List[int]] = {}
    evals: Dict[tuple, Dict[str, Any]] = {}
    for spec, seeds, limit in rows:
        for key in (spec.baseline, spec.rpc):
            seeds_of.setdefault(key, [])
            seeds_of[key] += [x for x in seeds if x not in seeds_of[key]]
            ev = evals.setdefault((spec.suite, key), {"seeds": [], "limit": limit})
            ev["seeds"] += [x for x in seeds if x not in ev["seeds"]]
            if limit is not None and (ev["limit"] is None or limit > ev["limit"]):
                ev["limit"] = limit
    return seeds_of, evals


def _paper_study(name: str, s: Dict[str, Any]) -> Study:
    """The paper's scorecard: one claim per row of its results table plus the Scaled-Attention finding. A
    pilot (no ``plan``) runs every claim on ``seeds`` with the settings' limits, margin 0 and no target; with
    a plan, the plan's settings, seeds, examples, targets and margins (:mod:`rpc_attention.reproduce.plan`)."""
    from . import plan as P

    plan = None
    if s.get("plan"):
        plan = P.load_plan(s["plan"])
        s = P.study_settings(plan, s)
    rows, not_run = [], []
    for c in PD.PAPER_CLAIMS:
        entry = P.plan_claim(plan, c.id) if plan else None
        if plan and entry is None:   # a claim the plan does not hold (a later format's) is not run
            continue
        if c.id in PD.PAPER_NOT_RUN or (entry and entry["status"] == P.NOT_RUN):
            info = dict(PD.PAPER_NOT_RUN.get(c.id) or {}, **{k: entry[k] for k in ("reason", "command", "cost")
                                                            if entry and entry.get(k)})
            not_run.append({"id": c.id, "title": f"{c.subject} {c.says}", **info})
            continue
        if entry:
            seeds, limit = list(entry["seeds"]), entry["examples"]
            spec = c.spec(entry["target"], entry["margin"], P.FAMILY, smaller=P.registers_smaller(plan))
        else:
            seeds = [int(x) for x in s["seeds"]]
            key = _PAPER_LIMITS.get(c.suite)
            limit = int(s[key]) if key else None
            spec = c.spec(None, 0.0, "pilot")
        rows.append((spec, seeds, limit))
    if not rows:
        raise StudyError("the paper study has no claim to run")
    seeds_of, evals = _paper_seeds(rows)
    models = _paper_models(s, seeds_of)
    known = {m.key for m in models}
    missing = sorted(set(seeds_of) - known)
    if missing:
        raise StudyError(f"the paper study has no model {', '.join(missing)} (an empty preset setting leaves a "
                         f"model out, and its claims with it)")
    specs = []
    for (suite, key), ev in evals.items():
        sets, n_eps, steps, copies = _paper_suite_sets(suite, s)
        baseline = "symvit" if suite == "corruptions" else None
        specs.append(EvalSpec(suite=suite, models=[key], sets=sets, limit=ev["limit"], n_eps=n_eps, steps=steps,
                              copies=copies, baseline_model=baseline, seeds=sorted(ev["seeds"])))
    # the normalising model's corruption evaluation first, so that the others can wait for it
    specs.sort(key=lambda e: (e.suite != "corruptions" or e.models != ["symvit"]))
    st = Study(name, D.TEXTS[name].description, models, specs, [], None, [spec for spec, _, _ in rows], s,
               not_run=not_run)
    if plan:
        st.plan = P.plan_summary(plan)
        if plan.get("cost_model"):
            from .design import CostModel

            st.cost_model = CostModel.from_dict(plan["cost_model"])
            st.seed_major = True
    else:
        st.notes.append("A pilot run: every claim on the pilot seeds with margin 0 and no target (family 'pilot'); "
                        "its verdicts decide nothing. `rpc-attention plan` turns its figures into a plan.")
    return st


def _certify_study(name: str, s: Dict[str, Any]) -> Study:
    """SymViT, RPC-6 and robust PAP, each trained plainly and masking-aware (``train.token_drop`` at the study's
    ``token_drop``), the certify suite on all of them and the claims on certified top-1."""
    seeds = [int(x) for x in s["seeds"]]
    if not seeds:
        raise StudyError("--set seeds=...: at least one seed")
    if not s["preset_symvit"]:
        raise StudyError("--set preset_symvit=...: the certify study compares every model with SymViT")
    drop = float(s["token_drop"])
    if not 0.0 < drop < 1.0:
        raise StudyError(f"--set token_drop={s['token_drop']}: the masking-aware models need a fraction in (0, 1)")
    common, samples = _fmnist_common(s)
    overrides = common + list(s.get("train_overrides") or [])
    masked = tuple(replace(r, overrides=r.overrides + (f"train.token_drop={drop}",)) for r in D.CERTIFY_MASKED)
    rows = D.FMNIST_VISION + masked
    models = _models(rows, s, seeds, overrides, samples, int(s["depth"]))
    keys = [m.key for m in models]
    evals = _vision_evals(s, keys, list(s["suites"]), [r.key for r in rows])
    claims = [c for c in _claims(D.CERTIFY_CLAIMS, s["suites"]) if c.rpc in keys and c.baseline in keys]
    return Study(name, D.TEXTS[name].description, models, evals, [], None, claims, s)


@dataclass(frozen=True)
class StudyDef:
    """A study: its settings' defaults (a settings dataclass) and the function that builds it."""

    name: str
    defaults: Any
    build: Callable[[str, Dict[str, Any]], Study]

    def __call__(self, settings: Optional[Sequence[str]] = None) -> Study:
        return self.build(self.name, parse_settings(settings, self.defaults, self.name))


STUDIES: Dict[str, StudyDef] = {d.name: d for d in (
    StudyDef("smoke", D.SMOKE, _fmnist_study), StudyDef("quick", D.QUICK, _fmnist_study),
    StudyDef("decide", D.DECIDE, _fmnist_study), StudyDef("patch", D.PATCH, _patch_study),
    StudyDef("certify", D.CERTIFY, _certify_study),
    StudyDef("fmnist-full", D.FULL, _fmnist_full), StudyDef("imagenet", D.IMAGENET, _imagenet),
    StudyDef("wikitext103", D.WIKITEXT, _wikitext103),
    StudyDef("lm-gap", D.LM_GAP, _lm_gap), StudyDef("paper", PD.PAPER, _paper_study))}


def list_studies() -> List[tuple]:
    """``(name, one line, default settings)`` of every study."""
    return [(n, D.TEXTS[n].summary or D.TEXTS[n].description, settings_dict(d.defaults)) for n, d in STUDIES.items()]


def register_study_suites() -> None:
    """Register the suites that live above the evaluation floor and that studies run (``kpca``, from the
    kernel-PCA toolkit); the built-in suites register themselves on first lookup."""
    from ..kpca import register_suites

    register_suites()


def get_study(name: str, settings: Optional[Sequence[str]] = None) -> Study:
    if name not in STUDIES:
        raise StudyError(f"unknown study preset {name!r}; choose one of {', '.join(STUDIES)}")
    register_study_suites()
    return STUDIES[name](settings)


# ------------------------------------------------------------------------------------- stage list
def _train_stages(study: Study, device: Optional[str]) -> tuple:
    """The training stages and ``{run: name of the stage that trains it}`` (a model evaluated on another
    model's runs maps to that model's training stages)."""
    from . import stages as S

    stages: List[Stage] = []
    train_names: Dict[str, str] = {}
    for m in study.models:
        if m.base:  # evaluated on the base model's runs: no training of its own
            base = study.model(m.base)
            for seed, run in zip(m.seeds, m.runs()):
                train_names[run] = train_names[f"{base.key}-s{seed}"]
            continue
        for seed, run in zip(m.seeds, m.runs()):
            ov = list(m.overrides) + ([f"train.device={device}"] if device and device != "cpu" else [])
            name = f"train.{run}"
            stages.append(Stage(name, "train", S.train_stage, params={
                "run": run, "preset": m.preset, "overrides": ov, "seed": seed, "family": m.family, "label": m.label,
                "callbacks": list(m.callbacks)},
                estimate_s=(study.cost_model.train_s(m.key) if study.cost_model is not None
                            else E.train_estimate(m.family, m.train_samples, m.cost)),
                description=f"train {m.label} (seed {seed}) from preset {m.preset}"))
            train_names[run] = name
    return stages, train_names


def _seed_major(stages: List[Stage], study: Study) -> List[Stage]:
    """The stages ordered by seed (every model's training and evaluations of the first seed, then the next's),
    each seed's trainings first: a run stopped part-way leaves few trained models whose evaluations are still to
    come, and every finished seed is a complete set of records. Stable within a seed, so dependencies (the
    normalising model's corruption stage) stay ahead."""
    def seed_of(s: Stage) -> int:
        return int(s.params.get("seed", 0)) if isinstance(s.params.get("seed"), int) else 0

    return sorted(stages, key=lambda s: (seed_of(s), s.kind != "train"))


def build_stages(study: Study, device: Optional[str] = None) -> List[Stage]:
    from . import stages as S

    device = device or study.device
    stages, train_names = _train_stages(study, device)
    eval_names: Dict[tuple, str] = {}
    for ev in study.evals:
        for key in ev.models:
            m = study.model(key)
            for seed, run in ev.runs_of(m):
                sets = list(ev.sets)
                deps = [train_names[run]]
                if ev.baseline_model and ev.baseline_model != key:
                    b = study.model(ev.baseline_model)
                    brun = f"{b.key}-s{seed}" if seed in b.seeds else b.runs()[0]
                    sets.append(f"{ev.suite}.baseline={{out}}/runs/{brun}")
                    bname = eval_names.get((brun, ev.suite))
                    if bname:
                        deps.append(bname)
                if device and device != "cpu":
                    sets.append(f"device={device}")
                name = f"eval.{run}.{ev.suite}"
                params = {"run": run, "suite": ev.suite, "sets": sets, "limit": ev.limit, "model": key, "seed": seed}
                if m.base:  # the base model's run, with the model keywords set on top
                    params.update(source_run=f"{m.base}-s{seed}", model_kwargs=dict(m.model_kwargs))
                stages.append(Stage(name, "eval", S.eval_stage, deps=deps, params=params,
                    estimate_s=(study.cost_model.eval_s(ev.suite, key, ev.limit) if study.cost_model is not None
                                else E.eval_estimate(get_suite(ev.suite).cost, ev.limit or 10000, m.cost, ev.copies,
                                                     ev.n_eps, ev.steps)),
                    description=f"{ev.suite} on {m.label} (seed {seed})"))
                eval_names[(run, ev.suite)] = name
    for a in study.analyses:
        m = study.model(a["model"])
        for run in m.runs():
            name = f"analyze.{run}"
            stages.append(Stage(name, "analyze", S.analyze_stage, deps=[train_names[run]], params={
                "run": run, "sets": list(a.get("sets", [])), "out": f"analysis/{run}", "model": m.key},
                estimate_s=E.ANALYZE_S, description=f"KPCA analysis (J_proj, alignment) of {m.label}"))
    if study.compare:
        runs = [r for k in study.compare["models"] for r in study.model(k).runs()]
        stages.append(Stage("compare", "compare", S.compare_stage, deps=[train_names[r] for r in runs], params={
            "runs": runs, "metrics": list(study.compare.get("metrics") or []), "split": study.compare.get("split", "val"),
            "out": "analysis/compare"},
            estimate_s=E.COMPARE_S, description="compare the models' KPCA statistics"))
    if study.seed_major:
        stages = _seed_major(stages, study)
    stages.append(Stage("report", "report", S.report_stage, after=[s.name for s in stages],
                        params={"study": study.name}, estimate_s=E.REPORT_S,
                        description="results.json, report.md, report.html and figures"))
    return stages
