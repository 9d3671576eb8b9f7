"""Kernel-PCA analysis toolkit: test the paper's claims (and its critics') on any attention model.

* :mod:`.metrics` -- the math (J_proj and its terms in log space, centred Gram matrix, eigenvalues,
  gamma constancy, direct/optimal cosine, linear and RBF CKA, chance baselines), float64.
* :mod:`.hooks` -- :class:`AttentionCapture`: q, k, v of rpc_attention.nn, timm and Hugging Face
  attention modules via forward hooks.
* :mod:`.analysis` -- per-layer / model-level aggregation under the ``paper`` and ``exact`` protocols.
* :mod:`.sources`, :mod:`.runner`, :mod:`.plots` -- probes (run / timm / HF); the analysis run (JSON,
  figures, summary.md).
* :mod:`.jproj_callback` -- the ``jproj`` trainer callback (J_proj on a fixed probe batch every epoch),
  registered with the trainer when this package is imported.
* :mod:`.sparsity` -- what PAP's sparse step did (S activity per PAP block on a fixed probe) and the
  ``sparsity`` trainer callback, registered to run in every run when this package is imported.

Heavy dependencies (scipy, matplotlib, transformers) are imported lazily.
"""

from . import jproj_callback  # noqa: F401  (registers the ``jproj`` trainer callback)
from . import sparsity  # noqa: F401  (registers the always-on ``sparsity`` trainer callback)
from .analysis import PROTOCOLS, analyze_captures, chance_baselines, pap_stats
from .hooks import AttentionCapture, LayerCapture, find_attention_modules
from .sparsity import measure_sparsity, probe_sparsity

__all__ = ["PROTOCOLS", "analyze_captures", "chance_baselines", "pap_stats", "AttentionCapture", "LayerCapture",
           "find_attention_modules", "measure_sparsity", "probe_sparsity"]
