"""Kernel-PCA analysis toolkit: test the paper's claims (and its critics') on any attention model.

* :mod:`.metrics` -- the math (J_proj and its terms in log space, centred Gram matrix, eigenvalues,
  gamma constancy, direct/optimal cosine, linear and RBF CKA, chance baselines), float64.
* :mod:`.hooks` -- :class:`AttentionCapture`: q, k, v of rpc_attention.nn, timm and Hugging Face
  attention modules via forward hooks.
* :mod:`.analysis` -- per-layer / model-level aggregation under the ``paper`` and ``exact`` protocols.
* :mod:`.sources`, :mod:`.runner`, :mod:`.plots` -- probes (run / timm / HF); the analysis run (JSON,
  figures, summary.md).
* :mod:`.jproj_callback` -- the ``jproj`` trainer callback (J_proj on a fixed probe batch every epoch);
  :func:`register_callbacks` registers it with the trainer (the ``train`` and ``reproduce`` commands call it).
* :mod:`.suite` -- the ``kpca`` evaluation suite (J_proj trained vs initial, V vs V_hat against chance);
  :func:`register_suites` registers it with the suite registry (the ``eval`` commands call it).

What PAP's sparse step did (S activity per PAP block on a fixed probe) is measured by
:mod:`rpc_attention.train.sparsity`, the trainer's default ``sparsity`` callback; the analysis reports it too.

Heavy dependencies (scipy, matplotlib, transformers) are imported lazily.
"""

from ..extras import require

require('rpc_attention.kpca', 'eval')  # one line naming the missing extra, before any import that needs it

from ..train.callbacks import register_callback
from .analysis import PROTOCOLS, analyze_captures, chance_baselines, pap_stats
from .hooks import AttentionCapture, LayerCapture, find_attention_modules
from .jproj_callback import jproj_callback

__all__ = ["PROTOCOLS", "analyze_captures", "chance_baselines", "pap_stats", "AttentionCapture", "LayerCapture",
           "find_attention_modules", "register_callbacks", "register_suites"]


def register_callbacks() -> None:
    """Register the toolkit's trainer callbacks (``jproj``) so a run can list them in ``train.callbacks``."""
    register_callback("jproj", jproj_callback, overwrite=True, config_keys=("train.jproj_examples",))


def register_suites() -> None:
    """Register the toolkit's evaluation suite (``kpca``) so ``eval --suite kpca`` and the studies can run it."""
    from .suite import register

    register()
