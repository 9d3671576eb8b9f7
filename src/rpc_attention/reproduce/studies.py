"""Study presets: which models to train (trainer presets + overrides, seeds), which suites to run on
them, which analyses, and which claims of the paper each comparison tests.

``get_study(name, settings)`` returns a :class:`Study`; :func:`build_stages` turns it into the ordered
stage list run by :class:`~rpc_attention.reproduce.pipeline.Pipeline`. Study settings are changed with
``rpc-attention reproduce --set KEY=VALUE`` (``seeds=0,1,2``, ``eval_limit=500``, ``data.imagenet=PATH``,
...); every study lists its settings in ``--list``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..overrides import parse_assignments, parse_number, parse_value, unknown_key
from . import estimates as E
from .pipeline import Stage

__all__ = ["ModelSpec", "EvalSpec", "ClaimSpec", "Study", "STUDIES", "get_study", "build_stages",
           "parse_settings", "StudyError", "list_studies"]


class StudyError(ValueError):
    """A user error in choosing or configuring a study (unknown setting, missing data path)."""


@dataclass
class ModelSpec:
    key: str                    # short id; run folders are runs/<key>-s<seed>
    label: str                  # as printed in tables ("RPC-SymViT 6iter/layer1")
    preset: str                 # trainer preset (src/rpc_attention/presets/<preset>.yaml)
    overrides: List[str] = field(default_factory=list)   # trainer --set overrides
    family: str = "vision"      # vision | fan | lm | seg | scaled
    role: str = "baseline"      # baseline | rpc | variant
    seeds: List[int] = field(default_factory=lambda: [0])
    train_samples: int = 0      # samples seen in training (for the time estimate)
    cost: float = 1.0           # relative cost per sample (PAP iterations)
    callbacks: List[str] = field(default_factory=list)   # trainer epoch-end callbacks (e.g. jproj)

    def runs(self) -> List[str]:
        return [f"{self.key}-s{s}" for s in self.seeds]


@dataclass
class EvalSpec:
    suite: str
    models: List[str]
    sets: List[str] = field(default_factory=list)   # eval --set options
    limit: Optional[int] = None
    n_eps: Optional[int] = None                     # for the estimate of sweeps
    steps: Optional[int] = None                     # attack steps per eps (estimate of PGD sweeps)
    copies: int = 1                                 # corrupted copies per example (estimate)
    baseline_model: Optional[str] = None            # corruptions: normalise by this model's run (same seed)


@dataclass
class ClaimSpec:
    id: str                 # key into rpc_attention.report.paper.PAPER_ROWS, or our own id
    title: str              # one line, what the paper claims
    table: str              # the task table it belongs to: vision | fan | lm | seg | scaled
    suite: str
    metric: str             # key of the suite's "metrics"
    baseline: str           # model key
    rpc: str                # model key
    higher: bool = True
    margin: float = 1.0
    relative: bool = False  # margin is a fraction of the baseline value
    paper_id: Optional[str] = None  # the paper's row this claim is compared with (default: id)


@dataclass
class Study:
    name: str
    description: str
    models: List[ModelSpec]
    evals: List[EvalSpec] = field(default_factory=list)
    analyses: List[Dict[str, Any]] = field(default_factory=list)   # {"model": key, "sets": ["limit=8", ...]}
    compare: Optional[Dict[str, Any]] = None                        # {"models": [keys], "metrics": [...], "split": "val"}
    claims: List[ClaimSpec] = field(default_factory=list)
    settings: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    device: str = "cpu"

    def model(self, key: str) -> ModelSpec:
        for m in self.models:
            if m.key == key:
                return m
        raise KeyError(key)


# --------------------------------------------------------------------------------------- settings
def _setting_value(key: str, value: Any, default: Any) -> Any:
    """A parsed ``--set`` value checked against the type of the setting's default."""
    if value is None:
        return None
    if isinstance(default, list):
        if isinstance(value, str):  # "0,1,2" as well as "[0, 1, 2]"
            return [parse_value(x.strip()) for x in value.split(",") if x.strip()]
        return list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise StudyError(f"--set {key}={value}: expected true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise StudyError(f"--set {key}={value}: expected an integer")
        return value
    if isinstance(default, float):
        try:
            return parse_number(value, f"--set {key}")
        except ValueError as exc:
            raise StudyError(str(exc)) from None
    return value if isinstance(value, str) else str(value)


def parse_settings(items: Optional[Sequence[str]], defaults: Dict[str, Any], study: str) -> Dict[str, Any]:
    """``["seeds=0,1", "eval_limit=300"]`` on top of the study's defaults (the package's one ``KEY=VALUE``
    grammar, :mod:`rpc_attention.overrides`); unknown keys and values of the wrong type are StudyErrors."""
    out = copy.deepcopy(defaults)
    try:
        pairs = parse_assignments(items, "--set")
    except ValueError as exc:
        raise StudyError(str(exc)) from None
    for key, value in pairs:
        if key not in out:
            raise StudyError(str(unknown_key(key, out, f"setting of study {study!r}")))
        out[key] = _setting_value(key, value, out[key])
    return out


def _require_paths(settings: Dict[str, Any], keys: Sequence[str], study: str) -> None:
    for k in keys:
        v = settings.get(k)
        if not v:
            raise StudyError(f"study {study!r} needs {k}: pass --set {k}=PATH ({_PATH_HELP.get(k, 'a data path')})")
        if not Path(str(v)).expanduser().exists():
            raise StudyError(f"--set {k}={v}: no such file or directory ({_PATH_HELP.get(k, '')})")


_PATH_HELP = {
    "data.imagenet": "ImageNet-1K folder with train/ and val/ class sub-folders",
    "data.imagenet_c": "ImageNet-C folder ROOT/<corruption>/<severity>/<wnid>/*.JPEG",
    "data.imagenet_o": "ImageNet-O folder (200 class sub-folders)",
    "data.imagenet_a": "ImageNet-A folder",
    "data.imagenet_r": "ImageNet-R folder",
    "data.wikitext103": "WikiText-103 folder with wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens",
    "data.imagenet_o_classes": "file listing the 200 ImageNet-O classes (indices 0-999 or wnids), one per line",
    "data.imagenet_a_classes": "file listing the 200 ImageNet-A classes (indices 0-999 or wnids), one per line",
    "data.imagenet_r_classes": "file listing the 200 ImageNet-R classes (indices 0-999 or wnids), one per line",
}


# ---------------------------------------------------------------------------------- vision claims
VISION_CLAIMS = [
    ("clean", "RPC (6 iters, layer 1) raises clean top-1", "clean", "top1", "rpc6", True, 1.0),
    ("fgsm", "RPC (6 iters, layer 1) is more accurate under FGSM (mean over eps)", "fgsm", "mean_top1", "rpc6", True, 1.0),
    ("pgd", "RPC (2 iters, all layers) is more accurate under PGD (mean over eps)", "pgd", "mean_top1", "rpc2all", True, 1.0),
    ("mce", "RPC (6 iters, layer 1) lowers the corruption error (mCE relative to SymViT)", "corruptions", "mCE", "rpc6", False, 1.0),
    ("ood_aupr", "RPC (layer 1) detects out-of-distribution inputs better (AUPR)", "ood", "aupr", "rpc6", True, 1.0),
]


# Our own claim, the premise of PAP: keys with sparse corruption are where robust PCA helps.
SPARSE_CLAIM = ("sparse", "RPC (6 iters, layer 1) is more accurate under sparse corruption (salt-and-pepper, "
                "occlusion, corrupted keys; mean)", "sparse", "mean_top1", "rpc6", True, 1.0)
# The PCP-active RPC (a threshold at which S is non-zero) against SymViT on the same claims as the
# official RPC 6iter/layer1; each row is compared with the paper's row of the same claim.
PCP_LABEL = "PCP-active RPC (6 iters, layer 1)"


def _pcp_claims(claims: Sequence[tuple]) -> List[tuple]:
    out = []
    for cid, title, suite, metric, rpc, higher, margin in claims:
        if rpc == "rpc6":
            out.append((f"{cid}_pcp", title.replace("RPC (6 iters, layer 1)", PCP_LABEL).replace("RPC (layer 1)", PCP_LABEL),
                        suite, metric, "rpc_pcp", higher, margin))
    return out


def _vision_claims(have_suites: Sequence[str], extra: Sequence[tuple] = (), pcp: bool = False) -> List[ClaimSpec]:
    base = list(VISION_CLAIMS) + [SPARSE_CLAIM] + list(extra)
    out = []
    for cid, title, suite, metric, rpc, higher, margin in base + (_pcp_claims(base) if pcp else []):
        if suite in have_suites:
            paper_id = cid[: -len("_pcp")] if cid.endswith("_pcp") else None
            out.append(ClaimSpec(cid, title, "vision", suite, metric, "symvit", rpc, higher, margin, paper_id=paper_id))
    return out


def _lm_claims() -> List[ClaimSpec]:
    return [
        ClaimSpec("lm_ppl", "RPC-Symlm has lower test perplexity", "lm", "ppl", "test_ppl_sliding", "symlm", "rpc_symlm",
                  higher=False, margin=0.02, relative=True),
        ClaimSpec("lm_wordswap", "RPC-Symlm has lower perplexity on word-swap-attacked text", "lm", "wordswap",
                  "test_attacked_ppl_sliding", "symlm", "rpc_symlm", higher=False, margin=0.02, relative=True),
    ]


# --------------------------------------------------------------------------------------------- FAN
FAN_CLAIMS = [
    ("fan_clean", "RPC-FAN (4 iters, layer 1) raises clean top-1 over the symmetric FAN", "clean", "top1", True),
    ("fan_mce", "RPC-FAN lowers the corruption error (mCE relative to SymFAN)", "corruptions", "mCE", False),
    ("fan_imagenet_a", "RPC-FAN is more accurate on ImageNet-A", "imagenet-a", "top1", True),
    ("fan_imagenet_r", "RPC-FAN is more accurate on ImageNet-R", "imagenet-r", "top1", True),
]


def _fan_models(s: Dict[str, Any], seeds: List[int], common: List[str], samples: int, depth: int) -> List[ModelSpec]:
    """FAN (asymmetric, for reference), SymFAN (the RPC paper's FAN baseline) and RPC-FAN 4iter/layer1."""
    ov = list(common) + list(s.get("fan_overrides") or [])
    return [
        ModelSpec("fan", "FAN (asymmetric)", s["preset_fan"], ov, "fan", "variant", seeds, samples, 1.5),
        ModelSpec("symfan", "SymFAN", s["preset_symfan"], ov, "fan", "baseline", seeds, samples, 1.5),
        ModelSpec("rpc_fan", "RPC-FAN 4iter/layer1", s["preset_rpc_fan"], ov, "fan", "rpc", seeds, samples,
                  1.5 * E.pap_factor(4, 1, depth)),
    ]


def _add_fan(st: "Study", models: List[ModelSpec], evals: List[EvalSpec]) -> None:
    """Append the FAN comparison to a study: its models, its evaluations (corruption errors normalised
    by SymFAN) and the paper's FAN claims for the suites it runs."""
    st.models.extend(models)
    for ev in evals:
        if ev.suite == "corruptions":
            ev.baseline_model = "symfan"
    st.evals.extend(evals)
    suites = {ev.suite for ev in evals}
    st.claims += [ClaimSpec(cid, title, "fan", suite, metric, "symfan", "rpc_fan", higher, 1.0)
                  for cid, title, suite, metric, higher in FAN_CLAIMS if suite in suites]


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
    return common, epochs * (subset or (60000 - int(s.get("val_size") or 0)))


def _fmnist_models(s: Dict[str, Any], seeds: List[int]) -> List[ModelSpec]:
    common, samples = _fmnist_common(s)
    common += list(s.get("train_overrides") or [])
    cb = ["jproj"] if s.get("jproj_history") else []
    return [
        ModelSpec("symvit", "SymViT", s["preset_symvit"], common, "vision", "baseline", seeds, samples, 1.0,
                  callbacks=cb),
        ModelSpec("rpc6", "RPC-SymViT 6iter/layer1", s["preset_rpc6"], common, "vision", "rpc", seeds, samples,
                  E.pap_factor(6, 1, int(s["depth"]))),
        ModelSpec("rpc2all", "RPC-SymViT 2iter/all-layer", s["preset_rpc2all"], common, "vision", "rpc", seeds,
                  samples, E.pap_factor(2, int(s["depth"]), int(s["depth"]))),
        ModelSpec("rpc_pcp", "RPC-SymViT 6iter/layer1, PCP-active", s["preset_rpc_pcp"], common, "vision", "rpc", seeds,
                  samples, E.pap_factor(6, 1, int(s["depth"]))),
    ]


def _lm_models(s: Dict[str, Any], seeds: List[int]) -> List[ModelSpec]:
    """Symlm and RPC-Symlm on the embedded corpus, trained with ``seeds``."""
    steps, bs = int(s["lm_steps"]), int(s["lm_batch_size"])
    common = [f"train.steps={steps}", f"train.batch_size={bs}"] + list(s.get("lm_overrides") or [])
    samples = steps * bs
    return [
        ModelSpec("symlm", "Symlm", s["preset_symlm"], common, "lm", "baseline", seeds, samples, 1.0),
        ModelSpec("rpc_symlm", "RPC-Symlm", s["preset_rpc_symlm"], common, "lm", "rpc", seeds, samples,
                  E.pap_factor(4, 1, 2)),
    ]


def _vision_evals(s: Dict[str, Any], keys: List[str], suites: Sequence[str]) -> List[EvalSpec]:
    lim = s.get("eval_limit")
    attack_lim = s.get("attack_limit") or lim
    eps = s["eps"]
    n_eps = len(str(eps).split(",")) if ":" not in str(eps) else 6
    out = []
    for suite in suites:
        if suite == "clean":
            out.append(EvalSpec("clean", keys, [], lim))
        elif suite in ("fgsm", "pgd"):
            sets = [f"{suite}.eps={eps}"]
            steps = int(s["pgd_steps"]) if suite == "pgd" and s.get("pgd_steps") else None
            if steps:
                sets.append(f"pgd.steps={steps}")
            out.append(EvalSpec(suite, keys, sets, attack_lim, n_eps=n_eps, steps=steps))
        elif suite == "corruptions":
            names = s.get("corruptions") or []
            sets = [f"corruptions.names={','.join(names)}"] if names else []
            copies = 5 * (len(names) or 15)
            out.append(EvalSpec("corruptions", keys, sets, s.get("corruption_limit") or lim, copies=copies,
                                baseline_model="symvit"))
        elif suite == "ood":
            out.append(EvalSpec("ood", keys, list(s.get("ood_sets") or []), s.get("ood_limit") or lim, copies=2))
        elif suite == "sparse":
            mags = s.get("sparse_key_magnitudes") or []
            sets = [f"sparse.key_magnitude={','.join(str(m) for m in mags)}"] if mags else []
            out.append(EvalSpec("sparse", keys, sets, s.get("sparse_limit") or lim))
        else:
            out.append(EvalSpec(suite, keys, [], s.get("strong_attack_limit") or lim))
    return out


QUICK_DEFAULTS: Dict[str, Any] = {
    # three seeds per vision model (paired seed intervals); an LM training costs 2-3 vision trainings
    "seeds": [0, 1, 2],
    "lm_seeds": [0],             # []: the same seeds as the vision models
    # trainer presets (the vision engineer's Fashion-MNIST presets: patch 7, width 96, 6 blocks, 3 heads)
    "preset_symvit": "fmnist-symvit",
    "preset_rpc6": "fmnist-rpc-symvit",
    "preset_rpc2all": "fmnist-rpc-symvit-all",
    # RPC-SymViT whose sparse step fires: classic PCP threshold lambd / mu on the head-width mu
    "preset_rpc_pcp": "fmnist-rpc-symvit-pcp",
    # RPC-SymViT with robust PAP (MAD threshold, L in key space, hard shrinkage, no dual; 2 softmax
    # evaluations) and the key-corruption dose-response of the sparse suite it is measured on
    "preset_rpc_robust": "fmnist-rpc-symvit-robust",
    "sparse_key_magnitudes": [5, 20, 100],
    "depth": 6,
    "epochs": 1,                 # presets: 4 epochs of 55,000 images
    "batch_size": 64,            # 375 steps; at 128 the same images give 3 points less clean accuracy
    "train_subset": 24000,       # 0: all 58,000 training images left after the validation split
    "val_size": 2000,            # presets: 5000
    "test_subset": 0,
    # 6 heads of 16 (presets: 3 of 32): the KPCA analysis needs head dim Dv <= tokens N = 17 (patch 7
    # on 28x28), and the paper's own measurements used a 6-head DeiT-tiny
    "train_overrides": ["model.kwargs.num_heads=6"],
    "jproj_history": True,       # log J_proj of the SymViT at each epoch end (kpca's jproj callback)
    "eval_limit": 2000,
    "attack_limit": 200,
    "eps": "2/255,4/255,6/255",  # FGSM and PGD; fmnist-full: 1:6/255
    "pgd_steps": 10,
    "corruptions": ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur",
                    "brightness", "contrast", "pixelate", "jpeg_compression"],
    "corruption_limit": 100,
    "ood_limit": 1000,
    "ood_sets": [],
    "strong_attack_limit": 200,
    "sparse_limit": 500,             # sparse corruption: 7 corrupted settings + clean per image
    "analyze_sets": ["limit=8"],     # KPCA analysis options (rpc_attention.kpca.options.AnalysisOptions)
    # language model (the LM engineer's presets on the embedded Wikipedia corpus; 1200 steps there)
    "preset_symlm": "wiki-symlm",
    "preset_rpc_symlm": "wiki-rpc-symlm",
    "lm_steps": 300,
    "lm_batch_size": 16,
    "lm_overrides": [],
    "lm_eval_sets": ["protocols=sliding", "splits=test"],
    "lm_eval_limit": 0,
    "lm": True,
}


