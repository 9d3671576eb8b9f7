"""Hugging Face ``transformers`` integration: an ``attn_implementation="rpc"`` backend.

    import rpc_attention.integrations.transformers as rpc_hf
    rpc_hf.register(rpc_layers=[0], n_iter=6, lambd=4.0)          # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc")   # or model.set_attn_implementation("rpc")

:func:`register` adds the attention function ``"rpc"`` to ``transformers.AttentionInterface`` and
its mask function to ``transformers.AttentionMaskInterface`` (without the latter transformers hands
a custom backend no mask at all, not even the causal or padding mask). Layers selected by
``rpc_layers`` (matched against ``module.layer_idx``) run asymmetric RPC attention
(:mod:`rpc_attention.integrations._core`); all other layers run the model's ``sdpa`` attention.

Options, most specific first: attributes ``rpc_layers``, ``rpc_n_iter``, ``rpc_lambd``,
``rpc_threshold``, ``rpc_mu_mode``, ``rpc_model_dim``, ``rpc_tol``, ``rpc_clean_queries``,
``rpc_key_mode`` on the layer's config (set them with :func:`configure` or as config keyword
arguments, e.g. ``LlamaConfig(..., rpc_layers="all", rpc_n_iter=2)``), then the keywords given to
:func:`register`, then the defaults (``rpc_layers=[0]``, ``n_iter=6``, ``lambd=4``).

Attention modules without ``layer_idx`` (e.g. ViT, CLIP): with ``rpc_layers="all"`` every such
layer runs RPC; otherwise call :func:`configure` on the model, which numbers such modules in
module order (attribute ``rpc_layer_idx``); an un-numbered module with a list ``rpc_layers``
raises ``ValueError``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._core import DEFAULT_OPTIONS, asymmetric_rpc_attention, check_options, layer_selected

__all__ = ["NAME", "register", "unregister", "configure", "rpc_attention_forward", "rpc_mask", "is_registered",
           "TRANSFORMERS_RANGE"]

NAME = "rpc"
TRANSFORMERS_RANGE = (">=5.0", "<5.25")  # tested with 5.24; keep in sync with pyproject's [hf] extra

_OPTION_KEYS = tuple(k for k in DEFAULT_OPTIONS)  # rpc_layers, n_iter, lambd, ...
_defaults: dict = dict(DEFAULT_OPTIONS)


def _config_key(name: str) -> str:
    return name if name.startswith("rpc_") else "rpc_" + name


def _check_version() -> None:
    import transformers
    from packaging.version import Version

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


def _options_for(module) -> dict:
    opts = dict(_defaults)
    cfg = getattr(module, "config", None)
    if cfg is not None:
        for key in _OPTION_KEYS:
            ck = _config_key(key)
            if hasattr(cfg, ck):
                opts[key] = getattr(cfg, ck)
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
    for unsupported in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"RPC attention does not support {unsupported!r} ({type(module).__name__}); "
                             "leave this layer out of rpc_layers")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and not _is_cross(module)
    out = asymmetric_rpc_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, dropout_p=dropout, scale=scaling,
        same_tokens=not _is_cross(module), **opts,
    )
    return out.transpose(1, 2).contiguous(), None


def register(**defaults) -> None:
    """Register ``"rpc"`` with ``AttentionInterface`` and ``AttentionMaskInterface``.

    Keywords (``rpc_layers``, ``n_iter``, ``lambd``, ``threshold``, ``mu_mode``, ``model_dim``,
    ``tol``, ``clean_queries``, ``key_mode``) set process-wide defaults, overridden per model by
    config attributes (:func:`configure`). Calling it again replaces the defaults given.
    """
    _check_version()
    from transformers import AttentionInterface, AttentionMaskInterface

    defaults = {k[4:] if k.startswith("rpc_") and k != "rpc_layers" else k: v for k, v in defaults.items()}
    merged = dict(_defaults)
    merged.update(defaults)
    checked = check_options(merged)
    _defaults.clear()
    _defaults.update(checked)
    AttentionInterface.register(NAME, rpc_attention_forward)
    AttentionMaskInterface.register(NAME, rpc_mask)


def is_registered() -> bool:
    from transformers import AttentionInterface, AttentionMaskInterface

    return NAME in AttentionInterface._global_mapping and NAME in AttentionMaskInterface._global_mapping


def unregister() -> None:
    """Remove ``"rpc"`` from both interfaces and reset the defaults."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface._global_mapping.pop(NAME, None)
    AttentionMaskInterface._global_mapping.pop(NAME, None)
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


def configure(model: torch.nn.Module, *, set_implementation: bool = True, **options) -> torch.nn.Module:
    """Write RPC options into every config of ``model`` and switch it to ``attn_implementation="rpc"``.

    Keywords as :func:`register` (``rpc_layers``, ``n_iter``, ``lambd``, ...). Attention modules
    without ``layer_idx`` get ``rpc_layer_idx`` = their rank among such modules, in module order.
    Registers ``"rpc"`` if needed. Returns the model.
    """
    if not is_registered():
        register()
    options = {k[4:] if k.startswith("rpc_") and k != "rpc_layers" else k: v for k, v in options.items()}
    checked = check_options({**_options_for(torch.nn.Module()), **options})
    given = {k: checked[k] for k in options}
    configs = []
    for mod in [model, *model.modules()]:
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict") and all(cfg is not c for c in configs):
            configs.append(cfg)
    for cfg in configs:
        for key, value in given.items():
            if key == "rpc_layers" and isinstance(value, tuple):
                value = list(value)
            setattr(cfg, _config_key(key), value)
    n = 0
    for mod in _attention_leaves(model):
        if getattr(mod, "layer_idx", None) is None:
            mod.rpc_layer_idx = n
            n += 1
    if set_implementation:
        model.set_attn_implementation(NAME)
    return model
