"""Training configs: YAML presets, defaults and ``--set a.b=value`` overrides.

A config is a nested dict with top-level sections ``task``, ``model``, ``data``, ``optim``,
``schedule``, ``train``, ``eval``. :func:`resolve_config` merges, in order: the trainer defaults
(:data:`DEFAULTS`), the task's own defaults (``task.default_config()`` if it has one), the preset
file, and the overrides. An override must name a key that exists after the merge, except below the
open sections :data:`OPEN_SECTIONS` (``model.kwargs`` takes any model keyword); an unknown key is a
``ValueError`` naming it and its closest known neighbours.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import yaml

from ..io import read_yaml_mapping

__all__ = [
    "DEFAULTS", "OPEN_SECTIONS", "PRESET_DIR", "list_presets", "load_preset", "parse_overrides",
    "apply_overrides", "resolve_config", "deep_merge", "dump_config", "load_config_file",
]

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"

# Sections whose children may be created by overrides (free-form keyword dicts).
OPEN_SECTIONS = ("model.kwargs", "data.augment", "eval.kwargs", "data.kwargs", "task_options")

DEFAULTS: Dict[str, Any] = {
    "task": "classification",
    "description": "",
    "model": {"name": None, "kwargs": {}},
    "data": {
        "name": None, "root": None, "num_workers": 0, "mean": None, "std": None, "num_classes": None,
        "in_chans": None, "img_size": None, "augment": {},
    },
    "optim": {
        "name": "adamw", "lr": 1e-3, "lr_scale_batch": None, "weight_decay": 0.05, "momentum": 0.9,
        "betas": [0.9, 0.999], "eps": 1e-8, "clip_grad": None,
    },
    "schedule": {"name": "cosine", "warmup_epochs": 0.0, "warmup_lr": 1e-6, "min_lr": 1e-5,
                 "decay_rate": None, "decay_epochs": None},
    "train": {
        "epochs": 1, "max_steps": None, "batch_size": 64, "seed": 0, "device": "auto", "amp": False,
        "compile": False, "deterministic": False, "threads": None, "save_every": 500, "keep_checkpoints": 2,
        "log_every": 50, "eval_every": 1, "callbacks": [], "repeated_aug": 1,
        "ema": {"enabled": False, "decay": 0.99996},
    },
    "eval": {"batch_size": 256, "final_split": "test"},
}


def deep_merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """A new dict: ``base`` updated recursively with ``over`` (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def list_presets() -> List[Tuple[str, str]]:
    """``[(name, description), ...]`` for every ``presets/*.yaml``, sorted by name."""
    out = []
    for p in sorted(PRESET_DIR.glob("*.yaml"), key=lambda p: p.stem):
        try:
            desc = (yaml.safe_load(p.read_text()) or {}).get("description", "")
        except yaml.YAMLError:
            desc = "(unreadable YAML)"
        out.append((p.stem, " ".join(str(desc).split())))
    return out


def load_config_file(path: os.PathLike) -> Dict[str, Any]:
    """The run config (or preset) in YAML file ``path``."""
    return read_yaml_mapping(path)


def load_preset(name: str) -> Dict[str, Any]:
    """The raw preset dict of ``name`` (a preset name, or a path to a YAML file)."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        return load_config_file(name)
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = [n for n, _ in list_presets()]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `rpc-attention presets` lists them"
        raise ValueError(f"unknown preset {name!r}{hint}")
    return load_config_file(path)


def _parse_value(text: str) -> Any:
    try:
        value = yaml.safe_load(text) if text.strip() != "" else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            return float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            pass
    return value


def parse_overrides(items: Optional[Iterable[str]]) -> List[Tuple[str, Any]]:
    """``["a.b=1", "c=[1,2]"]`` -> ``[("a.b", 1), ("c", [1, 2])]`` (values parsed as YAML)."""
    out = []
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ValueError(f"--set key {key!r} is not a dotted name like train.epochs")
        out.append((key, _parse_value(value)))
    return out


def _all_keys(d: Dict[str, Any], prefix: str = "") -> List[str]:
    keys = []
    for k, v in d.items():
        name = f"{prefix}{k}"
        keys.append(name)
        if isinstance(v, dict):
            keys.extend(_all_keys(v, name + "."))
    return keys


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[Tuple[str, Any]]) -> Dict[str, Any]:
    """Apply ``(dotted_key, value)`` pairs; unknown keys raise ``ValueError`` naming the key."""
    cfg = copy.deepcopy(cfg)
    for key, value in overrides:
        parts = key.split(".")
        node = cfg
        for i, part in enumerate(parts[:-1]):
            parent = ".".join(parts[: i + 1])
            if part not in node or node[part] is None:
                if any(parent == s or parent.startswith(s + ".") for s in OPEN_SECTIONS):
                    node[part] = {}
                else:
                    _unknown(cfg, key)
            if not isinstance(node[part], dict):
                raise ValueError(f"--set {key}: {parent} is a value ({node[part]!r}), not a section")
            node = node[part]
        leaf = parts[-1]
        parent = ".".join(parts[:-1])
        if leaf not in node and not any(parent == s or parent.startswith(s + ".") for s in OPEN_SECTIONS):
            _unknown(cfg, key)
        if isinstance(node.get(leaf), dict) and not isinstance(value, dict):
            raise ValueError(f"--set {key}: {key} is a section; set one of its keys "
                             f"({', '.join(sorted(node[leaf])) or 'model.kwargs.NAME'})")
        node[leaf] = value
    return cfg


def _unknown(cfg: Dict[str, Any], key: str) -> None:
    close = difflib.get_close_matches(key, _all_keys(cfg), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown config key {key!r}{hint}; open sections taking new keys: {', '.join(OPEN_SECTIONS)}")


def resolve_config(preset: Optional[str] = None, overrides: Iterable[str] = (),
                   base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Defaults + task defaults + preset (or ``base``) + ``--set`` overrides -> a full config dict."""
    from .tasks import get_task

    raw = load_preset(preset) if preset else copy.deepcopy(base or {})
    unknown_top = set(raw) - set(DEFAULTS)
    if unknown_top:
        raise ValueError(f"unknown top-level config section(s) {sorted(unknown_top)}; expected {sorted(DEFAULTS)}")
    pairs = parse_overrides(overrides)
    task_name = raw.get("task", DEFAULTS["task"])
    for k, v in pairs:
        if k == "task":
            task_name = v
    task = get_task(task_name)
    cfg = copy.deepcopy(DEFAULTS)
    task_defaults = getattr(task, "default_config", None)
    if callable(task_defaults):
        cfg = deep_merge(cfg, task_defaults() or {})
    cfg = deep_merge(cfg, raw)
    cfg = apply_overrides(cfg, pairs)
    finalize = getattr(task, "finalize_config", None)
    if callable(finalize):
        cfg = finalize(cfg) or cfg
    return cfg


def dump_config(cfg: Dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)
