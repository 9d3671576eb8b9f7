"""Atomic file output, used for every result, checkpoint, cache and figure the package writes (and
the one YAML-mapping reader: configs and presets).

A file is written under a temporary name in its own folder and renamed into place with
``os.replace``, so a crash or a kill never leaves a half-written file behind and never destroys the
previous version: readers see the old file or the new one, nothing in between.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

__all__ = ["PathLike", "atomic_write", "atomic_write_bytes", "atomic_write_text", "to_json", "json_default",
           "atomic_write_json", "atomic_savefig", "pyplot", "read_yaml_mapping"]

PathLike = Union[str, os.PathLike]


def atomic_write(path: PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` to produce the file, then rename it to ``path``.

    The temporary file sits in the same folder (so the rename is atomic) and keeps ``path``'s
    suffix (so writers that infer a format from it, such as ``savefig``, do the right thing).
    On any error, the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=str(path.parent))
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates the file 0600: give it the mode a plain open() would (the existing file's, else
        # 0666 less the umask), so results on a shared disk stay readable by whoever could read them before
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _umask() -> int:
    """The process umask, read without changing it where the system says (Linux), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` atomically, flushed to disk before the rename."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return atomic_write(path, write)


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def to_json(obj: Any, default: Optional[Callable[[Any], Any]] = None) -> Any:
    """``obj`` as plain JSON values, the one cleaning every JSON file the package writes goes through.

    Mappings (keys made ``str``), lists (from lists, tuples and sets), ``str``, ``int``, ``bool``,
    ``None`` and finite floats; a NaN or infinite float becomes ``None`` (standard JSON has neither);
    other real numbers (numpy, fractions) become ``int`` or ``float``, arrays and tensors nested lists
    (``tolist``), paths ``str``.
    Anything else goes to ``default`` (``None``: ``TypeError``).
    """
    if isinstance(obj, Mapping):
        return {str(k): to_json(v, default) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [to_json(v, default) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, numbers.Integral):  # numpy integers
        return int(obj)
    if isinstance(obj, numbers.Real):  # numpy floats, fractions (eps=2.5/255)
        return to_json(float(obj))
    if callable(getattr(obj, "tolist", None)):  # numpy scalars and arrays, torch tensors
        return to_json(obj.tolist(), default)
    if default is None:
        raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
    return default(obj)


def json_default(obj: Any) -> Any:
    """``json.dumps(..., default=json_default)``: :func:`to_json` for what ``json`` cannot write itself."""
    return to_json(obj)


def atomic_write_json(path: PathLike, obj: Any, *, indent: int = 2, sort_keys: bool = True,
                      default: Optional[Callable[[Any], Any]] = None) -> Path:
    """Write ``obj`` as standard JSON atomically, cleaned by :func:`to_json` (``default``: for other objects)."""
    text = json.dumps(to_json(obj, default), indent=indent, sort_keys=sort_keys, allow_nan=False)
    return atomic_write_text(path, text + "\n")


def atomic_savefig(fig, path: PathLike, **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)`` atomically; the format comes from ``path``'s suffix."""
    kwargs.setdefault("format", Path(path).suffix.lstrip(".") or "png")  # tmp's own suffix is ".tmp.png"
    return atomic_write(path, lambda tmp: fig.savefig(tmp, **kwargs))


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend (figures are only ever written to files)."""
    from .extras import import_optional

    import_optional("matplotlib", "writing figures").use("Agg", force=True)
    return import_optional("matplotlib.pyplot", "writing figures")


def read_yaml_mapping(path: PathLike) -> dict:
    """The mapping in YAML file ``path``; FileNotFoundError / ValueError with one-line messages."""
    from .extras import import_optional

    yaml = import_optional("yaml", "reading YAML files")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} must hold a YAML mapping (task:, model:, data:, ...)")
    return cfg
