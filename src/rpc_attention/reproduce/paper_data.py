"""The paper study as data: its settings (typed, with defaults), its models and the claims of its scorecard,
one per row of the paper's results table. :func:`rpc_attention.reproduce.studies._paper_study` builds the
study from these, and :mod:`rpc_attention.reproduce.plan` sizes its confirmatory run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..evaluate.classification import MEAN_TOP1, TOP1, top1_at
from ..evaluate.corruptions import MCE
from ..evaluate.lm import ppl_metric
from ..evaluate.ood import AUPR_ENERGY
from ..evaluate.segmentation import CORRUPTED_MIOU, MIOU
from .specs import ClaimSpec, setting
from .study_data import RPC6, ModelRow


@dataclass(frozen=True)
class PaperSettings:
    """``paper``: every row of the paper's results table and the Scaled-Attention finding, each configured as
    the paper configures it, at the quick study's training schedule. Without ``plan`` it runs as a pilot on
    ``seeds`` with the limits below; with ``plan`` (a committed plan file, ``rpc-attention plan``) the plan
    fixes every setting, the seeds and the examples of each claim, and no other setting may be given."""

    plan: Optional[str] = None                   # a plan file (docs/plans/paper.json): the confirmatory run
    seeds: List[int] = setting([0, 1, 2])        # pilot seeds (a plan's seeds start at its seed_base)
    preset_symvit: str = "fmnist-symvit"
    preset_rpc6: str = "fmnist-rpc-symvit"       # PAP 6 iterations in block 0; the 5-iteration OOD model too
    preset_rpc2all: str = "fmnist-rpc-symvit-all"
    preset_asym: str = "fmnist-vit"
    preset_scaled: str = "fmnist-scaled-s"
    preset_scaled_alpha: str = "fmnist-scaled-alpha"
    preset_seg: str = "seg-fmnist-symvit"
    preset_seg_rpc: str = "seg-fmnist-rpc-symvit"  # PAP 4 iterations in encoder block 0 and decoder layer 0
    preset_symlm: str = "wiki-symlm"
    preset_rpc_symlm: str = "wiki-rpc-symlm"
    # the quick study's schedule for every image classifier (6 heads of 16, one epoch of 24,000 images)
    epochs: int = 1
    batch_size: int = 64
    train_subset: int = 24000
    val_size: int = 2000
    train_overrides: List[str] = setting(["model.kwargs.num_heads=6"])
    depth: int = 6
    # the paper's attack protocol: eps 1..6/255, PGD 20 steps of 0.15 eps; AutoAttack and Square at 1/255
    eps: str = "1:6/255"
    pgd_steps: int = 20
    corruptions: List[str] = setting(["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur",
                                      "brightness", "contrast", "pixelate", "jpeg_compression"])
    ood_sets: List[str] = setting(["ood.ood_set=digits8x8"])
    # test examples per evaluation (a plan sets its own per claim)
    clean_limit: int = 10000
    corruption_limit: int = 500
    ood_limit: int = 1000
    fgsm_limit: int = 1000
    pgd_limit: int = 500
    autoattack_limit: int = 100
    square_limit: int = 100
    seg_limit: int = 500
    seg_corruption_limit: int = 100
    seg_epochs: int = 12
    # the language models at the paper's depth and width (16 layers, d_model 128), PAP in the first quarter
    lm_layers: int = 16
    lm_steps: int = 300
    lm_batch_size: int = 16
    lm_eval_sets: List[str] = setting(["protocols=sliding", "splits=test"])
    # a confirmatory run on fresh data: the training subset's seed, the first test images left out (those an
    # earlier run evaluated on), the Segmenter's scene seed; the kernel-PCA probe's test images
    subset_seed: int = 0
    test_offset: int = 0
    seg_data_seed: int = 0
    kpca_limit: int = 8


PAPER = PaperSettings()

# The paper study's models: each RPC model configured as the paper's row it answers (6 iterations in block 0 for
# clean / mCE / FGSM / AutoAttack / Square, 5 for OOD, 2 in every block for PGD; the Segmenter with 4 and with 6;
# the language model with 4 iterations in its first quarter of blocks)
PAPER_VISION = (
    ModelRow(key="symvit", label="SymViT", preset="preset_symvit", family="vision", role="baseline"),
    ModelRow(key="rpc6", label="RPC-SymViT 6iter/layer1", preset="preset_rpc6", family="vision", role="rpc", pap=(6, 1)),
    ModelRow(key="rpc5", label="RPC-SymViT 5iter/layer1", preset="preset_rpc6", family="vision", role="rpc", pap=(5, 1),
             overrides=("model.kwargs.n_iter=5",)),
    ModelRow(key="rpc2all", label="RPC-SymViT 2iter/all-layer", preset="preset_rpc2all", family="vision", role="rpc",
             pap=(2, None)),
)
PAPER_SEG = (
    ModelRow(key="seg_symvit", label="Segmenter SymViT", preset="preset_seg", family="seg", role="baseline"),
    ModelRow(key="seg_rpc4", label="Segmenter RPC-SymViT 4iter/layer1", preset="preset_seg_rpc", family="seg",
             role="rpc", cost=1.3),
    ModelRow(key="seg_rpc6", label="Segmenter RPC-SymViT 6iter/layer1", preset="preset_seg_rpc", family="seg",
             role="rpc", cost=1.5, overrides=("model.kwargs.n_iter=6", "model.decoder_n_iter=6")),
)


# The paper study's claims: one per row of the paper's results table, in its order, and the Scaled-Attention
# finding (both re-parameterisations against the asymmetric softmax ViT, which is what the paper compares them
# with). Targets and margins come from the plan (rpc_attention.reproduce.plan.target_for: the paper's relative
# improvement applied to our baseline); a pilot run has neither (margin 0).
@dataclass(frozen=True, kw_only=True)
class PaperClaim:
    """One row of the scorecard: the paper's row ``id`` (``report.paper.PAPER_ROWS``) and how we test it."""

    id: str
    subject: str
    says: str
    table: str
    suite: str
    metric: str
    baseline: str
    rpc: str
    higher: bool = True
    baseline_metric: Optional[str] = None   # a claim within one model: the baseline's own metric
    kpca: Optional[str] = None              # a kernel-PCA row of the paper's section 2: "k1" or "k2"
    since: int = 1                          # the plan format that first has the claim

    def spec(self, target: Optional[float], margin: float, family: str, smaller: bool = False) -> ClaimSpec:
        return ClaimSpec(id=self.id, subject=self.subject, says=self.says, table=self.table, suite=self.suite,
                         metric=self.metric, baseline=self.baseline, rpc=self.rpc, higher=self.higher,
                         target=target, margin=margin, family=family, smaller=smaller,
                         baseline_metric=self.baseline_metric)


