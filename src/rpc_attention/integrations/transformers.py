"""Hugging Face ``transformers`` integration: an ``attn_implementation="rpc"`` backend.

    import rpc_attention.integrations.transformers as rpc_hf
    rpc_hf.register(rpc_layers=[0], n_iter=6, lambd=4.0)          # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc")   # or model.set_attn_implementation("rpc")

:func:`register` adds the attention function ``"rpc"`` to ``transformers.AttentionInterface`` and
its mask function to ``transformers.AttentionMaskInterface`` (without the latter transformers hands
a custom backend no mask at all, not even the causal or padding mask). Layers selected by
``rpc_layers`` (matched against ``module.layer_idx``) run asymmetric RPC attention
(:mod:`rpc_attention.integrations._core`); all other layers run the model's ``sdpa`` attention.

Options live in the model's config as attributes ``rpc_layers``, ``rpc_n_iter``, ``rpc_lambd``,
``rpc_threshold``, ``rpc_mu_mode``, ``rpc_model_dim``, ``rpc_tol``, ``rpc_lowrank``, ``rpc_shrink``,
``rpc_dual_step``, ``rpc_row_lambd``, ``rpc_clean_queries``,
``rpc_key_mode`` (set them as config keyword arguments, e.g. ``LlamaConfig(..., rpc_layers="all")``,
or with :func:`configure`). The keywords given to :func:`register` are defaults for the options a
config does not set; they are written into the config when a model is created with (or switched
to) ``"rpc"``, so ``save_pretrained`` stores every option and a reloaded model runs the same
settings whatever ``register`` was given in the new process. Later :func:`register` calls do not
change models that exist already.

At that same moment (the end of the model's ``post_init`` and of ``set_attn_implementation``,
which :func:`register` wraps while ``"rpc"`` is registered; transformers has no hook of its own for
a custom attention function) the options are checked against the model: unknown ``rpc_*`` config
keys, bad values, ``rpc_layers`` naming layers the model does not have, a global ``mu_mode`` or a
``tol`` on a causal layer and sliding-window layers selected for RPC each raise ``ValueError``. Attention
modules without ``layer_idx`` (e.g. ViT, CLIP) are numbered then in module order (attribute
``rpc_layer_idx``), so a list ``rpc_layers`` selects them, also after a reload.
"""

from __future__ import annotations

import difflib
import functools
import weakref
from typing import Any, Optional

import torch

from .. import functional as RF
from ._core import (
    DEFAULT_OPTIONS,
    AsymmetricRPCCache,
    asymmetric_rpc_attention,
    cached_asymmetric_rpc_attention,
    check_options,
    layer_selected,
)

__all__ = ["NAME", "register", "unregister", "configure", "prepare", "rpc_attention_forward", "rpc_mask",
           "is_registered", "decoding_cache_bytes", "TRANSFORMERS_RANGE"]

NAME = "rpc"
TRANSFORMERS_RANGE = (">=5.0", "<5.25")  # tested with 5.24; keep in sync with pyproject's [hf] extra

_OPTION_KEYS = tuple(k for k in DEFAULT_OPTIONS)  # rpc_layers, n_iter, lambd, ...
_defaults: dict = dict(DEFAULT_OPTIONS)
# transformers.PreTrainedModel methods wrapped while "rpc" is registered (restored by unregister)
_wrapped_methods: dict = {}


def _config_key(name: str) -> str:
    return name if name.startswith("rpc_") else "rpc_" + name


_CONFIG_KEYS = {_config_key(k): k for k in _OPTION_KEYS}  # config attribute -> option name


def _option_name(key: str) -> str:
    """Option name of a keyword given as ``n_iter`` or ``rpc_n_iter``."""
    return key[4:] if key.startswith("rpc_") and key != "rpc_layers" else key


def _check_version() -> None:
    from ..extras import import_optional

    transformers = import_optional("transformers", "rpc_attention.integrations.transformers")
    from packaging.version import Version  # a dependency of transformers

    ver = Version(transformers.__version__)
    if not (Version("5.0") <= ver < Version("5.25")):
        raise ImportError(
            f"rpc_attention.integrations.transformers supports transformers >=5.0,<5.25, found {transformers.__version__}"
        )


