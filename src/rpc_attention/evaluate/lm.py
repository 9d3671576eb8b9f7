"""Language-model evaluation: perplexity (sliding window and non-overlapping) and the word-swap attack.

Protocols, on a token stream ``x[0..T)`` (every line ends with ``<eos>``); targets are ``x[1..T)``,
each scored exactly once, so both protocols average over the same ``T - 1`` tokens:

- ``sliding`` (the paper's protocol, "every token scored with full context"): windows of ``context``
  tokens start at ``0, stride, 2 stride, ...``; each window scores only the targets no earlier window
  has scored, so target ``t`` is predicted from ``x[b..t)`` with ``b = max(0, ceil((t - context) /
  stride)) * stride``, i.e. with at least ``context - stride`` tokens of context (the full context
  for ``stride = 1``).
- ``plain``: non-overlapping windows of ``context`` tokens; the context restarts at every window.

Suites (registered in :mod:`rpc_attention.evaluate.suites`): ``ppl`` and ``wordswap`` (1.5% of the
non-stopword words of every line replaced by ``AAA``; see :func:`rpc_attention.data.text.word_swap`).
An out-of-vocabulary ``AAA`` is encoded as ``<unk>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from .per_example import score_record
from .suites import Column, CommonOptions, Cost, list_option, register_suite


def ppl_metric(split: str, protocol: str, attacked: bool = False) -> str:
    """The name of a perplexity metric, e.g. ``ppl_metric("test", "sliding")`` = ``"test_ppl_sliding"``."""
    return f"{split}{'_attacked' if attacked else ''}_ppl_{protocol}"


__all__ = ["sliding_windows", "target_nll", "score_stream", "nll_blocks", "perplexity", "corpus_for_run", "PROTOCOLS"]

PROTOCOLS = ("sliding", "plain")


def sliding_windows(n_tokens: int, context: int, stride: int) -> List[Tuple[int, int, int]]:
    """``[(begin, end, n_scored), ...]``: inputs ``x[begin:end]``, targets ``x[begin+1:end+1]``, of
    which the last ``n_scored`` are scored. Covers every target ``1..n_tokens-1`` exactly once."""
    if context < 1 or stride < 1:
        raise ValueError(f"context and stride must be >= 1, got {context}, {stride}")
    if stride > context:
        raise ValueError(f"stride ({stride}) must not exceed the context ({context}) or tokens go unscored")
    last = n_tokens - 1  # index of the last target
    out: List[Tuple[int, int, int]] = []
    prev = 0
    begin = 0
    while prev < last:
        end = min(begin + context, last)
        out.append((begin, end, end - prev))
        prev = end
        begin += stride
    return out


def plain_windows(n_tokens: int, context: int) -> List[Tuple[int, int, int]]:
    last = n_tokens - 1
    return [(b, min(b + context, last), min(b + context, last) - b) for b in range(0, last, context)]


def _unwrap(model):
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


@torch.no_grad()
def target_nll(model, tokens: np.ndarray, protocol: str = "sliding", context: Optional[int] = None,
               stride: Optional[int] = None, batch_size: int = 32, device: Any = None) -> np.ndarray:
    """Negative log-likelihood (nats, float64) of every target ``tokens[t + 1]``, ``t = 0 .. n - 2``,
    each scored once by the window that the protocol assigns to it."""
    model = _unwrap(model)
    ctx = int(context or model.config.context)
    if ctx > model.config.context:
        raise ValueError(f"context {ctx} exceeds the model context {model.config.context}")
    n = len(tokens)
    if n < 2:
        raise ValueError("need at least two tokens to score")
    if protocol == "sliding":
        windows = sliding_windows(n, ctx, int(stride or max(1, ctx // 4)))
    elif protocol == "plain":
        windows = plain_windows(n, ctx)
    else:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    arr = np.asarray(tokens)
    losses = np.full(n - 1, np.nan)
    # group windows by length so that each batch is rectangular
    by_len: Dict[int, List[Tuple[int, int, int]]] = {}
    for w in windows:
        by_len.setdefault(w[1] - w[0], []).append(w)
    for length, group in by_len.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i:i + batch_size]
            idx = np.stack([arr[b:e + 1] for b, e, _ in chunk]).astype(np.int64)
            t = torch.from_numpy(idx).to(device)
            lp = model(t[:, :-1], t[:, 1:]).double().cpu().numpy()
            for r, (_, e, k) in enumerate(chunk):  # the window's last k targets: tokens e-k+1 .. e
                losses[e - k:e] = -lp[r, length - k:]
    if np.isnan(losses).any():  # pragma: no cover - guarded by the window construction
        raise RuntimeError(f"scored {int((~np.isnan(losses)).sum())} of {n - 1} targets")
    return losses


def score_stream(model, tokens: np.ndarray, protocol: str = "sliding", context: Optional[int] = None,
                 stride: Optional[int] = None, batch_size: int = 32, device: Any = None) -> Tuple[float, int]:
    """Sum of negative log-likelihoods (nats) of the targets of ``tokens`` and their number."""
    losses = target_nll(model, tokens, protocol, context, stride, batch_size, device)
    return float(losses.sum()), len(losses)


def nll_blocks(losses: np.ndarray, block: int) -> List[List[float]]:
    """``[[NLL sum, targets], ...]`` of consecutive blocks of ``block`` targets (the last may be shorter):
    the per-example record of a perplexity, resampled by block in the report's bootstrap."""
    return [[float(losses[i:i + block].sum()), int(min(block, len(losses) - i))] for i in range(0, len(losses), block)]