PAPER_CLAIMS = (
    PaperClaim(id="clean", subject=RPC6, says="raises clean top-1", table="vision", suite="clean", metric=TOP1,
               baseline="symvit", rpc="rpc6"),
    PaperClaim(id="mce", subject=RPC6, says="lowers the corruption error (mCE relative to SymViT)", table="vision",
               suite="corruptions", metric=MCE, baseline="symvit", rpc="rpc6", higher=False),
    PaperClaim(id="ood_aupr", subject="RPC (5 iters, layer 1)", says="detects out-of-distribution inputs better "
               "(AUPR of the energy score, scikit-learn's 8x8 digits against Fashion-MNIST)", table="vision",
               suite="ood", metric=AUPR_ENERGY, baseline="symvit", rpc="rpc5"),
    PaperClaim(id="pgd", subject="RPC (2 iters, all layers)", says="is more accurate under PGD (mean over eps "
               "1-6/255)", table="vision", suite="pgd", metric=MEAN_TOP1, baseline="symvit", rpc="rpc2all"),
    PaperClaim(id="fgsm", subject=RPC6, says="is more accurate under FGSM (mean over eps 1-6/255)", table="vision",
               suite="fgsm", metric=MEAN_TOP1, baseline="symvit", rpc="rpc6"),
    PaperClaim(id="autoattack", subject=RPC6, says="is more accurate under AutoAttack (eps 1/255)", table="vision",
               suite="autoattack", metric=top1_at("1/255"), baseline="symvit", rpc="rpc6"),
    PaperClaim(id="square", subject=RPC6, says="is more accurate under the Square attack (eps 1/255)",
               table="vision", suite="square", metric=top1_at("1/255"), baseline="symvit", rpc="rpc6"),
    PaperClaim(id="lm_ppl", subject="RPC-Symlm (4 iters, first quarter of the layers)", says="has lower test "
               "perplexity", table="lm", suite="ppl", metric=ppl_metric("test", "sliding"), baseline="symlm",
               rpc="rpc_symlm", higher=False),
    PaperClaim(id="lm_wordswap", subject="RPC-Symlm (4 iters, first quarter of the layers)", says="has lower "
               "perplexity on word-swap-attacked text", table="lm", suite="wordswap",
               metric=ppl_metric("test", "sliding", attacked=True), baseline="symlm", rpc="rpc_symlm", higher=False),
    PaperClaim(id="seg_miou", subject="RPC Segmenter (4 iters, layer 1)", says="raises segmentation mIoU",
               table="seg", suite="seg", metric=MIOU, baseline="seg_symvit", rpc="seg_rpc4"),
    PaperClaim(id="seg_corrupt_miou", subject="RPC Segmenter (6 iters, layer 1)", says="raises mIoU on corrupted "
               "scenes", table="seg", suite="seg-corruptions", metric=CORRUPTED_MIOU, baseline="seg_symvit",
               rpc="seg_rpc6"),
    PaperClaim(id="base_clean", subject="RPC-SymViT-base (2 iters, all layers)", says="raises clean top-1",
               table="vision", suite="clean", metric=TOP1, baseline="symvit_base", rpc="rpc2all_base"),
    PaperClaim(id="scaled_s", subject="Scaled Attention S", says="beats the asymmetric softmax ViT (clean top-1)",
               table="scaled", suite="clean", metric=TOP1, baseline="vit", rpc="scaled_s"),
    PaperClaim(id="scaled_alpha", subject="Scaled Attention alpha", says="beats the asymmetric softmax ViT (clean "
               "top-1)", table="scaled", suite="clean", metric=TOP1, baseline="vit", rpc="scaled_alpha"),
    # the paper's section 2 (the kernel-PCA view): K1, training lowers the projection loss J_proj (our SymViT on the
    # definitions; the paper's own setting: Scaled Attention S measured with per-token standardised q and k); K2,
    # the learned values are the centred key Gram matrix's eigenvectors (Scaled Attention S, the (I - S)V model the
    # paper uses), by optimal cosine and linear CKA against their chance levels, on both protocols
    PaperClaim(id="k1_symvit", subject="SymViT", says="has a lower J_proj after training than at initialisation "
               "(K1, the definitions)", table="kpca", suite="kpca", metric="jproj_exact", baseline="symvit",
               rpc="symvit", higher=False, baseline_metric="jproj_init_exact", kpca="k1", since=2),
    PaperClaim(id="k1_scaled", subject="Scaled Attention S", says="has a lower J_proj after training than at "
               "initialisation (K1, the paper's protocol)", table="kpca", suite="kpca", metric="jproj_paper",
               baseline="scaled_s", rpc="scaled_s", higher=False, baseline_metric="jproj_init_paper", kpca="k1",
               since=2),
    *(PaperClaim(id=f"k2_{m}_{proto}", subject="Scaled Attention S", says="learns values aligned with the centred "
                 f"Gram eigenvectors beyond chance (K2, {label}, {words})", table="kpca", suite="kpca",
                 metric=f"{metric}_{proto}", baseline="scaled_s", rpc="scaled_s",
                 baseline_metric=f"{metric}_chance_{proto}", kpca="k2", since=2)
      for m, metric, label in (("cosine", "optimal_cosine", "optimal cosine"), ("cka", "linear_cka", "linear CKA"))
      for proto, words in (("paper", "the paper's protocol"), ("exact", "the definitions"))),
)
# claims this machine's budget cannot reach: kept as rows with why, the command that runs them and its cost
PAPER_NOT_RUN = {
    "base_clean": {
        "reason": "SymViT-base needs ImageNet-1K and GPUs (the paper's 300-epoch DeiT recipe); a Fashion-MNIST stand-in "
                  "would not be a base model",
        "command": "rpc-attention reproduce --study imagenet --out DIR --set data.imagenet=PATH "
                   "--set preset_symvit=imagenet-symvit-base --set preset_rpc2all=imagenet-rpc-symvit-base-2iter-all "
                   "--set preset_rpc6= --launcher slurm",
        "cost": "two 300-epoch ImageNet-1K trainings of a base ViT per seed: on the order of 2 x 8 GPUs x 3 days"},
}
