"""Key controls: two simple defences of symmetric attention against outlying keys, the baselines robust
PAP is compared with (docs/robustness.md#controls).

* ``clip``: every key entry clipped to ``m_j +- c * sigma``, where ``m_j`` is feature ``j``'s median over
  the tokens and ``sigma = 1.4826 * MAD`` the robust scale of the (batch, head)
  (:func:`rpc_attention.functional.robust_scale`); then symmetric attention on the clipped keys.
* ``drop``: the tokens whose key row is a robust outlier at ``level`` robust deviations (the token rule
  of :func:`rpc_attention.functional.pap.outlier_rows`) are masked out as keys (no query attends to them;
  their own query row is kept); then symmetric attention on the unchanged keys.

The centres, scales and the drop rule are computed without gradient (robust statistics, as in PAP), so
the gradient of ``clip`` is that of the clipping itself (0 on a clipped entry) and ``drop``'s mask is
a constant of the backward pass. Tensors are ``(batch, heads, tokens, head_dim)``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple, overload

from torch import Tensor

from .attention import check_kv, normalise_mask, symmetric_attention
from .pap import feature_median, outlier_rows, robust_scale

__all__ = ["KEY_CONTROLS", "KEY_CONTROL_LEVELS", "check_key_control", "clip_keys", "key_drop_mask", "valid_keys",
           "controlled_keys", "controlled_symmetric_attention"]

KEY_CONTROLS = ("clip", "drop")
# default levels: clip at 4 robust standard deviations, drop rows 6 robust deviations out
KEY_CONTROL_LEVELS: Dict[str, float] = {"clip": 4.0, "drop": 6.0}


@overload
def check_key_control(control: str, level: Optional[float] = None) -> float: ...
@overload
def check_key_control(control: None, level: Optional[float] = None) -> None: ...
@overload
def check_key_control(control: Optional[str], level: Optional[float] = None) -> Optional[float]: ...


def check_key_control(control: Optional[str], level: Optional[float] = None) -> Optional[float]:
    """Validate a control and its level; return the level to use (the control's default when None, None
    without a control). ValueError names the bad part: an unknown control, a level without a control, a
    clipping level that is not a finite number > 0, a drop level that is not a finite number >= 0."""
    if control is None:
        if level is not None:
            raise ValueError(f"key_control_level={level} needs key_control (one of {', '.join(KEY_CONTROLS)})")
        return None
    if control not in KEY_CONTROLS:
        raise ValueError(f"key_control must be one of {', '.join(KEY_CONTROLS)} (or None), got {control!r}")
    if level is None:
        return KEY_CONTROL_LEVELS[control]
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not math.isfinite(float(level)):
        raise ValueError(f"key_control_level must be a finite number, got {level!r}")
    if control == "clip" and not level > 0:
        raise ValueError(f"key_control_level for clip must be > 0 robust standard deviations, got {level}")
    if control == "drop" and not level >= 0:
        raise ValueError(f"key_control_level for drop must be >= 0 robust deviations, got {level}")
    return float(level)


def clip_keys(keys: Tensor, c: float, valid: Optional[Tensor] = None) -> Tensor:
    """``keys`` clipped to ``median +- c * robust_scale``: per (batch, head) and feature the median over
    tokens, per (batch, head) ``1.4826 * MAD`` over tokens and features; ``valid`` (bool ``(B, H, N, 1)``,
    or None for all) names the tokens the statistics are taken over. The bounds carry no gradient."""
    centre = feature_median(keys, valid)
    scale = c * robust_scale(keys, valid, centre=centre)
    centre, scale = centre.to(keys), scale.to(keys)
    return keys.clamp(centre - scale, centre + scale)


def key_drop_mask(keys: Tensor, level: float, valid: Optional[Tensor] = None) -> Tensor:
    """The ``drop`` control's key mask, bool ``(B, H, 1, N)``: False for the tokens whose key row the token
    rule flags at ``level`` robust deviations, True for the others (True = may be attended to); the rule's
    statistics are taken over the ``valid`` tokens (bool ``(B, H, N, 1)``, or None for all)."""
    return ~outlier_rows(keys, level, valid).to(keys.device).transpose(-1, -2)


def valid_keys(mask: Optional[Tensor]) -> Optional[Tensor]:
    """Bool ``(B, H, N, 1)``: the keys some query may attend to under a normalised 4-D ``mask`` (None: all).
    A key no query sees (a padding token, a token dropped as a key) must not move the statistics either."""
    return None if mask is None else mask.any(dim=-2).unsqueeze(-1)


def controlled_keys(k: Tensor, control: str, level: float,
                    valid: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``(keys, keep)`` symmetric attention uses behind ``control`` at ``level``: the clipped keys and no
    mask (``"clip"``), or the keys unchanged and the key mask of :func:`key_drop_mask` (``"drop"``); the
    statistics over the ``valid`` tokens only (bool ``(B, H, N, 1)``, or None for all)."""
    if control == "clip":
        return clip_keys(k, level, valid), None
    return k, key_drop_mask(k, level, valid)


def controlled_symmetric_attention(k: Tensor, v: Tensor, control: str, level: Optional[float] = None, *,
                                   attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                   scale: Optional[float] = None, fused: bool = True) -> Tensor:
    """Symmetric attention ``softmax(s K K^T) V`` behind a key control (``"clip"`` or ``"drop"``, see the
    module docstring) at ``level`` (default :data:`KEY_CONTROL_LEVELS`). ``attn_mask`` (bool or additive,
    broadcastable to ``(B, H, N, N)``) restricts the attention further; the statistics of the control are
    taken over the keys some query may attend to (a key the mask hides moves nothing)."""
    level = check_key_control(control, level)
    check_kv(k, v, need_same_dim=False)
    mask = normalise_mask(attn_mask, k.shape[0], k.shape[1], k.shape[2], k.shape[2])
    keys, keep = controlled_keys(k, control, level, valid_keys(mask))
    if keep is not None:
        mask = keep if mask is None else mask & keep
    return symmetric_attention(keys, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, fused=fused)