def quick(settings: Optional[Sequence[str]] = None) -> Study:
    s = parse_settings(settings, QUICK_DEFAULTS, "quick")
    return _fmnist_study("quick", s, "Fashion-MNIST SymViT vs RPC-SymViT (6iter/layer1, 2iter/all-layer, and "
                         "6iter/layer1 with a PCP threshold at which the sparse step fires), three seeds each, one epoch "
                         "of 24,000 images; clean/FGSM/PGD/corruptions/OOD/sparse corruption on test subsets with "
                         "95 % intervals; S activity of every PAP block; KPCA analysis of the SymViT; small Symlm "
                         "vs RPC-Symlm (one seed) on the embedded Wikipedia corpus. About 18 minutes on 2 idle CPU "
                         "cores.",
                         suites=("clean", "fgsm", "pgd", "corruptions", "ood", "sparse"))


# The robust-PAP model and the key dose-response belong to the quick study only (empty: left out).
_QUICK_ONLY = {"preset_rpc_robust": "", "sparse_key_magnitudes": []}

SMOKE_DEFAULTS: Dict[str, Any] = dict(QUICK_DEFAULTS, **_QUICK_ONLY, **{
    "seeds": [0], "epochs": 1, "batch_size": 64, "train_subset": 256, "val_size": 64, "test_subset": 256,
    "train_overrides": ["model.kwargs.embed_dim=32", "model.kwargs.depth=2", "model.kwargs.num_heads=2",
                        "train.log_every=2", "train.threads=0"],
    "depth": 2, "eval_limit": 128, "attack_limit": 32, "eps": "2/255,6/255", "pgd_steps": 3,
    "corruptions": ["gaussian_noise", "contrast"], "corruption_limit": 32, "ood_limit": 128,
    "strong_attack_limit": 16, "sparse_limit": 64,
    "lm_steps": 4, "lm_batch_size": 4,
    "lm_overrides": ["model.kwargs.d_model=32", "model.kwargs.n_layer=2", "model.kwargs.n_head=2",
                     "model.kwargs.d_inner=64", "model.kwargs.context=32", "train.threads=0",
                     "train.eval_every=0", "eval.final_split=null"],
    "lm_eval_limit": 400,
    "analyze_sets": ["limit=2", "protocol=exact"],
})