def perplexity(model, tokens: np.ndarray, protocol: str = "sliding", **kw) -> float:
    nll, n = score_stream(model, tokens, protocol, **kw)
    return math.exp(nll / n)


# ---------------------------------------------------------------------------------------------
# suites


def corpus_for_run(cfg: Mapping[str, Any], run_dir: Optional[str] = None):
    """The run's encoded corpus (from its cache, rebuilt if missing or not matching)."""
    from ..data.text import prepare_corpus, text_cache_dir

    return prepare_corpus(cfg["data"], text_cache_dir(cfg, run_dir))


def _limit(tokens: np.ndarray, limit: Optional[int]) -> np.ndarray:
    return tokens if not limit else tokens[: int(limit) + 1]


def _check_splits(splits: Sequence[str]) -> None:
    bad = [s for s in splits if s not in ("train", "valid", "test")]
    if bad or not splits:
        raise ValueError(f"splits must be from train, valid, test; got {list(splits)}")


def _check_protocols(protocols: Sequence[str]) -> None:
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad or not protocols:
        raise ValueError(f"protocols must be from {', '.join(PROTOCOLS)}; got {list(protocols)}")


def _check(cfg: Mapping[str, Any], opts: Dict[str, Any]) -> None:
    if cfg.get("task") != "lm":
        raise ValueError(f"the LM suites need a run of task 'lm', got {cfg.get('task')!r}")
    _check_splits(opts["splits"])
    _check_protocols(opts["protocols"])
    if int(opts.get("stride") or 0) < 0:
        raise ValueError("stride must be >= 0 (0 = context / 4)")
    from ..data.text import corpus_fingerprint, data_settings

    data_settings(cfg["data"])
    corpus_fingerprint(cfg["data"])  # raises FileNotFoundError when the data is missing