def rpc_mask(*args, **kwargs):
    """Mask function registered for ``"rpc"``: transformers' sdpa boolean mask (True = attend),
    always materialised for causal layers (no ``is_causal`` shortcut), ``None`` only for
    bidirectional layers without padding."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _layer_index(module) -> Optional[int]:
    idx = getattr(module, "layer_idx", None)
    if idx is None:
        idx = getattr(module, "rpc_layer_idx", None)
    return None if idx is None else int(idx)


def _config_options(cfg) -> dict:
    """The RPC options a config sets (option name -> value, not yet validated). An ``rpc_*``
    attribute that is not an option raises: a misspelt key would otherwise be ignored."""
    found = {}
    for attr, value in vars(cfg).items():
        if not attr.startswith("rpc_"):
            continue
        if attr not in _CONFIG_KEYS:
            close = difflib.get_close_matches(attr, list(_CONFIG_KEYS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown RPC config key {attr!r} on {type(cfg).__name__}: {hint}"
                             f"the keys are {sorted(_CONFIG_KEYS)}")
        found[_CONFIG_KEYS[attr]] = value
    return found


def _options_for(module) -> dict:
    opts = dict(_defaults)
    cfg = getattr(module, "config", None)
    if cfg is not None:
        opts.update(_config_options(cfg))
    return check_options(opts)


def _is_cross(module) -> bool:
    return bool(getattr(module, "is_cross_attention", False)) or "cross" in type(module).__name__.lower()


def rpc_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs,
):
    """The ``"rpc"`` attention function (transformers' calling convention: q/k/v ``(B, H, N, d)``,
    returns ``(attn_output (B, Nq, H, d), None)``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    opts = _options_for(module)
    layers = opts.pop("rpc_layers")
    idx = _layer_index(module)
    if layers != "all" and idx is None and layers:
        raise ValueError(
            f"{type(module).__name__} has no layer_idx, so rpc_layers={list(layers)} cannot select it; call "
            "rpc_attention.integrations.transformers.configure(model, ...) to number such layers, or use rpc_layers='all'"
        )
    if not layer_selected(layers, idx):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise _sliding_window_error(module, kwargs["sliding_window"])
    for unsupported in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"RPC attention does not support {unsupported!r} ({type(module).__name__}); "
                             "leave this layer out of rpc_layers")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and not _is_cross(module)
    if causal and opts["tol"] is not None:
        raise _causal_tol_error(module)
    decoding = getattr(module, "_rpc_decoding", None)
    if causal and decoding is not None and dropout == 0.0:
        out = _cached_forward(module, decoding, query, key, value, attention_mask, scaling, opts)
        return out.transpose(1, 2).contiguous(), None
    out = asymmetric_rpc_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, dropout_p=dropout, scale=scaling,
        same_tokens=not _is_cross(module), **opts,
    )
    return out.transpose(1, 2).contiguous(), None


# Cached decoding. PAP's per-layer decoding state (functional.PAPCache and the cleaned keys) lives
# beside the model's cache: keyed by the cache object, then by layer, together with the key tensor
# the model's cache layer held after the step that made it. A forward pre-hook (added by prepare)
# hands the attention function the model's cache and its layer's keys before the update; when those
# keys are no longer the tensor of the last step (beam-search reordering, cropping, another cache),
# PAP is run again over the whole prefix (exact, the cost of the uncached pass) and the state renewed.
_DECODING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_layer_keys(cache, idx: Optional[int]):
    """The keys the model's cache holds for layer ``idx`` before this forward's update, or None."""
    cache = getattr(cache, "self_attention_cache", cache)
    layers = getattr(cache, "layers", None)
    if idx is None or layers is None or idx >= len(layers):
        return None
    return getattr(layers[idx], "keys", None)


