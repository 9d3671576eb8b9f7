"""The key controls (clip, drop) against float64 loops written from their definition, their no-op cases,
their gradients and their options."""

import pytest
import torch

from rpc_attention import functional as RF

from .reference import rand, ref_feature_medians, ref_median, ref_outlier_rows, ref_softmax_attention


def ref_clip(kk, c):
    """One (batch, head): every entry clipped to its feature's median over tokens +- c * 1.4826 * MAD, the
    MAD over all (token, feature) entries of |k - per-feature median|."""
    everyone = torch.ones(kk.shape[0], dtype=torch.bool)
    centre = ref_feature_medians(kk, everyone)
    mad = ref_median((kk - centre).abs().flatten().tolist())
    half = c * 1.4826 * max(mad, 1e-12 / 1.4826)
    out = kk.clone()
    for n in range(kk.shape[0]):
        for j in range(kk.shape[1]):
            out[n, j] = min(max(float(kk[n, j]), float(centre[j]) - half), float(centre[j]) + half)
    return out


def ref_controlled(k, v, control, level):
    b, h, n, d = k.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    everyone = torch.ones(n, dtype=torch.bool)
    for i in range(b):
        for j in range(h):
            kk = k[i, j]
            if control == "clip":
                kc = ref_clip(kk, level)
                out[i, j] = ref_softmax_attention(kc, kc, v[i, j], d ** -0.5)
            else:
                keep = ~ref_outlier_rows(kk, everyone, level)
                out[i, j] = ref_softmax_attention(kk, kk, v[i, j], d ** -0.5, valid_keys=keep)
    return out


def _keys_with_outliers(seed=0):
    k = rand(2, 3, 11, 4, seed=seed)
    v = rand(2, 3, 11, 5, seed=seed + 1)
    k[0, :, 3] += 25.0     # a whole outlying token
    k[1, 1, 7, 2] -= 40.0  # one outlying entry
    return k, v


@pytest.mark.parametrize("control,level", [("clip", 4.0), ("clip", 1.0), ("drop", 6.0), ("drop", 2.0)])
def test_controls_match_a_float64_loop(control, level):
    k, v = _keys_with_outliers()
    got = RF.controlled_symmetric_attention(k, v, control, level, fused=False)
    torch.testing.assert_close(got, ref_controlled(k, v, control, level), rtol=0, atol=1e-12)


def test_the_controls_act_on_outliers_and_leave_clean_keys_alone():
    k, v = _keys_with_outliers()
    plain = RF.symmetric_attention(k, v)
    # the outlying token is dropped and clipped: both controls change the output
    assert not torch.allclose(RF.controlled_symmetric_attention(k, v, "drop"), plain)
    assert not torch.allclose(RF.controlled_symmetric_attention(k, v, "clip"), plain)
    assert not RF.key_drop_mask(k, 6.0)[0, :, 0, 3].any()
    # a clipping level far above every deviation is no clipping at all
    torch.testing.assert_close(RF.controlled_symmetric_attention(k, v, "clip", 1e6), plain, rtol=0, atol=1e-12)
    # keys on a line with equal gaps: every token's row score is as far from the median as its mirror, no
    # row is an outlier at 6 robust deviations, and dropping changes nothing
    even = torch.linspace(-1, 1, 9, dtype=torch.float64).reshape(1, 1, 9, 1).expand(1, 2, 9, 3).contiguous()
    vals = rand(1, 2, 9, 3, seed=5)
    assert RF.key_drop_mask(even, 6.0).all()
    torch.testing.assert_close(RF.controlled_symmetric_attention(even, vals, "drop"),
                               RF.symmetric_attention(even, vals), rtol=0, atol=1e-12)


def test_gradients_pass_the_clipping_and_the_mask():
    k, v = _keys_with_outliers()
    k = k.requires_grad_(True)
    clipped = RF.clip_keys(k, 1.0)
    (grad,) = torch.autograd.grad(clipped.sum(), k)
    # 1 where the entry is inside the bounds, 0 where it was clipped (the bounds carry no gradient)
    assert torch.equal(grad, (clipped == k).to(grad.dtype))
    out = RF.controlled_symmetric_attention(k, v, "drop")
    (grad,) = torch.autograd.grad(out.square().sum(), k)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_bad_options_are_one_clear_error():
    k, v = _keys_with_outliers()
    with pytest.raises(ValueError, match="key_control must be one of clip, drop"):
        RF.controlled_symmetric_attention(k, v, "median")
    with pytest.raises(ValueError, match="for clip must be > 0"):
        RF.check_key_control("clip", 0.0)
    with pytest.raises(ValueError, match="for drop must be >= 0"):
        RF.check_key_control("drop", -1.0)
    with pytest.raises(ValueError, match="finite number"):
        RF.check_key_control("clip", float("inf"))
    with pytest.raises(ValueError, match="needs key_control"):
        RF.check_key_control(None, 3.0)
    assert RF.check_key_control("clip") == 4.0 and RF.check_key_control("drop") == 6.0
    assert RF.check_key_control(None) is None
