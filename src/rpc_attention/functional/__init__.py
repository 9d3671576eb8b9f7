"""Attention kernels: symmetric attention, Principal Attention Pursuit (PAP) and Scaled Attention.

Every model family, integration and analysis tool in this library calls these functions; there is
no second copy of the PAP algorithm anywhere. Tensors are shaped ``(batch, heads, tokens, head_dim)``.

- :mod:`.attention`: softmax attention (asymmetric, symmetric, scaled) and the mask normaliser.
- :mod:`.pap`: PAP's definition (:func:`pap_loop`, the plain loop), its options, mu and tau,
  and the entry points :func:`pap_attention` and :func:`pap_decompose`.
- :mod:`.pap_fused`: the fused fast path beside it, with its derivation and hand-written backward.
- :mod:`.pap_robust`: the fast path of the dual-free robust options (hard shrinkage, no dual step),
  with its derivation.
- :mod:`.key_controls`: the key controls robust PAP is compared with (clipped keys, outlier tokens
  dropped as keys).
- :mod:`.pap_cache`: cached decoding for causal PAP (:func:`pap_prefill`, :class:`PAPCache`).
"""

from .attention import as_bool_mask, attention, scaled_attention_alpha, scaled_attention_s, symmetric_attention
from .key_controls import (
    KEY_CONTROL_LEVELS,
    KEY_CONTROLS,
    check_key_control,
    clip_keys,
    controlled_keys,
    controlled_symmetric_attention,
    key_drop_mask,
)
from .pap import (
    LOWRANKS,
    MU_MODES,
    SHRINKS,
    THRESHOLDS,
    PAPState,
    check_pap_options,
    hard_shrink,
    pap_attention,
    pap_decompose,
    robust_scale,
    soft_shrink,
    sparse_activity,
)
from .pap_cache import PAPCache, append_rows, pap_prefill

# The public kernels. The plumbing behind pap_attention (prepare_pap, PAPProblem, pap_loop,
# sparse_term_activity) is imported from rpc_attention.functional.pap by the code that builds on it.
__all__ = [
    "PAPState",
    "PAPCache",
    "pap_prefill",
    "append_rows",
    "THRESHOLDS",
    "MU_MODES",
    "LOWRANKS",
    "SHRINKS",
    "as_bool_mask",
    "attention",
    "symmetric_attention",
    "pap_attention",
    "pap_decompose",
    "scaled_attention_s",
    "scaled_attention_alpha",
    "soft_shrink",
    "hard_shrink",
    "robust_scale",
    "sparse_activity",
    "check_pap_options",
    "KEY_CONTROLS",
    "KEY_CONTROL_LEVELS",
    "check_key_control",
    "clip_keys",
    "key_drop_mask",
    "controlled_keys",
    "controlled_symmetric_attention",
]