def _remember_cache(module, args, kwargs):
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    module._rpc_decoding = None if cache is None else (cache, _cache_layer_keys(cache, _layer_index(module)))


def _forget_cache(module, args, kwargs, output):
    module._rpc_decoding = None


def _add_cache_hooks(module) -> None:
    if getattr(module, "_rpc_cache_hooks", None) is None:
        module._rpc_decoding = None
        module._rpc_cache_hooks = (module.register_forward_pre_hook(_remember_cache, with_kwargs=True),
                                   module.register_forward_hook(_forget_cache, with_kwargs=True, always_call=True))


def _cached_forward(module, decoding, query, key, value, attention_mask, scaling, opts: dict) -> torch.Tensor:
    """Causal self-attention RPC over the model's cache with the layer's decoding state."""
    cache, keys_before = decoding
    try:
        states = _DECODING.setdefault(cache, {})
    except TypeError:  # a cache object that cannot be weakly referenced: no state, full pass
        states = {}
    idx = _layer_index(module)
    held = states.get(idx)
    state = None
    if held is not None and keys_before is not None:
        state = held[1] if held[0] is keys_before else _reordered(held[0], keys_before, held[1])
    pap_opts = {k: v for k, v in opts.items() if k != "tol"}
    out, state = cached_asymmetric_rpc_attention(query, key, value, state, attn_mask=attention_mask, scale=scaling,
                                                 **pap_opts)
    states[idx] = (key, state)
    return out


_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _row_checksums(keys: torch.Tensor, n: int) -> torch.Tensor:
    """An integer checksum per batch row of the first ``n`` key positions: the keys' bits read as
    integers, weighted by position, summed with wrap-around. Exact and independent of summation order."""
    ints = keys[:, :, :n].contiguous().view(_INT_VIEW[keys.element_size()]).to(torch.int64)
    pos = torch.arange(1, n + 1, device=keys.device).view(1, 1, n, 1)
    return (ints * pos).flatten(1).sum(dim=1)


def _reordered(old_keys: torch.Tensor, new_keys: torch.Tensor, state: AsymmetricRPCCache):
    """The decoding state for the model cache's ``new_keys`` when they are ``old_keys`` with their
    batch rows selected (beam search's ``reorder_cache``): the state with the same rows selected,
    found by checksum and confirmed by exact comparison; None if the keys are anything else."""
    n = state.length
    if old_keys.shape[2] < n or new_keys.shape[2] < n or old_keys.shape[1:] != new_keys.shape[1:]:
        return None
    match = _row_checksums(new_keys, n)[:, None] == _row_checksums(old_keys, n)[None, :]
    if not bool(match.any(dim=1).all()):
        return None
    index = match.int().argmax(dim=1)
    if not torch.equal(new_keys[:, :, :n], old_keys[:, :, :n].index_select(0, index)):
        return None
    state.reorder(index)
    return state


def decoding_cache_bytes(cache) -> int:
    """Bytes of the RPC decoding state kept beside the model's ``cache`` (0 if none)."""
    try:
        states = _DECODING.get(cache, {})
    except TypeError:
        return 0
    return sum(state.nbytes() for _, state in states.values() if isinstance(state, AsymmetricRPCCache))


