"""Training configs: typed sections with their defaults, YAML presets and ``--set a.b=value`` overrides.

The defaults live in one place, the dataclasses below (:class:`TrainConfig` and its sections): the
trainer reads ``TrainConfig.from_dict(cfg).train.ema.decay`` and never repeats a default.
:func:`resolve_config` merges, in order: those defaults (:data:`DEFAULTS` is their dict form), the
task's own defaults (``task.default_config()``), the preset file and the overrides, checks every
value's type and returns the nested dict that ``config.yaml`` holds and tasks and suites read.

Overrides use the package's one settings grammar (:mod:`rpc_attention.overrides`): a key must exist
after the merge, except below the open sections :data:`OPEN_SECTIONS` (``model.kwargs`` takes any
model keyword); an unknown key is a ``ValueError`` naming it and its closest known neighbours.
Keys a task adds to a section (``data.val_size``, ``train.mixup``, ...) are kept in that section's
``extra`` dict of the typed view; the task owns and reads them. Every key of a resolved config must be
one the defaults or the task declare (its ``default_config()``, or ``optional_keys`` for keys read
without a default): a key nobody reads, in a preset, a run's ``config.yaml`` or an override, is a
``ValueError`` naming it and its closest known neighbours, so a setting is never silently ignored.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import yaml

from ..files import read_yaml_mapping
from ..overrides import apply_assignments, flatten_keys, parse_assignments, parse_number, unknown_key

_log = logging.getLogger(__name__)

__all__ = [
    "TrainConfig", "ModelConfig", "DataConfig", "OptimConfig", "ScheduleConfig", "LoopConfig", "EMAConfig",
    "EvalConfig", "DEFAULTS", "OPEN_SECTIONS", "PRESET_DIR", "list_presets", "load_preset", "parse_overrides",
    "apply_overrides", "resolve_config", "resolve_typed_config", "deep_merge", "dump_config", "load_config_file", "check_known_keys",
]

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"

# Sections whose children may be created by overrides (keyword dicts). Only ``model.kwargs`` is free
# (the model's constructor checks it); ``data.augment`` keys must be ones the task declares.
OPEN_SECTIONS = ("model.kwargs", "data.augment")
FREE_SECTIONS = ("model.kwargs",)


@dataclass(frozen=True)
class ModelConfig:
    name: Optional[str] = None  # a timm / Symlm model name; the task says which
    kwargs: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of the model constructor
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    name: Optional[str] = None
    root: Optional[str] = None
    num_workers: int = 0
    mean: Optional[List[float]] = None  # None: the data set's own (filled by the task)
    std: Optional[List[float]] = None
    num_classes: Optional[int] = None
    in_chans: Optional[int] = None
    img_size: Optional[int] = None
    augment: Dict[str, Any] = field(default_factory=dict)
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"  # any timm optimizer name
    lr: float = 1e-3
    lr_scale_batch: Optional[float] = None  # lr is scaled by global batch / lr_scale_batch when set
    weight_decay: float = 0.05
    momentum: float = 0.9
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    clip_grad: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = "cosine"  # any timm scheduler name
    warmup_epochs: float = 0.0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_rate: Optional[float] = None  # poly: the power; step: the factor
    decay_epochs: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EMAConfig:
    enabled: bool = False
    decay: float = 0.99996  # DeiT's value, per optimizer step


AMP_MODES = (False, True, "bf16", "fp16")


@dataclass(frozen=True)
class LoopConfig:
    """The ``train`` section: length, batch, device and bookkeeping of the training loop."""

    epochs: int = 1
    max_steps: Optional[int] = None
    batch_size: int = 64  # global, over all processes
    seed: int = 0
    device: str = "auto"  # auto: cuda when available (the --device flag sets it)
    amp: Union[bool, str] = False  # false, true (= bf16), bf16 or fp16 (CUDA only)
    compile: bool = False
    deterministic: bool = False
    threads: Optional[int] = None  # torch intra-op threads; None or 0: torch's default
    save_every: int = 500  # steps between checkpoints
    keep_checkpoints: int = 2
    keep_best: bool = False  # end with the weights of the best validation epoch (the task's primary metric)
    log_every: int = 50
    eval_every: int = 1  # epochs between validations; 0: never
    callbacks: List[str] = field(default_factory=list)  # epoch-end callbacks by registered name
    repeated_aug: int = 1
    ema: EMAConfig = field(default_factory=EMAConfig)
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.amp not in AMP_MODES:
            raise ValueError(f"train.amp: expected one of {', '.join(map(str, AMP_MODES))}, got {self.amp!r}")


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int = 256
    final_split: Optional[str] = "test"  # evaluated once after training; None: skip
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    """A whole training config, typed. Build it with :meth:`from_dict`; :meth:`to_dict` gives the file form."""

    task: str = "classification"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @classmethod
    def from_dict(cls, cfg: Dict[str, Any]) -> TrainConfig:
        """The typed view of a config dict; a ValueError names the first key whose value has the wrong type."""
        return _from_dict(cls, cfg, "")

    def to_dict(self) -> Dict[str, Any]:
        """The nested dict (sections' ``extra`` keys merged back in)."""
        return _to_dict(self)


def _check_type(value: Any, hint: Any, key: str) -> Any:
    """``value`` as type ``hint`` (int, float, bool, str, Optional, List, Dict); ValueError naming ``key``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:  # Optional[X], Union[bool, str]
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_type(value, arg, key)
            except ValueError as exc:
                errors.append(str(exc).split(": expected ", 1)[-1].split(", got")[0])
        raise ValueError(f"{key}: expected {' or '.join(errors)}, got {value!r}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        return [_check_type(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        return parse_number(value, key)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _from_dict(cls: type, raw: Dict[str, Any], prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
    values: Dict[str, Any] = {}
    for name in names:
        if name not in raw:
            continue
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _from_dict(hint, raw[name] or {}, f"{prefix}{name}.")
        else:
            values[name] = _check_type(raw[name], hint, f"{prefix}{name}")
    extra = {k: v for k, v in raw.items() if k not in names}
    if extra and "extra" not in hints:
        raise ValueError(f"unknown config key(s) {', '.join(prefix + k for k in extra)}")
    if "extra" in hints:
        values["extra"] = extra
    return cls(**values)


def _to_dict(obj: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "extra":
            out.update(copy.deepcopy(value))
        elif dataclasses.is_dataclass(value):
            out[f.name] = _to_dict(value)
        else:
            out[f.name] = copy.deepcopy(value)
    return out


DEFAULTS: Dict[str, Any] = TrainConfig().to_dict()  # the defaults' dict form (read-only by convention)


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


def parse_overrides(items: Optional[Iterable[str]]) -> List[Tuple[str, Any]]:
    """``["a.b=1", "c=[1,2]"]`` -> ``[("a.b", 1), ("c", [1, 2])]`` (values parsed as YAML)."""
    return parse_assignments(items, "--set")


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[Tuple[str, Any]]) -> Dict[str, Any]:
    """Apply ``(dotted_key, value)`` pairs; unknown keys raise ``ValueError`` naming the key."""
    return apply_assignments(cfg, overrides, OPEN_SECTIONS)


# Saved run configs written before a setting was renamed: old dotted key -> its name today.
_RENAMED_IN_RUN_CONFIGS = {"train.steps": "train.max_steps"}


def _migrate_run_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """``cfg`` (a run's ``config.yaml``) with renamed settings under their current names."""
    for old, new in _RENAMED_IN_RUN_CONFIGS.items():
        (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
        section = cfg.get(osec)
        if isinstance(section, dict) and okey in section:
            value = section.pop(okey)
            if value is not None:
                cfg.setdefault(nsec, {})[nkey] = value
    return cfg


def _declared_keys(task: Any) -> set:
    """The dotted keys :data:`DEFAULTS` and ``task`` declare (its ``default_config()`` and ``optional_keys``)."""
    from .callbacks import callback_config_keys

    defaults = getattr(task, "default_config", None)
    known = set(flatten_keys(deep_merge(DEFAULTS, defaults() or {} if callable(defaults) else {})))
    return known | set(getattr(task, "optional_keys", ())) | set(callback_config_keys())


def _undeclared(key: str, known: set) -> bool:
    parent = key.rpartition(".")[0]
    return key not in known and not any(parent == s or parent.startswith(s + ".") for s in FREE_SECTIONS)


def check_known_keys(cfg: Dict[str, Any], task: Any, source: str = "config:") -> None:
    """ValueError naming the first key of ``cfg`` that neither the defaults nor ``task`` declare.

    Declared: the keys of :data:`DEFAULTS`, of ``task.default_config()`` and ``task.optional_keys``;
    anything below ``model.kwargs`` (:data:`FREE_SECTIONS`) is the model constructor's to check.
    """
    known = _declared_keys(task)
    for key in flatten_keys(cfg):
        if _undeclared(key, known):
            raise unknown_key(key, known, "config key", source, " (no code reads it)")


def _check_callback_keys(cfg: Dict[str, Any]) -> None:
    """ValueError naming a key of a callback that the run (``cfg``, resolved) does not run."""
    from .callbacks import callback_config_keys, resolve_callbacks

    listed = (cfg.get("train") or {}).get("callbacks")
    running = {name for name, _ in resolve_callbacks(listed if isinstance(listed, list) else [])}
    for key, name in callback_config_keys().items():
        if name not in running and _get(cfg, key) is not None:
            raise ValueError(f"{key} is read by the {name} callback, which this run does not run "
                             f"(--set train.callbacks=[{name}])")


def _check_override_keys(keys: Iterable[str], task: Any) -> None:
    """ValueError naming the first ``--set`` key (as written) that is not declared, or lies in an undeclared section."""
    known = _declared_keys(task)
    for key in keys:
        parts = key.split(".")
        if any(_undeclared(".".join(parts[:i]), known) for i in range(1, len(parts) + 1)):
            raise unknown_key(key, known, "config key", "--set", " (no code reads it)")


# timm's schedulers that read schedule.decay_rate / schedule.decay_epochs (create_scheduler_v2)
_DECAY_RATE_SCHEDULES = ("step", "multistep", "plateau", "poly")
_DECAY_EPOCHS_SCHEDULES = ("step", "multistep")


def check_effective(cfg: Dict[str, Any], task: Any, task_name: str) -> None:
    """ValueError naming a setting that would have no effect: one the task lists in ``ignored_keys``
    (typed keys it does not read) set away from its default, or a decay option the scheduler ignores."""
    for key in getattr(task, "ignored_keys", ()):
        value, default = _get(cfg, key), _get(DEFAULTS, key)
        if value != default:
            raise ValueError(f"{key}={value!r}: the {task_name} task does not read it (leave it at {default!r})")
    loop = cfg.get("train") or {}
    if loop.get("keep_best") and not loop.get("eval_every"):
        raise ValueError("train.keep_best=true selects by the validation metric, but train.eval_every=0 never "
                         "validates (set train.eval_every=1)")
    sched = cfg.get("schedule") or {}
    name = str(sched.get("name") or "").lower()
    for key, names in (("decay_rate", _DECAY_RATE_SCHEDULES), ("decay_epochs", _DECAY_EPOCHS_SCHEDULES)):
        if sched.get(key) is not None and name not in names:
            raise ValueError(f"schedule.{key}={sched[key]!r} has no effect with schedule.name={name!r} "
                             f"(it is read by {', '.join(names)})")


def _get(tree: Dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _with_optional_keys(cfg: Dict[str, Any], keys: Iterable[str], task: Any) -> Dict[str, Any]:
    """``cfg`` with a null entry for each of ``keys`` the task declares without a default, so --set can set it."""
    from .callbacks import callback_config_keys

    for key in keys:
        if key in getattr(task, "optional_keys", ()) or key in callback_config_keys():
            section, _, leaf = key.rpartition(".")
            node = cfg
            for part in section.split("."):
                node = node.setdefault(part, {})
            node.setdefault(leaf, None)
    return cfg


def _drop_derived(cfg: Dict[str, Any], keys: List[str], task: Any) -> Dict[str, Any]:
    """``cfg`` without the values the task derives from an overridden key (its ``derived_keys``: source
    -> derived dotted key), unless that one is overridden too, so the task derives them again: a
    resumed run's ``--set data.num_classes=N`` reaches ``model.kwargs.num_classes``."""
    for source, derived in (getattr(task, "derived_keys", None) or {}).items():
        if source in keys and derived not in keys:
            section, _, leaf = derived.rpartition(".")
            node = _get(cfg, section)
            if isinstance(node, dict):
                node.pop(leaf, None)
    return cfg


def _follow_data_set(cfg: Dict[str, Any], keys: List[str], task: Any, rerun: bool) -> Dict[str, Any]:
    """``cfg`` with the preset's values of keys only other data sets read (the task's ``data_set_keys``:
    dotted key -> (data set names, default)) back at their defaults when ``--set data.name`` picks a data
    set that does not read them, unless they are set too: a Fashion-MNIST preset's ``data.val_size``
    does not follow it to an ImageFolder tree, which validates on its ``val/`` folder. A saved run config
    (``rerun``) is cleaned the same way: runs made before such keys were refused had them, unread."""
    if "data.name" not in keys and not rerun:
        return cfg
    name = str(_get(cfg, "data.name") or "").lower()
    for key, (names, default) in (getattr(task, "data_set_keys", None) or {}).items():
        section, _, leaf = key.rpartition(".")
        node = _get(cfg, section)
        if key in keys or name in names or not isinstance(node, dict) or node.get(leaf) in (None, default):
            continue
        _log.info("%s=%r is not read by data.name=%s: back to %r", key, node[leaf], name, default)
        node[leaf] = default
    return cfg


def resolve_config(preset: Optional[str] = None, overrides: Iterable[str] = (),
                   base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Defaults + task defaults + preset (or ``base``) + ``--set`` overrides -> a full config dict."""
    return resolve_typed_config(preset, overrides, base)[0]


def resolve_typed_config(preset: Optional[str] = None, overrides: Iterable[str] = (),
                         base: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Any], TrainConfig]:
    """:func:`resolve_config`'s dict and its typed view, built once from the final dict.

    The user's values are type-checked before the task fills in its derived keys (so a bad value is
    named before task code reads it); the typed view is built from the final dict, after that.
    """
    from .tasks import get_task

    raw = load_preset(preset) if preset else _migrate_run_config(copy.deepcopy(base or {}))
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
    check_known_keys(raw, task, f"preset {preset}:" if preset else "run config:")
    _check_override_keys([k for k, _ in pairs], task)
    cfg = deep_merge(cfg, raw)
    cfg = _drop_derived(cfg, [k for k, _ in pairs], task)
    cfg = apply_overrides(_with_optional_keys(cfg, [k for k, _ in pairs], task), pairs)
    cfg = _follow_data_set(cfg, [k for k, _ in pairs], task, rerun=not preset)
    TrainConfig.from_dict(cfg)  # type errors name the key before the task reads it
    finalize = getattr(task, "finalize_config", None)
    if callable(finalize):
        cfg = finalize(cfg) or cfg
    check_known_keys(cfg, task, "config:")
    _check_callback_keys(cfg)
    check_effective(cfg, task, task_name)
    return cfg, TrainConfig.from_dict(cfg)


def dump_config(cfg: Dict[str, Any]) -> str:
    """The YAML text of ``cfg`` (as written to ``config.yaml``)."""
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)
