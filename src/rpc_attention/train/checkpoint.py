"""Atomic training checkpoints.

A checkpoint is a folder ``DIR/checkpoints/step_00001234/`` holding

* ``model.safetensors`` (the unwrapped model's weights), ``model_ema.safetensors`` (if EMA),
* ``state.pt``: optimizer, scheduler, grad scaler, RNG states of every rank, step/epoch (the data
  position), the resolved config, saved with ``torch.save`` of plain containers and tensors only and read
  back with ``torch.load(weights_only=True)``,
* ``meta.json``: step and the SHA-256 of every file above, written last.

The folder is written under a temporary name and renamed into place (``os.replace``), so a crash never
leaves a half-written ``step_*`` folder; :func:`verify_checkpoint` re-hashes the files, so a truncated or
corrupted one is detected and :func:`latest_checkpoint` falls back to the previous good one (the last
``keep`` checkpoints are kept).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..files import atomic_write_bytes

_log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (missing file, hash mismatch, unreadable)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _state_dict_for_safetensors(sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


def save_safetensors_atomic(state_dict: Dict[str, torch.Tensor], path: os.PathLike,
                            metadata: Optional[Dict[str, str]] = None) -> None:
    from safetensors.torch import save

    atomic_write_bytes(path, save(_state_dict_for_safetensors(state_dict), metadata=metadata))


# ------------------------------------------------------------------------------------------- RNG
def rng_state() -> Dict[str, Any]:
    """This process's RNG states as weights-only-loadable containers (tensors, ints, lists)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": str(np_state[0]), "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "python": [int(py_state[0]), list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ------------------------------------------------------------------------------------- save/load
def _to_plain(obj: Any) -> Any:
    """Make a state dict weights-only loadable (tuples -> lists kept, numpy -> python/tensor)."""
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    return obj


def save_checkpoint(ckpt_root: os.PathLike, step: int, model_sd: Dict[str, torch.Tensor],
                    state: Dict[str, Any], ema_sd: Optional[Dict[str, torch.Tensor]] = None,
                    keep: int = 2) -> Path:
    """Write ``ckpt_root/step_{step:08d}`` atomically and prune to the newest ``keep`` checkpoints."""
    from safetensors.torch import save

    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step:08d}-", dir=str(root)))
    try:
        files = {"model.safetensors": save(_state_dict_for_safetensors(model_sd))}
        if ema_sd is not None:
            files["model_ema.safetensors"] = save(_state_dict_for_safetensors(ema_sd))
        buf = io.BytesIO()
        torch.save(_to_plain(state), buf)
        files["state.pt"] = buf.getvalue()
        hashes = {}
        for name, data in files.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            hashes[name] = hashlib.sha256(data).hexdigest()
        meta = json.dumps({"step": int(step), "files": hashes}, indent=1).encode()
        with open(tmp / "meta.json", "wb") as f:
            f.write(meta)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # prune older checkpoints (only valid-looking step_* folders count)
    ckpts = list_checkpoints(root)
    for old in ckpts[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: os.PathLike) -> List[Path]:
    """``step_*`` folders sorted by step (oldest first)."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            out.append(p)
    return sorted(out, key=lambda p: int(p.name[5:]))


def verify_checkpoint(path: os.PathLike) -> Dict[str, Any]:
    """Check a checkpoint folder's files against ``meta.json``; returns the meta or raises CheckpointError."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: meta.json is missing")
    try:
        meta = json.loads(meta_path.read_text())
        files = meta["files"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} is corrupt: meta.json is unreadable") from None
    for name, digest in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        if _sha256(f) != digest:
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {name} does not match its "
                                  f"SHA-256 in meta.json")
    return meta


def latest_checkpoint(ckpt_root: os.PathLike,
                      warn: Optional[Callable[[str], Any]] = _log.warning) -> Optional[Path]:
    """The newest checkpoint that verifies; each corrupt newer one is reported through ``warn`` (a log
    warning by default, None for silence). The message carries no "warning:" of its own: the handler
    that prints a warning (the command line's) adds it."""
    for p in reversed(list_checkpoints(ckpt_root)):
        try:
            verify_checkpoint(p)
            return p
        except CheckpointError as exc:
            if warn is not None:
                warn(f"{exc}; falling back to the previous checkpoint")
    return None


def load_checkpoint(path: os.PathLike) -> Tuple[Dict[str, torch.Tensor], Optional[Dict[str, torch.Tensor]], Dict[str, Any]]:
    """``(model_state_dict, ema_state_dict or None, state)`` of a verified checkpoint folder."""
    from safetensors.torch import load_file

    path = Path(path)
    verify_checkpoint(path)
    try:
        model_sd = load_file(str(path / "model.safetensors"))
        ema_sd = load_file(str(path / "model_ema.safetensors")) if (path / "model_ema.safetensors").is_file() else None
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {str(exc).splitlines()[0]}") from None
    return model_sd, ema_sd, state
