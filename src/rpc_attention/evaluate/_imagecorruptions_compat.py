"""Run ``imagecorruptions`` 1.1.2 on current NumPy / scikit-image / setuptools, without global patches.

The library needs three fixes on this stack:

1. it imports ``pkg_resources`` (gone from recent setuptools) for ``resource_filename`` only
   (locating its frost images);
2. it calls ``skimage.filters.gaussian(..., multichannel=True)``; scikit-image >= 0.19 spells it
   ``channel_axis=-1`` and 0.25 removed ``multichannel``;
3. it uses ``np.float_``, removed in NumPy 2;
4. its impulse noise calls ``skimage.util.random_noise`` without a generator, and scikit-image >= 0.19
   then seeds a fresh ``default_rng()`` from the operating system, so impulse noise differed on every
   call whatever NumPy's global seed; the stand-in passes a generator drawn from NumPy's global RNG.

Nothing global is changed: (1) a stand-in ``pkg_resources`` is placed in ``sys.modules`` only while
the library is imported and removed afterwards (unless a real one was there); (2)-(4) replace the
names ``gaussian``, ``np`` and ``sk`` *inside the imagecorruptions module namespace* only while a corruption
runs (:func:`patched`), then restore them.  NumPy's global RNG, which the library draws from, is
seeded and restored around each call in :func:`corrupt`, so results are deterministic and other
code's random streams are untouched.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.resources
import importlib.util
import os
import sys
import threading
import types
from typing import Iterator, Optional

import numpy as np

__all__ = ["CORRUPTIONS", "available", "load", "patched", "corrupt"]

# The 15 ImageNet-C corruptions (imagecorruptions' "common" subset), in the canonical order.
CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
    "jpeg_compression",
)

_LOCK = threading.RLock()
_MODULES: Optional[tuple] = None


def available() -> bool:
    return importlib.util.find_spec("imagecorruptions") is not None


def _resource_filename(package: str, resource: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations and spec.origin is None:
        raise FileNotFoundError(f"cannot locate package {package!r}")
    base = (list(spec.submodule_search_locations)[0] if spec.submodule_search_locations
            else os.path.dirname(spec.origin))
    return os.path.normpath(os.path.join(base, resource))


def load():
    """Import ``(imagecorruptions, imagecorruptions.corruptions)`` with the ``pkg_resources`` stand-in."""
    global _MODULES
    with _LOCK:
        if _MODULES is not None:
            return _MODULES
        if not available():
            raise FileNotFoundError("the 'imagecorruptions' package is not installed "
                                    "(pip install --no-deps imagecorruptions==1.1.2)")
        stub_added = False
        if "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None:
            stub = types.ModuleType("pkg_resources")
            stub.resource_filename = _resource_filename  # type: ignore[attr-defined]
            sys.modules["pkg_resources"] = stub
            stub_added = True
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # scipy.ndimage.interpolation deprecation
                pkg = importlib.import_module("imagecorruptions")
                mod = importlib.import_module("imagecorruptions.corruptions")
        finally:
            if stub_added:
                sys.modules.pop("pkg_resources", None)
        _MODULES = (pkg, mod)
        return _MODULES


class _NumpyShim(types.ModuleType):
    """``numpy`` as seen by imagecorruptions: the real module plus ``float_``."""

    def __init__(self) -> None:
        super().__init__("numpy")
        self.float_ = np.float64

    def __getattr__(self, name):
        return getattr(np, name)


def _random_noise(image, mode="gaussian", rng=None, clip=True, **kwargs):
    """``skimage.util.random_noise`` with its generator seeded from NumPy's global RNG (see 4. above)."""
    from skimage.util import random_noise

    if rng is None:
        rng = np.random.randint(0, 2 ** 32, dtype=np.uint64)
    return random_noise(image, mode=mode, rng=int(rng), clip=clip, **kwargs)


class _Delegate(types.ModuleType):
    """A module that answers with ``overrides`` first, then with the real ``module``'s attributes."""

    def __init__(self, module: types.ModuleType, **overrides) -> None:
        super().__init__(module.__name__)
        self._module = module
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._module, name)


def _skimage_shim() -> types.ModuleType:
    """``skimage`` as seen by imagecorruptions: the real package with ``util.random_noise`` replaced."""
    import skimage
    import skimage.util

    return _Delegate(skimage, util=_Delegate(skimage.util, random_noise=_random_noise))


def _gaussian(image, sigma=1, *args, multichannel=None, **kwargs):
    from skimage.filters import gaussian

    if multichannel is not None and "channel_axis" not in kwargs:
        kwargs["channel_axis"] = -1 if multichannel else None
    return gaussian(image, sigma, *args, **kwargs)


@contextlib.contextmanager
def patched() -> Iterator[object]:
    """Within the block, imagecorruptions' ``gaussian``, ``np`` and ``sk`` names are the compatible ones."""
    _, mod = load()
    with _LOCK:
        saved = {name: mod.__dict__.get(name) for name in ("gaussian", "np", "sk")}
        mod.gaussian = _gaussian
        mod.np = _NumpyShim()
        mod.sk = _skimage_shim()
        try:
            yield mod
        finally:
            for name, value in saved.items():
                setattr(mod, name, value)


def corrupt(image: np.ndarray, name: str, severity: int, seed: Optional[int] = None) -> np.ndarray:
    """Corrupt one ``uint8`` ``H x W x 3`` image (H, W >= 32) with ``name`` at ``severity`` 1..5.

    With ``seed`` the library's draws from NumPy's global RNG are seeded and the previous global RNG
    state is restored afterwards.
    """
    pkg, _ = load()
    if name not in pkg.corruption_dict:
        raise ValueError(f"unknown corruption {name!r}; choose from {', '.join(CORRUPTIONS)}")
    if severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be 1..5, got {severity!r}")
    with patched():
        state = np.random.get_state() if seed is not None else None
        try:
            if seed is not None:
                np.random.seed(seed % (2 ** 32))
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return pkg.corrupt(image, severity=severity, corruption_name=name)
        finally:
            if state is not None:
                np.random.set_state(state)