def smoke(settings: Optional[Sequence[str]] = None) -> Study:
    s = parse_settings(settings, SMOKE_DEFAULTS, "smoke")
    return _fmnist_study("smoke", s, "The quick study's pipeline on a few hundred examples and a few steps "
                         "(end-to-end check, about 90 s; its numbers mean nothing).",
                         suites=("clean", "fgsm", "pgd", "corruptions", "ood", "sparse"))


FULL_DEFAULTS: Dict[str, Any] = dict(QUICK_DEFAULTS, **_QUICK_ONLY, **{
    "seeds": [0, 1, 2], "lm_seeds": [], "epochs": 20, "batch_size": 128, "eps": "1:6/255", "pgd_steps": 20,
    "val_size": 5000, "train_subset": 0, "eval_limit": 0, "attack_limit": 1000,
    "corruptions": [], "corruption_limit": 1000, "ood_limit": 0, "strong_attack_limit": 500, "sparse_limit": 0,
    "lm_steps": 1200, "lm_batch_size": 16, "lm_eval_sets": [],
    "preset_scaled": "fmnist-scaled-s", "preset_scaled_alpha": "fmnist-scaled-alpha",
    "preset_asym": "fmnist-vit", "preset_seg": "seg-fmnist-symvit", "preset_seg_rpc": "seg-fmnist-rpc-symvit",
    "seg_epochs": 8, "seg_overrides": [], "seg_limit": 500, "seg_corruption_limit": 100,
    "preset_fan": "fmnist-fan", "preset_symfan": "fmnist-symfan", "preset_rpc_fan": "fmnist-rpc-fan",
    "fan_depth": 3, "fan_overrides": [],
})


