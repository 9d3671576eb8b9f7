"""What PAP's sparse step does inside a model: S activity per PAP block on a fixed probe.

:func:`measure_sparsity` runs one forward of a model and returns, for every PAP block
(:class:`rpc_attention.nn.RPCAttention`), the :func:`rpc_attention.functional.sparse_activity` record
of its final pass (share of non-zero S entries, share of tokens with a non-zero S row,
``||S||_F / ||K||_F``, tau next to the |k| quantiles) with the block index and the PAP options.
:func:`probe_sparsity` does it on the fixed probe of a training config: the first
:data:`PROBE_EXAMPLES` examples of the held-out split the run validates on (validation, else test),
200 images or 4 text windows by default (``train.sparsity_examples`` changes it).

The rule (:data:`FIRED_RULE`): a block's sparse step **fired** when ``frac_nonzero > 0`` on the probe;
otherwise S = 0 everywhere, every pass attends with the previous pass's output as keys, and the
block **acted as iterated attention** (docs/analysis.md#pap-sparse-step-activity).

The ``sparsity`` trainer callback is one of the trainer's default callbacks
(:func:`rpc_attention.train.callbacks.default_callbacks`): it logs the record at every epoch end of every run
with PAP layers and returns it, so the last one lands in ``final_metrics.json`` under ``"sparsity"``; models
without PAP layers are skipped. It lives in the trainer's floor, so a library user who calls
:func:`rpc_attention.train.run_training` gets the record without importing the analysis toolkit.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .. import functional as RF
from .. import nn as rnn
from ..data.batch import to_device
from ..functional.attention import normalise_mask
from .probe import first_eval_batch

__all__ = ["ACTIVITY_KEYS", "FIRED_RULE", "PROBE_EXAMPLES", "pap_blocks", "measure_sparsity", "probe_sparsity",
           "sparsity_verdict", "sparsity_summary", "sparsity_callback"]

ACTIVITY_KEYS = ("frac_nonzero", "frac_rows_nonzero", "s_over_k", "tau_mean", "tau_max", "abs_k_median",
                 "abs_k_p99", "abs_k_max")
FIRED_RULE = ("A PAP block's sparse step 'fired' when the share of non-zero entries of S (the sparse part "
              "of the keys, final pass) is above 0 on the probe; at 0, S = 0 everywhere and the block "
              "'acted as iterated attention' (each pass attends with the previous pass's output as keys). "
              "A model fired when any of its PAP blocks did.")
FIRED, ITERATED = "fired", "acted as iterated attention"
PROBE_EXAMPLES = {"classification": 200, "lm": 4, "segmentation": 32}
_PROBES: Dict[Tuple[str, int], Any] = {}


def pap_blocks(model: nn.Module) -> List[Tuple[str, rnn.RPCAttention]]:
    """``(qualified name, module)`` of every PAP block, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, rnn.RPCAttention)]


def _block_index(name: str) -> Optional[int]:
    """The block number in a name such as ``blocks.3.attn`` / ``layers.1.attn`` (first integer part)."""
    for part in name.split("."):
        if re.fullmatch(r"\d+", part):
            return int(part)
    return None


def _valid_keys(attn_mask: Optional[Tensor], k: Tensor) -> Optional[Tensor]:
    """(B, H, N) bool: keys some query may attend to (padding excluded), or None."""
    b, h, n, _ = k.shape
    mask = normalise_mask(attn_mask, b, h, n, n)
    return None if mask is None else mask.any(dim=-2).expand(b, h, n)


def _record(name: str, mod: rnn.RPCAttention, args: tuple, kwargs: dict) -> Dict[str, Any]:
    x = args[0] if args else kwargs["x"]
    attn_mask = args[1] if len(args) > 1 else kwargs.get("attn_mask")
    is_causal = bool(args[2] if len(args) > 2 else kwargs.get("is_causal", False))
    k, _ = mod._split(x)
    if mod.last_state is None:
        raise RuntimeError(f"{name}: RPCAttention did not record its PAP state")
    opts = mod.pap_options()
    rec: Dict[str, Any] = {"layer": name, "block": _block_index(name), "causal": is_causal,
                           **{key: opts[key] for key in ("n_iter", "lambd", "threshold", "mu_mode", "model_dim")},
                           "tokens": int(k.shape[0] * k.shape[2])}
    rec.update(RF.sparse_activity(mod.last_state, k, _valid_keys(attn_mask, k)))
    rec["verdict"] = FIRED if rec["frac_nonzero"] > 0 else ITERATED
    return rec


