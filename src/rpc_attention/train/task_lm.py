"""Task ``lm``: word-level language modelling with :class:`rpc_attention.models.lm.Symlm`.

Config keys it reads:

- ``model.name``: ``symlm-small`` or ``symlm-medium`` (or ``null`` for the plain defaults) and
  ``model.kwargs``: any :class:`~rpc_attention.models.lm.SymlmConfig` field (``attention``,
  ``rpc_layers``, ``n_iter``, ``lambd``, ``n_layer``, ``d_model``, ``context``, ``cutoffs`` ...).
  ``model.kwargs.vocab_size`` is filled from the corpus.
- ``data.source``: ``embedded`` (Wikipedia lead paragraphs, default) or ``wikitext`` with
  ``data.root`` (a directory with ``wiki.{train,valid,test}.tokens``); ``data.min_freq`` (default 3 embedded, 1 WikiText),
  ``data.split_seed``; ``data.cache_dir`` (encoded corpus cache; default: a ``text-cache/<hash>``
  directory in ``runs/`` next to the run directories, see :func:`rpc_attention.data.text.text_cache_dir`).

``train.max_steps`` (optional) sets the number of optimizer steps (``train.epochs`` is derived: the
whole epochs the cosine schedule spans) and ``schedule.warmup_steps`` the warm-up length in steps
(``schedule.warmup_epochs`` is derived), as the paper's recipe is given in steps. Giving both a step
count and a different epoch count is an error (one of them would be ignored).

Train items are non-overlapping windows of ``context`` tokens of the training stream (shuffled by
the trainer); validation uses non-overlapping windows of the valid stream. Metrics: ``loss`` (nats
per token) and ``ppl``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, Optional

import torch

from ..data.text import TextDataConfig, text_cache_dir
from .config import DEFAULTS


def _run_dir_of(cfg: Dict[str, Any]) -> Optional[str]:
    train = cfg.get("train") or {}
    for key in ("run_dir", "out_dir", "output_dir"):
        if train.get(key):
            return str(train[key])
    return None


def _derived(cfg: Dict[str, Any], key: str, value: Any, default: Any, source: str) -> Any:
    """``value`` for ``key`` (derived from ``source``); ValueError if ``key`` was set to something else."""
    section, name = key.split(".")
    given = cfg[section].get(name)
    if given not in (default, value) and not (isinstance(value, float) and math.isclose(given, value)):
        ssec, sname = source.split(".")
        value = f"{value:.4g}" if isinstance(value, float) else value
        raise ValueError(f"{key}={given} and {source}={cfg[ssec][sname]} are both set, and the lm task derives "
                         f"{key} from {source} ({value} here): leave {key} unset or set it to {value}, or "
                         f"--set {source}=null to use {key}")
    return value


class LMTask:
    throughput_unit = "tokens"
    primary_metric = "ppl"
    primary_mode = "min"  # lower perplexity is better
    lower_is_better = True
    # image settings of the shared data section that a language model has no use for
    ignored_keys = ("data.mean", "data.std", "data.num_classes", "data.in_chans", "data.img_size", "data.augment")

    def __init__(self) -> None:
        self._corpus = None
        self._corpus_key = None

    # ------------------------------------------------------------------ config
    def default_config(self) -> Dict[str, Any]:
        return {
            "model": {"name": "symlm-small", "kwargs": {}},
            "data": dataclasses.asdict(TextDataConfig()),
            "optim": {"name": "adam", "lr": 2.5e-4, "weight_decay": 0.0, "clip_grad": 0.25},
            "schedule": {"warmup_steps": None},
        }

    def corpus(self, cfg: Dict[str, Any], run_dir: Optional[os.PathLike] = None):
        from ..data.text import prepare_corpus

        cache = text_cache_dir(cfg, run_dir or _run_dir_of(cfg))
        key = (str(cache), repr(sorted((k, str(v)) for k, v in cfg["data"].items())))
        if self._corpus is None or self._corpus_key != key:
            self._corpus = prepare_corpus(cfg["data"], cache)
            self._corpus_key = key
        return self._corpus

    def finalize_config(self, cfg: Dict[str, Any]) -> Dict[str, Any]:
        from ..models.lm import lm_config

        if not TextDataConfig.from_mapping(cfg["data"]).cache_dir:
            cfg["data"]["cache_dir"] = str(text_cache_dir(cfg, _run_dir_of(cfg)).resolve())
        corpus = self.corpus(cfg)
        kw = cfg["model"].setdefault("kwargs", {}) or {}
        cfg["model"]["kwargs"] = kw
        if kw.get("vocab_size") not in (None, len(corpus.vocab)):
            raise ValueError(f"model.kwargs.vocab_size={kw['vocab_size']} but the corpus vocabulary has "
                             f"{len(corpus.vocab)} words (leave it unset)")
        kw["vocab_size"] = len(corpus.vocab)
        mcfg = lm_config(cfg["model"].get("name"), **kw)  # validate early (unknown keys, bad rpc_layers, ...)
        # step-based schedule (the paper's recipe is in steps): derive epochs / warm-up epochs
        batch = int(cfg["train"]["batch_size"])
        spe = ((len(corpus.train) - 1) // mcfg.context) // batch
        if spe < 1:
            raise ValueError(f"the training stream ({len(corpus.train)} tokens) holds fewer than one batch of "
                             f"{batch} windows of {mcfg.context} tokens")
        steps = cfg["train"].get("max_steps")
        if steps:
            cfg["train"]["epochs"] = _derived(cfg, "train.epochs", max(1, math.ceil(int(steps) / spe)),
                                              DEFAULTS["train"]["epochs"], "train.max_steps")
        warm = cfg["schedule"].get("warmup_steps")
        if warm:
            cfg["schedule"]["warmup_epochs"] = _derived(cfg, "schedule.warmup_epochs", float(warm) / spe,
                                                        DEFAULTS["schedule"]["warmup_epochs"], "schedule.warmup_steps")
        return cfg

    # ------------------------------------------------------------------ build
    def build_model(self, cfg: Dict[str, Any]) -> torch.nn.Module:
        from ..models.lm import build_lm

        kw = dict(cfg["model"].get("kwargs") or {})
        if "vocab_size" not in kw:
            raise ValueError("model.kwargs.vocab_size is not set (the lm task fills it from the corpus)")
        return build_lm(cfg["model"].get("name"), **kw)

    def _context(self, cfg: Dict[str, Any]) -> int:
        from ..models.lm import lm_config

        return lm_config(cfg["model"].get("name"), **(cfg["model"].get("kwargs") or {})).context

    def build_datasets(self, cfg: Dict[str, Any]):
        from ..data.text import LMWindows

        corpus = self.corpus(cfg)
        ctx = self._context(cfg)
        return {"train": LMWindows(corpus.train, ctx), "val": LMWindows(corpus.valid, ctx),
                "test": LMWindows(corpus.test, ctx)}

    def collate_fn(self, cfg: Dict[str, Any]):
        return None

    def count(self, batch) -> int:
        return int(batch[1].numel())

    # ------------------------------------------------------------------ train / eval
    def loss(self, model, batch, cfg: Dict[str, Any]):
        x, y = batch
        lp = model(x, y)
        loss = -lp.float().mean()
        # a tensor, not a float: the trainer averages stats on the device and syncs only when it logs
        return loss, {"ppl": torch.exp(loss.detach().double().clamp(max=50.0))}

    @torch.no_grad()
    def evaluate(self, model, loader, cfg: Dict[str, Any]) -> Dict[str, float]:
        device = next(model.parameters()).device
        nll = 0.0
        n = 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            lp = model(x, y)
            nll -= float(lp.double().sum())
            n += y.numel()
        if n == 0:
            raise ValueError("evaluation data set is empty")
        loss = nll / n
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "n": n}


TASK = LMTask()  # registered as "lm" by rpc_attention.train.tasks