def _sliding_window(module) -> Optional[int]:
    """The attention window of ``module``, or None: its own ``sliding_window`` attribute (Qwen2,
    Gemma...), else its config's (Mistral), per layer where the config lists ``layer_types``."""
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    cfg = getattr(module, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return None
    types, idx = getattr(cfg, "layer_types", None), getattr(module, "layer_idx", None)
    if types is not None and idx is not None and idx < len(types):
        return window if types[idx] == "sliding_attention" else None
    return window


def _sliding_window_error(module, window: int) -> ValueError:
    return ValueError(
        f"{type(module).__name__} (layer {_layer_index(module)}) is a sliding-window attention layer "
        f"(sliding_window={window}), which RPC does not run: the sliding-window KV cache drops the keys PAP "
        "needs, so cached decoding would differ from the full forward. Leave this layer out of rpc_layers, "
        f"or build the model with sliding_window=None (the same model for sequences up to {window} tokens)"
    )


def _causal_tol_error(module) -> ValueError:
    return ValueError(
        f"rpc_tol is set but {type(module).__name__} (layer {_layer_index(module)}) is causal: tol stops PAP on a "
        "norm over the whole sequence, so earlier positions would depend on later tokens and cached decoding "
        "would differ from the full forward. Use rpc_tol=None for causal layers"
    )


def _number_unindexed(leaves) -> None:
    """Give attention modules without ``layer_idx`` their rank among such modules (``rpc_layer_idx``)."""
    n = 0
    for mod in leaves:
        if getattr(mod, "layer_idx", None) is None:
            mod.rpc_layer_idx = n
            n += 1


def _write_defaults(cfg) -> None:
    """Write the process-wide defaults for the options ``cfg`` does not set (JSON-ready values)."""
    present = vars(cfg)
    for key in _OPTION_KEYS:
        if _config_key(key) not in present:
            value = _defaults[key]
            setattr(cfg, _config_key(key), list(value) if isinstance(value, tuple) else value)


def _check_against_model(cfg, modules) -> None:
    """Check the options of ``cfg`` against the attention ``modules`` that read it."""
    opts = check_options({**_defaults, **_config_options(cfg)})
    layers = opts["rpc_layers"]
    available = sorted({i for i in map(_layer_index, modules) if i is not None})
    missing = [] if layers == "all" else [i for i in layers if i not in available]
    if missing:
        raise ValueError(f"rpc_layers={list(layers)} names layer(s) {missing} that this model does not have: its "
                         f"attention layers are {available} ({type(cfg).__name__})")
    for mod in modules:
        if not layer_selected(layers, _layer_index(mod)):
            continue
        causal = bool(getattr(mod, "is_causal", False)) and not _is_cross(mod)
        RF.check_pap_options(n_iter=opts["n_iter"], lambd=opts["lambd"], threshold=opts["threshold"],
                             mu_mode=opts["mu_mode"], is_causal=causal, tol=opts["tol"], model_dim=opts["model_dim"],
                             lowrank=opts["lowrank"], shrink=opts["shrink"], dual_step=opts["dual_step"],
                             row_lambd=opts["row_lambd"])
        if causal and opts["tol"] is not None:
            raise _causal_tol_error(mod)
        window = _sliding_window(mod)
        if window is not None:
            raise _sliding_window_error(mod, window)


def prepare(model: torch.nn.Module, *, every_config: bool = False) -> torch.nn.Module:
    """Make ``model`` ready for RPC and check its options (raises ``ValueError``).

    Numbers attention modules without ``layer_idx``; for every config that an ``"rpc"`` attention
    module reads (every config with ``every_config``), writes the :func:`register` defaults it does
    not set and checks the options against the model. Runs by itself when a model is created with
    or switched to ``"rpc"``; call it after editing ``rpc_*`` config attributes by hand.
    """
    leaves = list(_attention_leaves(model))
    _number_unindexed(leaves)
    for mod in leaves:
        _add_cache_hooks(mod)
    groups: dict = {}
    for mod in leaves:
        cfg = getattr(mod, "config", None)
        if cfg is None or not (every_config or getattr(cfg, "_attn_implementation", None) == NAME):
            continue
        groups.setdefault(id(cfg), (cfg, []))[1].append(mod)
    for cfg, modules in groups.values():
        _write_defaults(cfg)
        _check_against_model(cfg, modules)
    return model


def _uses_rpc(model: torch.nn.Module) -> bool:
    return any(getattr(getattr(m, "config", None), "_attn_implementation", None) == NAME for m in model.modules())


def _wrap_model_methods() -> None:
    """Run :func:`prepare` at the end of ``PreTrainedModel.post_init`` (model creation, also in
    ``from_pretrained``) and of ``set_attn_implementation``, for models that use ``"rpc"``."""
    from transformers import PreTrainedModel

    if _wrapped_methods:
        return
    def then_prepare(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if _uses_rpc(self):
                prepare(self)
            return result

        return wrapper

    for name in ("post_init", "set_attn_implementation"):
        _wrapped_methods[name] = getattr(PreTrainedModel, name)
        setattr(PreTrainedModel, name, then_prepare(_wrapped_methods[name]))


def _unwrap_model_methods() -> None:
    from transformers import PreTrainedModel

    for name, original in _wrapped_methods.items():
        setattr(PreTrainedModel, name, original)
    _wrapped_methods.clear()


def register(**defaults) -> None:
    """Register ``"rpc"`` with ``AttentionInterface`` and ``AttentionMaskInterface``.

    Keywords (``rpc_layers``, ``n_iter``, ``lambd``, ``threshold``, ``mu_mode``, ``model_dim``,
    ``tol``, ``clean_queries``, ``key_mode``) set process-wide defaults for the options a model's
    config does not set; they are written into the config of each model created with (or switched
    to) ``"rpc"`` afterwards. Calling it again replaces the defaults given, for later models.
    """
    _check_version()
    from transformers import AttentionInterface, AttentionMaskInterface

    defaults = {_option_name(k): v for k, v in defaults.items()}
    merged = dict(_defaults)
    merged.update(defaults)
    checked = check_options(merged)
    _defaults.clear()
    _defaults.update(checked)
    AttentionInterface.register(NAME, rpc_attention_forward)
    AttentionMaskInterface.register(NAME, rpc_mask)
    _wrap_model_methods()


def is_registered() -> bool:
    from transformers import AttentionInterface, AttentionMaskInterface

    return NAME in AttentionInterface._global_mapping and NAME in AttentionMaskInterface._global_mapping


def unregister() -> None:
    """Remove ``"rpc"`` from both interfaces, restore ``PreTrainedModel``'s methods and reset the defaults."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface._global_mapping.pop(NAME, None)
    AttentionMaskInterface._global_mapping.pop(NAME, None)
    _unwrap_model_methods()
    _defaults.clear()
    _defaults.update(DEFAULT_OPTIONS)


def _attention_leaves(model: torch.nn.Module):
    """Innermost modules whose class name ends in 'Attention' (the ones calling the interface)."""
    for mod in model.modules():
        if not type(mod).__name__.endswith("Attention"):
            continue
        if any(type(c).__name__.endswith("Attention") for c in mod.modules() if c is not mod):
            continue
        yield mod


def _model_configs(model: torch.nn.Module) -> list:
    configs: list = []
    for mod in [model, *model.modules()]:
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict") and all(cfg is not c for c in configs):
            configs.append(cfg)
    return configs


def configure(model: torch.nn.Module, *, set_implementation: bool = True, **options) -> torch.nn.Module:
    """Write RPC options into every config of ``model`` and switch it to ``attn_implementation="rpc"``.

    Keywords as :func:`register` (``rpc_layers``, ``n_iter``, ``lambd``, ...); options not given
    keep the config's values. The result is checked against the model (:func:`prepare`); on
    ``ValueError`` the configs are left as they were. Registers ``"rpc"`` if needed. Returns the model.
    """
    if not is_registered():
        register()
    options = {_option_name(k): v for k, v in options.items()}
    checked = check_options({**_defaults, **options})
    given = {_config_key(k): list(checked[k]) if isinstance(checked[k], tuple) else checked[k] for k in options}
    configs = _model_configs(model)
    before = [{k: v for k, v in vars(cfg).items() if k.startswith("rpc_")} for cfg in configs]
    for cfg in configs:
        for key, value in given.items():
            setattr(cfg, key, value)
    try:
        prepare(model, every_config=True)
    except ValueError:
        for cfg, old in zip(configs, before):
            for key in [k for k in vars(cfg) if k.startswith("rpc_")]:
                delattr(cfg, key)
            for key, value in old.items():
                setattr(cfg, key, value)
        raise
    if set_implementation:
        hf_model: Any = model  # a transformers PreTrainedModel
        hf_model.set_attn_implementation(NAME)
    return model