def fmnist_full(settings: Optional[Sequence[str]] = None) -> Study:
    s = parse_settings(settings, FULL_DEFAULTS, "fmnist-full")
    st = _fmnist_study("fmnist-full", s, "Fashion-MNIST, several seeds per model (mean +- std): every attack "
                       "including AutoAttack and Square, all 15 corruptions, OOD, Scaled Attention S/alpha vs "
                       "the asymmetric baseline, segmentation on the composed Fashion-MNIST scenes, LM, and RPC-FAN vs "
                       "SymFAN (FAN for reference) on clean/FGSM/PGD/corruptions. "
                       "Hours on CPU; minutes on one GPU.",
                       suites=("clean", "fgsm", "pgd", "corruptions", "ood", "sparse", "noise", "sld", "spsa",
                               "cw", "autoattack", "square"))
    seeds = list(s["seeds"])
    common, samples = st.models[0].overrides, st.models[0].train_samples
    scaled = [
        ModelSpec("vit", "ViT (asymmetric softmax)", s["preset_asym"], common, "scaled", "baseline", seeds, samples),
        ModelSpec("scaled_s", "Scaled Attention S", s["preset_scaled"], common, "scaled", "rpc", seeds, samples, 1.1),
        ModelSpec("scaled_alpha", "Scaled Attention alpha", s["preset_scaled_alpha"], common, "scaled", "rpc", seeds,
                  samples, 1.3),
    ]
    st.models.extend(scaled)
    keys = [m.key for m in scaled]
    st.evals.append(EvalSpec("clean", keys, [], None))
    st.claims += [
        ClaimSpec("scaled_s", "Scaled Attention S beats the asymmetric softmax ViT (clean top-1)", "scaled",
                  "clean", "top1", "vit", "scaled_s"),
        ClaimSpec("scaled_alpha", "Scaled Attention alpha beats the asymmetric softmax ViT (clean top-1)", "scaled",
                  "clean", "top1", "vit", "scaled_alpha"),
    ]
    seg_epochs = int(s["seg_epochs"])
    seg_ov = [f"train.epochs={seg_epochs}"] + list(s.get("seg_overrides") or [])
    seg = [
        ModelSpec("seg_symvit", "Segmenter SymViT", s["preset_seg"], seg_ov, "seg", "baseline", seeds,
                  seg_epochs * 3000),
        ModelSpec("seg_rpc", "Segmenter RPC-SymViT (encoder and decoder PAP)", s["preset_seg_rpc"], seg_ov, "seg",
                  "rpc", seeds, seg_epochs * 3000, 1.3),
    ]
    st.models.extend(seg)
    sk = [m.key for m in seg]
    st.evals += [EvalSpec("seg", sk, ["seg.save_examples=4"], s.get("seg_limit") or None),
                 EvalSpec("seg-corruptions", sk, [], s.get("seg_corruption_limit") or None, copies=75)]
    st.claims += [
        ClaimSpec("seg_miou", "RPC raises segmentation mIoU", "seg", "seg", "miou", "seg_symvit", "seg_rpc"),
        ClaimSpec("seg_corrupt_miou", "RPC raises mIoU on corrupted scenes", "seg", "seg-corruptions",
                  "corrupted_miou", "seg_symvit", "seg_rpc"),
    ]
    fan_common, fan_samples = _fmnist_common(s)
    fan = _fan_models(s, seeds, fan_common, fan_samples, int(s["fan_depth"]))
    _add_fan(st, fan, _vision_evals(s, [m.key for m in fan], ("clean", "fgsm", "pgd", "corruptions")))
    return st