def measure_sparsity(model: nn.Module, forward: Callable[[], Any]) -> List[Dict[str, Any]]:
    """Run ``forward()`` (one forward of ``model``, no gradient) and return one record per call of
    each PAP block: layer, block, PAP options, ``causal``, ``tokens``, the :data:`ACTIVITY_KEYS` and
    ``verdict`` ("fired" / "acted as iterated attention"). Empty when the model has no PAP block."""
    blocks = pap_blocks(model)
    records: List[Dict[str, Any]] = []
    saved = {name: mod.keep_state for name, mod in blocks}
    handles = []

    def hook_for(name: str):
        def hook(mod, args, kwargs, output):
            with torch.no_grad():
                records.append(_record(name, mod, args, kwargs))
        return hook

    try:
        for name, mod in blocks:
            mod.keep_state = True
            handles.append(mod.register_forward_hook(hook_for(name), with_kwargs=True))
        with torch.no_grad():
            forward()
    finally:
        for hd in handles:
            hd.remove()
        for name, mod in blocks:
            mod.keep_state = saved[name]
            mod.last_state = None
    return records


def sparsity_verdict(blocks: Sequence[Dict[str, Any]]) -> Optional[str]:
    """"fired" when any block's ``frac_nonzero`` > 0, "acted as iterated attention" when none did,
    None without blocks (:data:`FIRED_RULE`)."""
    if not blocks:
        return None
    return FIRED if any(float(b.get("frac_nonzero") or 0.0) > 0 for b in blocks) else ITERATED


def _probe(cfg: dict, examples: Optional[int]):
    """(task, batch, description) of the fixed probe of ``cfg``; cached per config and size."""
    task_name = cfg.get("task", "classification")
    n = int(examples or (cfg.get("train") or {}).get("sparsity_examples") or PROBE_EXAMPLES.get(task_name, 200))
    key = (repr(sorted((k, repr(v)) for k, v in cfg.items() if k in ("task", "data", "model"))), n)
    if key not in _PROBES:
        try:
            probe = first_eval_batch(cfg, n)
        except ValueError as exc:
            raise ValueError(f"sparsity probe: {exc}") from None
        _PROBES[key] = (probe.task, probe.batch, {"split": probe.split, "examples": probe.examples, "task": task_name})
    return _PROBES[key]


def probe_sparsity(model: nn.Module, cfg: dict, examples: Optional[int] = None) -> Dict[str, Any]:
    """S activity of ``model`` on the fixed probe of training config ``cfg`` (the first examples of
    its validation split, else test; the forward goes through the task's ``loss``). Returns
    ``{"probe": {split, examples, task}, "blocks": [...], "verdict": ...}``; no PAP block: ``blocks``
    is empty and ``verdict`` None, and no data is loaded."""
    if not pap_blocks(model):
        return {"probe": None, "blocks": [], "verdict": None}
    task, batch, desc = _probe(cfg, examples)
    device = next(model.parameters()).device
    batch = to_device(batch, device)
    was = model.training
    model.eval()
    try:
        blocks = measure_sparsity(model, lambda: task.loss(model, batch, cfg))
    finally:
        model.train(was)
    return {"probe": desc, "blocks": blocks, "verdict": sparsity_verdict(blocks)}


def sparsity_summary(result: Dict[str, Any]) -> List[str]:
    """One line per PAP block (for the command line and the analysis summary)."""
    out = []
    for b in result.get("blocks") or []:
        out.append(f"block {b['block']} ({b['layer']}, {b['threshold']} lambd={b['lambd']:g}, n_iter={b['n_iter']}): "
                   f"S non-zero {100 * b['frac_nonzero']:.2f}% of entries, {100 * b['frac_rows_nonzero']:.1f}% of "
                   f"tokens, ||S||/||K|| {b['s_over_k']:.3g}; tau {b['tau_mean']:.3g} (max {b['tau_max']:.3g}) vs "
                   f"|k| median {b['abs_k_median']:.3g}, p99 {b['abs_k_p99']:.3g}, max {b['abs_k_max']:.3g}: "
                   f"{b['verdict']}")
    return out


def sparsity_callback(model, cfg, epoch, run_dir, logger) -> Optional[Dict[str, Any]]:
    """Epoch-end: log ``sparsity/<layer>/<key>`` for every PAP block and return the full record
    (the trainer writes the last one into ``final_metrics.json``). No PAP block: nothing."""
    if not pap_blocks(model):
        return None
    # Measuring must not move the training's random streams: a run trains the same with or without it.
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        result = probe_sparsity(model, cfg)
    random.setstate(py_state)
    np.random.set_state(np_state)
    rec: Dict[str, Any] = {"epoch": epoch, "split": "sparsity"}
    for b in result["blocks"]:
        rec.update({f"sparsity/{b['layer']}/{k}": b[k] for k in ACTIVITY_KEYS})
    rec["sparsity/max_frac_nonzero"] = max(b["frac_nonzero"] for b in result["blocks"])
    logger.log(rec)
    return {"epoch": epoch, **result}
