"""Trainer callback ``jproj``: J_proj and its two terms on a fixed probe batch at every epoch end.

:func:`rpc_attention.kpca.register_callbacks` registers it with the trainer; a run enables it with
``--set train.callbacks=[jproj]`` (``train.jproj_examples``, default 8, sets the probe size).
Each call appends one record to ``DIR/metrics.jsonl``::

    {"epoch": E, "split": "jproj", "jproj/<protocol>/model/<term>": ..., "jproj/<protocol>/<layer>/<term>": ...}

for protocol in (paper, exact) and term in (jproj, phi2, h2, log_phi2, log_h2); model-level values are
the plain mean over (layer, head, example) records. ``rpc-attention analyze --run DIR`` plots them.
The probe batch is the first examples of the validation set (test set if there is none), fixed for
the whole run, and the forward goes through the task's own ``loss`` so any task works.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

import torch

from ..data.batch import to_device
from ..train.probe import first_eval_batch
from . import metrics as M
from .analysis import PROTOCOLS
from .hooks import AttentionCapture

__all__ = ["TERMS", "jproj_record", "jproj_callback"]

_PROBES: Dict[str, Any] = {}
TERMS = ("jproj", "phi2", "h2", "log_phi2", "log_h2")


def jproj_record(captures, protocols=PROTOCOLS) -> Dict[str, float]:
    """Flat ``jproj/<protocol>/<layer|model>/<term>`` means over heads and examples."""
    rec: Dict[str, float] = {}
    for proto in protocols:
        pooled: Dict[str, List[float]] = {t: [] for t in TERMS}
        for cap in captures:
            vals: Dict[str, List[float]] = {t: [] for t in TERMS}
            values = cap.values()
            for b in range(cap.batch):
                q, k = cap.q[b], cap.k[b]
                if proto == "paper":
                    q, k = M.standardize_tokens(q), M.standardize_tokens(k)
                if cap.symmetric:
                    q = k
                kv = cap.key_valid(b)
                pl = M.projection_loss(q, k, values[b], cap.scale, causal=cap.causal, mask=cap.example_mask(b),
                                       query_valid=kv)
                for t in TERMS:
                    vals[t].extend(pl[t].tolist())
            for t in TERMS:
                fin = [v for v in vals[t] if math.isfinite(v)]
                rec[f"jproj/{proto}/{cap.name}/{t}"] = sum(fin) / len(fin) if fin else None
                pooled[t].extend(fin)
        for t in TERMS:
            rec[f"jproj/{proto}/model/{t}"] = sum(pooled[t]) / len(pooled[t]) if pooled[t] else None
    return rec


def _probe_batch(cfg: dict, run_dir):
    key = str(run_dir)
    if key in _PROBES:
        return _PROBES[key]
    n = int((cfg.get("train") or {}).get("jproj_examples", 8))
    try:
        task, batch, _, _ = first_eval_batch(cfg, n)
    except ValueError as exc:
        raise ValueError(f"jproj callback: {exc}") from None
    _PROBES[key] = (task, batch)
    return task, batch


def jproj_callback(model, cfg, epoch, run_dir, logger) -> None:
    device = next(model.parameters()).device
    task, batch = _probe_batch(cfg, run_dir)
    with AttentionCapture(model) as cap, torch.no_grad():
        task.loss(model, to_device(batch, device), cfg)
    rec = {"epoch": epoch, "split": "jproj", **jproj_record(cap.captures)}
    if cap.errors:
        rec["jproj/errors"] = [e["layer"] + ": " + e["error"] for e in cap.errors]
    logger.log(rec)

