"""Corruptions: the compat module, all 15 x 5 settings on small images, mCE and ImageNet-C trees."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rpc_attention.evaluate import _imagecorruptions_compat as compat
from rpc_attention.evaluate.corruptions import ALEXNET_ERRORS, CORRUPTIONS, corrupt_images, mce

pytestmark = pytest.mark.skipif(not compat.available(), reason="imagecorruptions not installed")


def test_compat_leaves_no_global_state():
    before_pkg = "pkg_resources" in sys.modules
    compat.load()
    _, mod = compat.load()
    assert ("pkg_resources" in sys.modules) == before_pkg
    assert not hasattr(np, "float_")  # NumPy 2 stays NumPy 2 for everyone else
    np.random.seed(123)
    state = np.random.get_state()[1].copy()
    img = np.full((32, 32, 3), 128, np.uint8)
    with compat.patched() as m:
        assert m.np.float_ is np.float64
    assert mod.np is np  # restored
    compat.corrupt(img, "fog", 3, seed=5)
    assert np.array_equal(np.random.get_state()[1], state)  # global RNG untouched


def test_all_corruptions_and_severities_small_images():
    rng = torch.Generator().manual_seed(0)
    gray = torch.rand(2, 1, 28, 28, generator=rng)  # Fashion-MNIST-like: padded to 32 internally
    rgb = torch.rand(1, 3, 32, 32, generator=rng)
    assert len(CORRUPTIONS) == 15 and set(CORRUPTIONS) == set(ALEXNET_ERRORS)
    changed = 0
    for name in CORRUPTIONS:
        for sev in range(1, 6):
            for x in (gray, rgb):
                out = corrupt_images(x, name, sev, seed=0)
                assert out.shape == x.shape and out.dtype == x.dtype, (name, sev)
                assert out.min() >= 0 and out.max() <= 1
                changed += int(not torch.allclose(out, x, atol=1 / 255))
    assert changed >= 140  # nearly every setting changes the image


def test_corruption_is_deterministic_and_batch_independent():
    x = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    a = corrupt_images(x, "gaussian_noise", 3, seed=7)
    b = torch.cat([corrupt_images(x[:2], "gaussian_noise", 3, seed=7, offset=0),
                   corrupt_images(x[2:], "gaussian_noise", 3, seed=7, offset=2)])
    assert torch.equal(a, b)
    assert not torch.equal(a, corrupt_images(x, "gaussian_noise", 3, seed=8))
    # severity grows the damage
    e1 = (corrupt_images(x, "gaussian_noise", 1) - x).abs().mean()
    e5 = (corrupt_images(x, "gaussian_noise", 5) - x).abs().mean()
    assert e5 > e1


def test_bad_names_and_severities():
    img = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError):
        compat.corrupt(img, "rain", 1)
    with pytest.raises(ValueError):
        compat.corrupt(img, "fog", 6)
    with pytest.raises(ValueError):
        corrupt_images(torch.rand(1, 2, 32, 32), "fog", 1)


def test_mce_alexnet_normalisation():
    errors = {c: ALEXNET_ERRORS[c] / 2 for c in CORRUPTIONS}
    ce, m = mce(errors, ALEXNET_ERRORS)
    assert m == pytest.approx(50.0) and all(v == pytest.approx(0.5) for v in ce.values())
    errors["fog"] = ALEXNET_ERRORS["fog"]
    _, m2 = mce(errors, ALEXNET_ERRORS)
    assert m2 == pytest.approx(100 * (14 * 0.5 + 1) / 15)
    with pytest.raises(ValueError):
        mce({"rain": 0.1}, ALEXNET_ERRORS)