# Robust PAP (docs/method.md#robust-variants) beside the official RPC: the claim it is built for.
ROBUST_CLAIM = ("sparse_keys", "RPC with robust PAP removes sparse key corruption (5 % of block-1 keys at "
                "+-5/20/100 std; mean top-1)", "sparse", "mean_top1_keys", "rpc_robust", True, 1.0)


def _robust_models(s: Dict[str, Any], seeds: List[int]) -> List[ModelSpec]:
    """RPC-SymViT with robust PAP in block 0 (``preset_rpc_robust``; none when it is empty)."""
    if not s.get("preset_rpc_robust"):
        return []
    common, samples = _fmnist_common(s)
    return [ModelSpec("rpc_robust", "RPC-SymViT robust PAP 2iter/layer1", s["preset_rpc_robust"],
                      common + list(s.get("train_overrides") or []), "vision", "rpc", seeds, samples,
                      E.pap_factor(2, 1, int(s["depth"])))]


def _fmnist_study(name: str, s: Dict[str, Any], description: str, suites: Sequence[str]) -> Study:
    seeds = [int(x) for x in s["seeds"]]
    if not seeds:
        raise StudyError("--set seeds=...: at least one seed")
    models = _fmnist_models(s, seeds) + _robust_models(s, seeds)
    keys = [m.key for m in models]
    evals = _vision_evals(s, keys, suites)
    analyses = [{"model": "symvit", "sets": list(s.get("analyze_sets") or [])}]
    claims = _vision_claims(suites, extra=[
        ("autoattack", "RPC (6 iters, layer 1) is more accurate under AutoAttack", "autoattack", "top1@1/255", "rpc6", True, 1.0),
        ("square", "RPC (6 iters, layer 1) is more accurate under the Square attack", "square", "top1@1/255", "rpc6", True, 1.0),
    ] if "autoattack" in suites else [], pcp=True)
    if _robust_models(s, seeds) and "sparse" in suites:
        claims += _vision_claims(suites, extra=[ROBUST_CLAIM])[-1:]
    st = Study(name, description, models, evals, analyses, None, claims, s)
    if s.get("lm"):
        lm_seeds = [int(x) for x in (s.get("lm_seeds") or seeds)]
        lm = _lm_models(s, lm_seeds)
        if len(lm_seeds) < len(seeds):
            st.notes.append(f"The language-model pair is trained with {len(lm_seeds)} seed(s) "
                            f"({', '.join(map(str, lm_seeds))}) and the vision models with {len(seeds)}: an LM "
                            "training costs as much as several vision ones here. Its rows have a seed interval only with "
                            "two or more seeds (the LM suites keep no per-token record to bootstrap), so with one "
                            "seed its verdicts rest on the margin rule alone.")
        st.models.extend(lm)
        lk = [m.key for m in lm]
        lim = int(s.get("lm_eval_limit") or 0) or None
        sets = list(s.get("lm_eval_sets") or [])
        st.evals += [EvalSpec("ppl", lk, [f"ppl.{x}" for x in sets], lim),
                     EvalSpec("wordswap", lk, [f"wordswap.{x}" for x in sets] + ["wordswap.clean=false"], lim)]
        st.claims += _lm_claims()
    return st


