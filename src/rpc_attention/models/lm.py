"""Symlm: a compact causal word-level language model with symmetric / RPC attention (docs/method.md#symlm-and-rpc-symlm).

One file in the spirit of nanoGPT's ``model.py``. The architecture follows the Symlm of the paper
(lmtool-fwp / Transformer-XL lineage, without memory): word embeddings scaled by ``sqrt(d_model)``
plus sinusoidal absolute positions, ``n_layer`` post-LN blocks (``x = LN(x + Attn(x))``,
``x = LN(x + FF(x))`` with a ReLU feed-forward of width ``d_inner``), and an adaptive softmax whose
word vectors are tied to the input embedding (``div_val = 1``: every cluster uses the full width).

Attention per block: ``attention="symmetric"`` (no W_Q, :class:`rpc_attention.nn.SymmetricAttention`)
or ``"asymmetric"`` (:class:`rpc_attention.nn.Attention`); the blocks listed in ``rpc_layers`` use
:class:`rpc_attention.nn.RPCAttention` (PAP with the causal mask in every iteration and the causal
mu, so no output depends on a later token).

Generation uses a key/value cache. Plain and symmetric layers cache K/V and attend with the new
token only. RPC layers cache the values and PAP's cleaned keys of every pass
(:class:`rpc_attention.functional.PAPCache`): a new token runs PAP's passes on its own row, each
pass one query against the cached cleaned keys (exact, because causal PAP at position t only depends
on positions <= t; O(n_iter * t * d) per head and token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import functional as RF
from ..nn import Attention, RPCAttention, SymmetricAttention, parse_layers

__all__ = [
    "SymlmConfig", "Symlm", "AdaptiveLogSoftmax", "LM_CONFIGS", "build_lm", "lm_config",
    "parse_rpc_layers", "generate", "cache_length", "reorder_cache",
]

PAPER_CUTOFFS = (20000, 40000, 200000)


@dataclass
class SymlmConfig:
    """Hyper-parameters of :class:`Symlm` (defaults: ``symlm-small``, the paper's WikiText-103 model)."""

    vocab_size: int = 267735
    n_layer: int = 16
    d_model: int = 128
    n_head: int = 8
    d_inner: int = 2048
    context: int = 256
    dropout: float = 0.1
    attn_dropout: float = 0.0
    attention: str = "symmetric"  # "symmetric" (no W_Q) or "asymmetric"
    rpc_layers: Union[str, List[int]] = field(default_factory=list)  # block indices or "all"
    n_iter: int = 4
    lambd: float = 4.0
    threshold: str = "lambda_mu"
    mu_mode: Optional[str] = "causal"
    shrink: str = "soft"   # robust PAP options valid in causal layers (docs/method.md#robust-variants)
    dual_step: float = 1.0
    cutoffs: List[int] = field(default_factory=lambda: list(PAPER_CUTOFFS))
    adaptive: bool = True  # False: full softmax over the vocabulary
    tie_weights: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "d_inner", "context", "n_iter"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"SymlmConfig.{name} must be a positive integer, got {val!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.attention not in ("symmetric", "asymmetric"):
            raise ValueError(f"attention must be 'symmetric' or 'asymmetric', got {self.attention!r}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        self.rpc_layers = parse_rpc_layers(self.rpc_layers, self.n_layer)
        self.cutoffs = [int(c) for c in (self.cutoffs or [])]
        if any(c <= 0 for c in self.cutoffs) or sorted(set(self.cutoffs)) != self.cutoffs:
            raise ValueError(f"cutoffs must be increasing positive integers, got {self.cutoffs}")
        if self.rpc_layers:
            RF.check_pap_options(n_iter=self.n_iter, lambd=self.lambd, threshold=self.threshold,
                                 mu_mode=self.mu_mode, is_causal=True, shrink=self.shrink,
                                 dual_step=self.dual_step)

    @property
    def effective_cutoffs(self) -> List[int]:
        """Cutoffs clipped to the vocabulary (empty: a single softmax over every word)."""
        if not self.adaptive:
            return []
        return [c for c in self.cutoffs if c < self.vocab_size]


def parse_rpc_layers(value, n_layer: int) -> List[int]:
    """``"all"``, ``"0-3"``, ``"0,1,2"``, a list of ints or ``None``/``[]`` -> sorted block indices."""
    return parse_layers(value, n_layer)


LM_CONFIGS: Dict[str, Dict] = {
    "symlm-small": dict(n_layer=16, d_model=128, n_head=8, d_inner=2048, context=256, dropout=0.1),
    "symlm-medium": dict(n_layer=16, d_model=256, n_head=8, d_inner=2048, context=384, dropout=0.1),
}


def lm_config(name: Optional[str] = None, **overrides) -> SymlmConfig:
    """A :class:`SymlmConfig` from a named size (``symlm-small``, ``symlm-medium``) plus overrides."""
    base: Dict = {}
    if name:
        if name not in LM_CONFIGS:
            raise ValueError(f"unknown LM config {name!r}; available: {', '.join(LM_CONFIGS)}")
        base.update(LM_CONFIGS[name])
    known = {f.name for f in fields(SymlmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
        raise ValueError(f"model.kwargs.{unknown[0]}: unknown Symlm option(s) {unknown}; {hint}")
    base.update(overrides)
    return SymlmConfig(**base)


def build_lm(name: Optional[str] = "symlm-small", **overrides) -> Symlm:
    return Symlm(lm_config(name, **overrides))


def sinusoidal_positions(n: int, d: int, offset: int = 0, device=None, dtype=torch.float32) -> Tensor:
    """(n, d) absolute position encodings [sin | cos] (Transformer-XL layout), positions offset.."""
    pos = torch.arange(offset, offset + n, device=device, dtype=torch.float64)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    ang = pos[:, None] * inv[None, :]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)[:, :d].to(dtype)


def _upcast(x: Tensor) -> Tensor:
    """Half / bfloat16 logits -> float32 before the softmax; float32 / float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class AdaptiveLogSoftmax(nn.Module):
    """Adaptive softmax (Grave et al.) with word vectors tied to an embedding and ``div_val = 1``.

    The head scores the shortlist ``[0, cutoffs[0])`` plus one logit per tail cluster; tail cluster
    ``i`` scores the words ``[cutoffs[i], cutoffs[i+1])``. ``log p(w) = log p_head(cluster(w)) +
    log p_tail(w)``. With no cutoffs this is a plain (full) softmax. Word vectors come from the
    ``weight`` passed in (the tied embedding) or from an own parameter.
    """

    def __init__(self, vocab_size: int, d_model: int, cutoffs: Sequence[int], own_weight: bool = False) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.cutoffs = [int(c) for c in cutoffs if 0 < c < vocab_size]
        self.bounds = [0] + self.cutoffs + [vocab_size]
        self.n_clusters = len(self.cutoffs)
        self.shortlist = self.bounds[1]
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model).normal_(0, 0.02)) if own_weight else None
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_model))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))

    def _head_logprob(self, h: Tensor, weight: Tensor) -> Tensor:
        w = weight[: self.shortlist]
        b = self.bias[: self.shortlist]
        if self.n_clusters:
            w = torch.cat([w, self.cluster_weight], dim=0)
            b = torch.cat([b, self.cluster_bias], dim=0)
        return F.log_softmax(_upcast(F.linear(h, w.to(h.dtype), b.to(h.dtype))), dim=-1)

    def _tail_logprob(self, h: Tensor, weight: Tensor, i: int) -> Tensor:
        lo, hi = self.bounds[i], self.bounds[i + 1]
        logits = F.linear(h, weight[lo:hi].to(h.dtype), self.bias[lo:hi].to(h.dtype))
        return F.log_softmax(_upcast(logits), dim=-1)

    def target_logprob(self, h: Tensor, target: Tensor, weight: Optional[Tensor] = None) -> Tensor:
        """log p(target) for hidden states ``h`` (M, d) and targets (M,) -> (M,) (float32 at least)."""
        weight = self.weight if weight is None else weight
        assert weight is not None, "a tied AdaptiveLogSoftmax (own_weight=False) takes the embedding weight"
        if target.min() < 0 or target.max() >= self.vocab_size:
            raise ValueError(f"targets must lie in [0, {self.vocab_size}), got [{int(target.min())}, {int(target.max())}]")
        head = self._head_logprob(h, weight)
        if not self.n_clusters:
            return head.gather(-1, target[:, None]).squeeze(-1)
        out_dtype = head.dtype
        in_short = target < self.shortlist
        out = torch.zeros(target.shape[0], dtype=out_dtype, device=h.device)
        idx = in_short.nonzero().squeeze(-1)
        if idx.numel():
            out = out.index_copy(0, idx, head[idx].gather(-1, target[idx, None]).squeeze(-1))
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            idx = ((target >= lo) & (target < hi)).nonzero().squeeze(-1)
            if not idx.numel():
                continue
            tail = self._tail_logprob(h[idx], weight, i)
            lp = head[idx, self.shortlist + i - 1] + tail.gather(-1, (target[idx] - lo)[:, None]).squeeze(-1)
            out = out.index_copy(0, idx, lp.to(out_dtype))
        return out

    def full_logprob(self, h: Tensor, weight: Optional[Tensor] = None) -> Tensor:
        """log p(w) for every word: (M, d) -> (M, vocab_size)."""
        weight = self.weight if weight is None else weight
        assert weight is not None, "a tied AdaptiveLogSoftmax (own_weight=False) takes the embedding weight"
        head = self._head_logprob(h, weight)
        if not self.n_clusters:
            return head
        parts = [head[:, : self.shortlist]]
        for i in range(1, self.n_clusters + 1):
            parts.append(head[:, self.shortlist + i - 1: self.shortlist + i] + self._tail_logprob(h, weight, i))
        return torch.cat(parts, dim=-1)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_inner: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_inner)
        self.fc2 = nn.Linear(d_inner, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(F.relu(self.fc1(x)))))


class Block(nn.Module):
    """Post-LN block: ``x = LN1(x + Attn(x))``, ``x = LN2(x + FF(x))``; causal attention."""

    def __init__(self, cfg: SymlmConfig, rpc: bool) -> None:
        super().__init__()
        common: Dict[str, Any] = dict(dim=cfg.d_model, num_heads=cfg.n_head, attn_drop=cfg.attn_dropout,
                                      proj_drop=cfg.dropout)
        self.attn: Union[Attention, SymmetricAttention]
        if rpc:
            self.attn = RPCAttention(**common, n_iter=cfg.n_iter, lambd=cfg.lambd, threshold=cfg.threshold,
                                     mu_mode=cfg.mu_mode, shrink=cfg.shrink, dual_step=cfg.dual_step)
        elif cfg.attention == "symmetric":
            self.attn = SymmetricAttention(**common)
        else:
            self.attn = Attention(**common)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_inner, cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, cache: Optional[Dict[str, Tensor]] = None) -> Tensor:
        if cache is None:
            a = self.attn(x, is_causal=True)
        else:
            a = _cached_attention(self.attn, x, cache)
        x = self.ln1(x + a)
        return self.ln2(x + self.ff(x))


def _cached_attention(attn: Union[Attention, SymmetricAttention], x: Tensor, cache: Dict) -> Tensor:
    """Attention of the new tokens ``x`` over cached + new positions; updates ``cache`` in place.

    With an empty cache ``x`` is the whole prefix (prefill, causal); otherwise ``x`` must be one
    token. RPC layers keep a :class:`~rpc_attention.functional.PAPCache` (``cache["pap"]``) and
    the values; other layers keep keys and values.
    """
    parts = attn._split(x)
    if isinstance(attn, SymmetricAttention):  # includes RPCAttention: the keys are the queries
        k, v = parts
        q = k
    else:
        q, k, v = parts
    prefill = "v" not in cache
    if not prefill and x.shape[1] != 1:
        raise ValueError("a non-empty cache takes one new token at a time")
    v_all = v if prefill else torch.cat([cache["v"], v], dim=2)
    cache["v"] = v_all
    dropout_p = attn._dropout_p
    if isinstance(attn, RPCAttention):
        return attn._merge(_cached_pap(attn, k, v_all, cache, dropout_p))
    k_all = k if prefill else torch.cat([cache["k"], k], dim=2)
    cache["k"] = k_all
    # prefill: square causal attention; step: one query sees every cached key (no mask needed)
    out = RF.attention(q, k_all, v_all, is_causal=prefill, dropout_p=dropout_p, scale=attn.scale,
                       fused=attn.fused_attn)
    return attn._merge(out)


def _cached_pap(attn: RPCAttention, k: Tensor, v_all: Tensor, cache: Dict, dropout_p: float) -> Tensor:
    """PAP of the new keys ``k`` with the layer's :class:`~rpc_attention.functional.PAPCache`:
    a prefill fills it, a step runs the passes for the new row only."""
    opts = attn.pap_options()
    if opts["tol"] is not None:
        raise ValueError("cached decoding runs PAP position by position and cannot apply tol (a stopping rule "
                         "over the whole sequence); build the model without tol or generate with use_cache=False")
    if "pap" not in cache:
        out, _, cache["pap"] = RF.pap_prefill(
            k, v_all, n_iter=opts["n_iter"], lambd=opts["lambd"], scale=attn.scale, model_dim=opts["model_dim"],
            threshold=opts["threshold"], mu_mode=opts["mu_mode"] or "causal", dropout_p=dropout_p,
            fused=attn.fused_attn, shrink=opts["shrink"], dual_step=opts["dual_step"])
        assert out is not None  # the prefill ran its final attention
        return out
    return cache["pap"].step(k, v_all, dropout_p=dropout_p, fused=attn.fused_attn)[0]


class Symlm(nn.Module):
    """Causal word-level LM; ``forward(idx)`` returns hidden states (B, T, d_model) and
    ``forward(idx, targets)`` the per-token log-probabilities of ``targets`` (B, T).

    Use :meth:`loss` (mean NLL), :meth:`target_logprob` (per-token log-probabilities) or
    :meth:`next_logprob` (log-probabilities of every word after the last position).
    """

    def __init__(self, cfg: SymlmConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        rpc = set(cfg.rpc_layers)
        self.blocks = nn.ModuleList(Block(cfg, i in rpc) for i in range(cfg.n_layer))
        self.crit = AdaptiveLogSoftmax(cfg.vocab_size, cfg.d_model, cfg.effective_cutoffs,
                                       own_weight=not cfg.tie_weights)
        self.emb_scale = math.sqrt(cfg.d_model)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def out_weight(self) -> Tensor:
        weight = self.tok_emb.weight if self.config.tie_weights else self.crit.weight
        assert weight is not None  # untied: the softmax has its own weight
        return weight

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None,
                cache: Optional[List[Dict[str, Tensor]]] = None) -> Tensor:
        """Hidden states (B, T, d_model); with ``targets`` (B, T) the log-probabilities of the targets."""
        h = self._hidden(idx, cache)
        if targets is None:
            return h
        lp = self.crit.target_logprob(h.reshape(-1, h.shape[-1]), targets.reshape(-1), self.out_weight)
        return lp.view(targets.shape)

    def _hidden(self, idx: Tensor, cache: Optional[List[Dict[str, Tensor]]] = None) -> Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, tokens), got shape {tuple(idx.shape)}")
        b, t = idx.shape
        offset = cache_length(cache)
        if offset + t > self.config.context:
            raise ValueError(f"sequence of {offset + t} tokens exceeds the model context {self.config.context}")
        x = self.tok_emb(idx) * self.emb_scale
        pos = sinusoidal_positions(t, self.config.d_model, offset, device=idx.device, dtype=x.dtype)
        x = self.drop(x + pos)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        return x

    def new_cache(self) -> List[Dict]:
        """An empty decoding cache: one dict per block (filled by the first forward that gets it)."""
        return [{} for _ in self.blocks]

    def target_logprob(self, idx: Tensor, targets: Tensor) -> Tensor:
        """(B, T) log p(targets[b, t] | idx[b, :t+1])."""
        return self(idx, targets)

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Mean negative log-likelihood (nats per token)."""
        return -self.target_logprob(idx, targets).mean()

    def next_logprob(self, idx: Tensor, cache: Optional[List[Dict[str, Tensor]]] = None) -> Tensor:
        """(B, vocab) log-probabilities of the next word after the last position of ``idx``."""
        h = self._hidden(idx, cache)[:, -1]
        return self.crit.full_logprob(h, self.out_weight)


def cache_length(cache: Optional[List[Dict]]) -> int:
    """Number of positions a :meth:`Symlm.new_cache` cache holds (0 for None or an empty cache)."""
    if not cache or "v" not in cache[0]:
        return 0
    return cache[0]["v"].shape[2]


def reorder_cache(cache: List[Dict], index: Tensor) -> None:
    """Select batch rows of a Symlm cache in place (beam search: ``index`` names each new row's source)."""
    for layer in cache:
        for key, value in layer.items():
            if key == "pap":
                value.reorder(index)
            else:
                layer[key] = value.index_select(0, index.to(value.device))


@torch.no_grad()
def generate(
    model: Symlm,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    use_cache: bool = True,
    generator: Optional[torch.Generator] = None,
    ban: Sequence[int] = (),
) -> Tensor:
    """Continue ``idx`` (B, T) by ``max_new_tokens`` words; ``temperature=0`` is greedy decoding.

    With ``use_cache`` the prefix is encoded once and every new word costs one single-token pass
    (RPC layers run PAP's passes for the new word against their cached cleaned keys). When the
    sequence outgrows the context, the window is cropped to the last ``context`` words and re-encoded (exactly what the cache-free
    path does at every step), so both paths produce the same words.
    """
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    ctx = model.config.context
    cache = None
    for _ in range(max_new_tokens):
        if not use_cache:
            logp = model.next_logprob(idx[:, -ctx:])
        elif cache is None or cache_length(cache) >= ctx:
            cache = model.new_cache()
            logp = model.next_logprob(idx[:, -ctx:], cache)
        else:
            logp = model.next_logprob(idx[:, -1:], cache)
        if ban:
            logp[:, list(ban)] = float("-inf")
        if temperature == 0:
            nxt = logp.argmax(dim=-1, keepdim=True)
        else:
            logits = logp / temperature
            if top_k is not None and top_k > 0:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
    return idx