def _resolved(model, opts) -> Tuple[int, int]:
    m = _unwrap(model)
    ctx = int(opts.get("context") or m.config.context)
    stride = int(opts.get("stride") or max(1, ctx // 4))
    return ctx, stride


def _ppl_rows(model, streams: Dict[str, np.ndarray], opts, label: str = "",
              blocks: Optional[Dict[str, Any]] = None) -> Tuple[List[Dict], Dict[str, float]]:
    """One row and one metric per split and protocol; each metric's NLL per block of ``context``
    targets goes into ``blocks`` (the suite's per-example record)."""
    ctx, stride = _resolved(model, opts)
    rows, metrics = [], {}
    for split, toks in streams.items():
        for proto in opts["protocols"]:
            losses = target_nll(model, toks, proto, context=ctx, stride=stride,
                                batch_size=int(opts["batch_size"]), device=opts.get("device"))
            nll, n = float(losses.sum()), len(losses)
            ppl = math.exp(nll / n)
            name = ppl_metric(split, proto, attacked=bool(label))
            metrics[name] = ppl
            if blocks is not None:
                blocks[name] = nll_blocks(losses, ctx)
            rows.append({"split": split, "text": label.strip("_") or "clean", "protocol": proto,
                         "context": ctx, "stride": stride if proto == "sliding" else ctx,
                         "tokens": n, "nll": nll / n, "ppl": ppl})
    return rows, metrics


def ppl_suite(model, cfg, run_dir, opts) -> Dict[str, Any]:
    corpus = corpus_for_run(cfg, run_dir)
    model.to(opts.get("device") or "cpu")
    streams = {s: _limit(corpus.split(s), opts.get("limit")) for s in opts["splits"]}
    blocks: Dict[str, Any] = {}
    rows, metrics = _ppl_rows(model, streams, opts, blocks=blocks)
    ctx, stride = _resolved(model, opts)
    return {
        "per_example": _block_record(blocks),
        "metrics": metrics, "rows": rows,
        "data": {"source": cfg["data"].get("source"), "vocab_size": len(corpus.vocab),
                 "splits": ",".join(opts["splits"]), "n_examples": sum(len(t) - 1 for t in streams.values())},
        "n_examples": sum(len(t) - 1 for t in streams.values()),
        "protocol": (f"Perplexity = exp(mean NLL) over every target token of each split. sliding: windows of "
                     f"{ctx} tokens every {stride} tokens, each token scored once with >= {ctx - stride} "
                     f"tokens of context; plain: non-overlapping windows of {ctx} tokens."),
        "settings": {"context": ctx, "stride": stride},
    }


def wordswap_suite(model, cfg, run_dir, opts) -> Dict[str, Any]:
    from ..data.text import encode_lines, read_lines, word_swap

    corpus = corpus_for_run(cfg, run_dir)
    vocab = corpus.vocab
    model.to(opts.get("device") or "cpu")
    attacked: Dict[str, np.ndarray] = {}
    stats: Dict[str, Dict[str, int]] = {}
    for split in opts["splits"]:
        lines, st = word_swap(read_lines(cfg["data"], split), rate=float(opts["rate"]), token=str(opts["token"]),
                              seed=int(opts.get("seed") or 0), min_one=bool(opts["min_one"]))
        arr = encode_lines(lines, vocab)
        if len(arr) != len(corpus.split(split)):
            raise RuntimeError(f"attacked {split} has {len(arr)} tokens, clean {len(corpus.split(split))}")
        attacked[split] = _limit(arr, opts.get("limit"))
        stats[split] = st
    blocks: Dict[str, Any] = {}
    rows, metrics = _ppl_rows(model, attacked, opts, label="_attacked", blocks=blocks)
    if opts.get("clean", True):
        clean = {s: _limit(corpus.split(s), opts.get("limit")) for s in opts["splits"]}
        crow, cmet = _ppl_rows(model, clean, opts, blocks=blocks)
        rows = crow + rows
        metrics.update(cmet)
    for split, st in stats.items():
        metrics[f"{split}_swap_rate"] = st["swapped"] / max(1, st["candidates"])
    in_vocab = str(opts["token"]) in vocab
    ctx, stride = _resolved(model, opts)
    return {
        "per_example": _block_record(blocks),
        "metrics": metrics, "rows": rows,
        "data": {"source": cfg["data"].get("source"), "vocab_size": len(vocab), "splits": ",".join(opts["splits"]),
                 "swap_stats": stats, "token_in_vocab": in_vocab},
        "n_examples": sum(len(t) - 1 for t in attacked.values()),
        "protocol": (f"Word swap: {float(opts['rate']) * 100:g}% of the non-stopword words of every line replaced "
                     f"by {opts['token']!r} (seed {opts.get('seed')}; "
                     f"{'in the vocabulary' if in_vocab else 'not in the vocabulary, encoded as <unk>'}); "
                     f"perplexity of the attacked text (sliding: context {ctx}, stride {stride}; plain: "
                     f"non-overlapping windows of {ctx})."),
        "settings": {"context": ctx, "stride": stride, "token_in_vocab": in_vocab},
    }


def _block_record(blocks: Dict[str, Any]) -> Dict[str, Any]:
    """The per-example record of the perplexities: one record per metric length would not share
    indices, so every metric keeps its own block list (the splits differ in length)."""
    return {"kind": "ppl", "by_metric": {name: score_record("ppl", {name: b}) for name, b in blocks.items()}}


@dataclass(frozen=True)
class PplOptions(CommonOptions):
    """``stride`` / ``context`` 0: the model's context and a quarter of it."""

    splits: List[str] = list_option(["valid", "test"])
    protocols: List[str] = list_option(["sliding", "plain"])
    stride: int = 0
    context: int = 0
    batch_size: int = 32


@dataclass(frozen=True)
class WordSwapOptions(PplOptions):
    rate: float = 0.015
    token: str = "AAA"
    min_one: bool = False
    clean: bool = True


_PPL = PplOptions()

# The whole split is timed at once: seconds for the embedded corpus's test split (sliding window).
_LM_COST = Cost(1, 0, full_split_s=9.5)
_PPL_METRICS = tuple(ppl_metric(s, p) for s in _PPL.splits for p in _PPL.protocols)

register_suite("ppl", ppl_suite, tasks=("lm",), options=PplOptions,
               description="Word-level perplexity, sliding-window and non-overlapping protocols", check=_check,
               metrics=_PPL_METRICS, cost=_LM_COST,
               columns=(Column("lm", ppl_metric("valid", "sliding"), "valid PPL", higher=False, position=10),
                        Column("lm", ppl_metric("test", "sliding"), "test PPL", higher=False, paper="lm_ppl",
                               position=11)))
register_suite("wordswap", wordswap_suite, tasks=("lm",),
               options=WordSwapOptions,
               description="Perplexity under the word-swap attack (1.5% of non-stopwords -> 'AAA')", check=_check,
               metrics=tuple(ppl_metric(s, p, attacked=True) for s in _PPL.splits for p in _PPL.protocols),
               cost=_LM_COST,
               columns=(Column("lm", ppl_metric("valid", "sliding", True), "word-swap valid PPL", higher=False,
                               position=20),
                        Column("lm", ppl_metric("test", "sliding", True), "word-swap test PPL", higher=False,
                               paper="lm_wordswap", position=21)))