# ------------------------------------------------------------------------------- cluster studies
IMAGENET_DEFAULTS: Dict[str, Any] = {
    "seeds": [0], "data.imagenet": None, "data.imagenet_c": None,
    "data.imagenet_o": None, "data.imagenet_o_classes": None,
    "data.imagenet_a": None, "data.imagenet_a_classes": None,
    "data.imagenet_r": None, "data.imagenet_r_classes": None, "device": "cuda",
    "preset_symvit": "imagenet-symvit-tiny", "preset_rpc6": "imagenet-rpc-symvit-tiny-6iter-layer1",
    "preset_rpc2all": "imagenet-rpc-symvit-tiny-2iter-all", "train_overrides": [], "eval_limit": 0,
    "attack_limit": 0, "strong_attack_limit": 1000,
    "preset_fan": "imagenet-fan-tiny", "preset_symfan": "imagenet-symfan-tiny", "preset_rpc_fan": "imagenet-rpc-fan-tiny",
    "fan_overrides": [],
}


def imagenet(settings: Optional[Sequence[str]] = None) -> Study:
    s = parse_settings(settings, IMAGENET_DEFAULTS, "imagenet")
    _require_paths(s, ["data.imagenet"], "imagenet")
    for k in ("data.imagenet_c", "data.imagenet_o", "data.imagenet_a", "data.imagenet_r"):
        if s.get(k):
            need = [k] + ([f"{k}_classes"] if k != "data.imagenet_c" else [])
            _require_paths(s, need, "imagenet")
    seeds = [int(x) for x in s["seeds"]]
    root = str(Path(s["data.imagenet"]).expanduser())
    common = [f"data.root={root}"] + list(s["train_overrides"])
    samples = 300 * 1_281_167
    models = [
        ModelSpec("symvit", "SymViT-tiny", s["preset_symvit"], common, "vision", "baseline", seeds, samples),
        ModelSpec("rpc6", "RPC-SymViT-tiny 6iter/layer1", s["preset_rpc6"], common, "vision", "rpc", seeds, samples,
                  E.pap_factor(6, 1, 12)),
        ModelSpec("rpc2all", "RPC-SymViT-tiny 2iter/all-layer", s["preset_rpc2all"], common, "vision", "rpc", seeds,
                  samples, E.pap_factor(2, 12, 12)),
    ]
    keys = [m.key for m in models]
    lim = s.get("eval_limit") or None
    alim = s.get("attack_limit") or None
    evals = [EvalSpec("clean", keys, [], lim or 50000),
             EvalSpec("fgsm", keys, ["fgsm.eps=1:6/255"], alim or 50000, n_eps=6),
             EvalSpec("pgd", keys, ["pgd.eps=1:6/255"], alim or 50000, n_eps=6),
             EvalSpec("autoattack", keys, [], s.get("strong_attack_limit") or None),
             EvalSpec("square", keys, [], s.get("strong_attack_limit") or None)]
    suites = ["clean", "fgsm", "pgd", "autoattack", "square"]
    if s.get("data.imagenet_c"):
        # mCE normalised by the SymViT's own errors (as on Fashion-MNIST), next to the raw mean error
        evals.append(EvalSpec("corruptions", keys, [f"corruptions.root={s['data.imagenet_c']}"], lim or 50000,
                              copies=75, baseline_model="symvit"))
        suites.append("corruptions")
    if s.get("data.imagenet_o"):
        evals.append(EvalSpec("ood", keys, [f"ood.imagenet_o={s['data.imagenet_o']}",
                                            f"ood.imagenet_val={Path(root) / 'val'}",
                                            f"ood.classes={s['data.imagenet_o_classes']}"], lim, copies=2))
        suites.append("ood")
    for tag in ("a", "r"):
        if s.get(f"data.imagenet_{tag}"):
            evals.append(EvalSpec(f"imagenet-{tag}", keys, [f"imagenet-{tag}.root={s[f'data.imagenet_{tag}']}",
                                                            f"imagenet-{tag}.classes={s[f'data.imagenet_{tag}_classes']}"],
                                  lim, copies=1))
    claims = _vision_claims(suites, extra=[
        ("autoattack", "RPC (6 iters, layer 1) is more accurate under AutoAttack", "autoattack", "top1@1/255", "rpc6", True, 1.0),
        ("square", "RPC (6 iters, layer 1) is more accurate under the Square attack", "square", "top1@1/255", "rpc6", True, 1.0),
    ])
    st = Study("imagenet", "The paper's ImageNet-1K configuration (docs/method.md#model-families, #training-recipes): SymViT-tiny vs RPC-SymViT-tiny, "
               "300 epochs of the DeiT recipe, and FAN-tiny / SymFAN-tiny vs RPC-FAN-tiny 4iter/layer1 with the "
               "FAN authors' recipe. For GPU clusters: run the train stages one by one under torchrun "
               "(docs/reproduce.md).", models, evals,
               [{"model": "symvit", "sets": []}], None, claims, s, device=str(s["device"]))
    fan_common = [f"data.root={root}"] + list(s["fan_overrides"])
    fan = _fan_models(s, seeds, fan_common, samples, 12)
    fan_keys = [m.key for m in fan]
    fan_evals = [copy.deepcopy(ev) for ev in evals if ev.suite not in ("autoattack", "square")]
    for ev in fan_evals:
        ev.models = fan_keys
    _add_fan(st, fan, fan_evals)
    return st


WIKITEXT_DEFAULTS: Dict[str, Any] = {
    "seeds": [0], "data.wikitext103": None, "device": "cuda",
    "preset_symlm": "wt103-symlm-small", "preset_rpc_symlm": "wt103-rpc-symlm-small", "lm_overrides": [],
}


def wikitext103(settings: Optional[Sequence[str]] = None) -> Study:
    s = parse_settings(settings, WIKITEXT_DEFAULTS, "wikitext103")
    _require_paths(s, ["data.wikitext103"], "wikitext103")
    seeds = [int(x) for x in s["seeds"]]
    root = str(Path(s["data.wikitext103"]).expanduser())
    common = [f"data.root={root}"] + list(s["lm_overrides"])
    models = [ModelSpec("symlm", "Symlm (small)", s["preset_symlm"], common, "lm", "baseline", seeds, 500_000 * 96 * 256),
              ModelSpec("rpc_symlm", "RPC-Symlm (small, 4 iters layers 1-4)", s["preset_rpc_symlm"], common, "lm",
                        "rpc", seeds, 500_000 * 96 * 256, E.pap_factor(4, 4, 16))]
    keys = [m.key for m in models]
    evals = [EvalSpec("ppl", keys, [], None), EvalSpec("wordswap", keys, [], None)]
    return Study("wikitext103", "The paper's WikiText-103 language-modelling configuration (docs/method.md#model-families, #training-recipes): Symlm vs "
                 "RPC-Symlm, 500k steps. For GPU clusters (docs/reproduce.md).", models, evals, [], None,
                 _lm_claims(), s, device=str(s["device"]))


STUDIES: Dict[str, Callable[..., Study]] = {
    "smoke": smoke, "quick": quick, "fmnist-full": fmnist_full, "imagenet": imagenet, "wikitext103": wikitext103,
}
_DEFAULTS = {"smoke": SMOKE_DEFAULTS, "quick": QUICK_DEFAULTS, "fmnist-full": FULL_DEFAULTS,
             "imagenet": IMAGENET_DEFAULTS, "wikitext103": WIKITEXT_DEFAULTS}


def list_studies() -> List[tuple]:
    return [(n, STUDIES[n]().description if n not in ("imagenet", "wikitext103") else
             {"imagenet": "The paper's ImageNet-1K configuration (needs --set data.imagenet=PATH; GPU cluster).",
              "wikitext103": "The paper's WikiText-103 configuration (needs --set data.wikitext103=PATH; GPU cluster)."}[n],
             _DEFAULTS[n]) for n in STUDIES]


def get_study(name: str, settings: Optional[Sequence[str]] = None) -> Study:
    if name not in STUDIES:
        raise StudyError(f"unknown study preset {name!r}; choose one of {', '.join(STUDIES)}")
    return STUDIES[name](settings)


# ------------------------------------------------------------------------------------- stage list
def build_stages(study: Study, device: Optional[str] = None) -> List[Stage]:
    from . import stages as S

    device = device or study.device
    stages: List[Stage] = []
    train_names: Dict[str, str] = {}
    for m in study.models:
        for seed, run in zip(m.seeds, m.runs()):
            ov = list(m.overrides) + ([f"train.device={device}"] if device and device != "cpu" else [])
            name = f"train.{run}"
            stages.append(Stage(name, "train", S.train_stage, params={
                "run": run, "preset": m.preset, "overrides": ov, "seed": seed, "family": m.family, "label": m.label,
                "callbacks": list(m.callbacks)},
                estimate_s=E.train_estimate(m.family, m.train_samples, m.cost),
                description=f"train {m.label} (seed {seed}) from preset {m.preset}"))
            train_names[run] = name
    eval_names: Dict[tuple, str] = {}
    for ev in study.evals:
        for key in ev.models:
            m = study.model(key)
            for seed, run in zip(m.seeds, m.runs()):
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
                stages.append(Stage(name, "eval", S.eval_stage, deps=deps, params={
                    "run": run, "suite": ev.suite, "sets": sets, "limit": ev.limit, "model": key, "seed": seed},
                    estimate_s=E.eval_estimate(ev.suite, ev.limit or 10000, m.cost, ev.copies, ev.n_eps, ev.steps),
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
    stages.append(Stage("report", "report", S.report_stage, after=[s.name for s in stages],
                        params={"study": study.name}, estimate_s=E.REPORT_S,
                        description="results.json, report.md, report.html and figures"))
    return stages
