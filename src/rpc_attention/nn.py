"""Attention modules built on :mod:`rpc_attention.functional`.

All modules take ``x`` of shape ``(B, N, C)`` and return the same shape, and accept the timm
``Attention.forward`` keyword ``attn_mask`` (bool, True = may attend, or additive float, broadcastable
to ``(B, H, N, N)``) plus ``is_causal``. Parameter names follow timm / the official SymViT
checkpoints: ``qkv`` (C -> 3C asymmetric, C -> 2C symmetric: keys then values) and ``proj``.
"""

import re
from typing import Iterable, List, Optional, Union, overload

import torch
from torch import Tensor, nn

from . import functional as RF

__all__ = ["Attention", "SymmetricAttention", "RPCAttention", "ScaledAttention", "PAP_OPTION_NAMES", "parse_layers",
           "softmax_attention"]

# pap_attention keyword options a module or model may carry (besides masks and dropout).
PAP_OPTION_NAMES = ("n_iter", "lambd", "threshold", "mu_mode", "model_dim", "tol", "lowrank", "shrink", "dual_step",
                    "row_lambd")


# With a depth the answer is always a list ("all" becomes every index); without one "all" stays "all".
@overload
def parse_layers(spec: Union[None, str, int, Iterable[int]], depth: int, name: str = "rpc_layers") -> List[int]: ...
@overload
def parse_layers(spec: Union[None, str, int, Iterable[int]], depth: Optional[int] = None,
                 name: str = "rpc_layers") -> Union[str, List[int]]: ...


def parse_layers(spec: Union[None, str, int, Iterable[int]], depth: Optional[int] = None,
                 name: str = "rpc_layers") -> Union[str, List[int]]:
    """Which blocks run PAP, as every model family and integration spells it.

    ``None``, ``"none"``, ``""`` or ``[]``: none; ``"all"``: every block (``"all"`` itself when
    ``depth`` is unknown); an index; a list of indices; or a string of indices and inclusive ranges
    (``"0,2"``, ``"0-3"``, ``"[0, 1]"``). Returns the sorted unique indices. Raises ``ValueError``
    naming ``name`` for anything else and for indices outside ``[0, depth)``.
    """
    if spec is None:
        return []
    if isinstance(spec, str):
        text = spec.strip().lower().strip("[]()")
        if text == "all":
            return "all" if depth is None else list(range(depth))
        if text in ("", "none"):
            return []
        items: List[int] = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(-?\d+)(?:\s*-\s*(-?\d+))?", part)
            if match is None:
                raise ValueError(f"{name} must be 'all', 'none', block indices or ranges such as "
                                 f"'0-3', got {spec!r}")
            lo = int(match.group(1))
            items.extend(range(lo, int(match.group(2) or lo) + 1))
        spec = items
    if isinstance(spec, bool):
        raise ValueError(f"{name} must be 'all' or block indices, got {spec!r}")
    if isinstance(spec, int):
        spec = [spec]
    try:
        entries = list(spec)
    except TypeError:
        raise ValueError(f"{name} must be 'all' or a list of block indices, got {spec!r}") from None
    for i in entries:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{name} entries must be integer block indices, got {i!r}")
        if i < 0:
            raise ValueError(f"{name} indices must be >= 0, got {spec!r}")
        if depth is not None and i >= depth:
            raise ValueError(f"{name} index {i} is out of range for a model with {depth} blocks "
                             f"(valid block indices: 0..{depth - 1})")
    return sorted(set(entries))


# The kernels below are the modules' only calls into rpc_attention.functional. They validate their
# inputs in Python (shape comparisons, isinstance), which neither torch.fx nor TorchScript can follow,
# so each one is a leaf for both: torch.fx.wrap records it as one graph node that runs (and checks)
# at call time, and torch.jit.ignore leaves it to Python inside a scripted model. A scripted model
# therefore runs in Python only (torch.jit.save cannot export these calls).
@torch.jit.ignore
def _check_width(x: Tensor, dim: int) -> None:
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"attention layer expects (batch, tokens, {dim}) input, got shape {tuple(x.shape)}; "
                         f"its input width is fixed by the dim it was built with")


@torch.jit.ignore
def softmax_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool,
                      dropout_p: float, scale: float, fused: bool) -> Tensor:
    """Softmax attention as an FX / TorchScript leaf, for attention layers of other model families. Call it
    through the module (``rpc_attention.nn.softmax_attention(...)``): torch.fx swaps the leaf in this
    module's namespace while it traces, which a name bound by ``from ... import`` would not see."""
    return RF.attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                        fused=fused)


@torch.jit.ignore
def _symmetric_attention(k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool, dropout_p: float,
                         scale: float, fused: bool) -> Tensor:
    return RF.symmetric_attention(k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                                  scale=scale, fused=fused)


@torch.jit.ignore
def _controlled_attention(k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool, dropout_p: float,
                          scale: float, fused: bool, control: str, level: float) -> Tensor:
    if is_causal:
        raise ValueError(f"key_control={control!r} is for bidirectional attention (image tokens); is_causal=True "
                         "is not supported with it")
    return RF.controlled_symmetric_attention(k, v, control, level, attn_mask=attn_mask, dropout_p=dropout_p,
                                             scale=scale, fused=fused)


@torch.jit.ignore
def _pap_attention(k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool, dropout_p: float,
                   scale: float, fused: bool, n_iter: int, lambd: float, model_dim: int, threshold: str,
                   mu_mode: Optional[str], tol: Optional[float], checkpoint_iters: bool, lowrank: str,
                   shrink: str, dual_step: float, row_lambd: Optional[float]) -> Tensor:
    # typed arguments, not an options dict: a traced graph is scripted too, and TorchScript cannot
    # type a dict literal of mixed values
    return RF.pap_attention(k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, scale=scale,
                            fused=fused, n_iter=n_iter, lambd=lambd, model_dim=model_dim, threshold=threshold,
                            mu_mode=mu_mode, tol=tol, checkpoint_iters=checkpoint_iters, lowrank=lowrank,
                            shrink=shrink, dual_step=dual_step, row_lambd=row_lambd)


@torch.jit.ignore
def _scaled_attention(q: Tensor, k: Tensor, v: Tensor, mode: str, weight: Tensor, num_tokens: Optional[int],
                      attn_mask: Optional[Tensor], is_causal: bool, dropout_p: float, scale: float,
                      fused: bool) -> Tensor:
    if mode == "s":
        if k.shape[2] != num_tokens:
            raise ValueError(f"ScaledAttention(mode='s') was built for {num_tokens} tokens, got {k.shape[2]}")
        return RF.scaled_attention_s(q, k, v, weight, attn_mask=attn_mask, is_causal=is_causal,
                                     dropout_p=dropout_p, scale=scale, fused=fused)
    return RF.scaled_attention_alpha(q, k, v, weight, attn_mask=attn_mask, is_causal=is_causal,
                                     dropout_p=dropout_p, scale=scale, fused=fused)


for _kernel in ("_check_width", "softmax_attention", "_symmetric_attention", "_controlled_attention", "_pap_attention",
                "_scaled_attention"):
    torch.fx.wrap(_kernel)


def _check_heads(dim: int, num_heads: int) -> int:
    if dim <= 0 or num_heads <= 0:
        raise ValueError(f"dim and num_heads must be positive, got dim={dim}, num_heads={num_heads}")
    if dim % num_heads != 0:
        raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
    return dim // num_heads


class _AttentionBase(nn.Module):
    """Shared projection, head split/merge and dropout handling.

    Subclasses that add options list the base constructor's arguments too (as in timm: every module's
    signature is complete and typed where users read it)."""

    n_proj: int = 3

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.head_dim = _check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, dim * self.n_proj, bias=qkv_bias, **factory)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **factory)
        self.proj_drop = nn.Dropout(proj_drop)

    def _split(self, x: Tensor):
        _check_width(x, self.dim)
        b, n, _ = x.shape
        parts = self.qkv(x).reshape(b, n, -1, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return parts.unbind(0)

    def _merge(self, out: Tensor) -> Tensor:
        b, h, n, d = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, h * d)))

    @property
    def _dropout_p(self) -> float:
        return self.attn_drop.p if self.training else 0.0


class Attention(_AttentionBase):
    """Plain asymmetric multi-head attention (separate W_Q, W_K, W_V), the baseline."""

    n_proj = 3

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        q, k, v = self._split(x)
        out = softmax_attention(q, k, v, attn_mask, is_causal, self._dropout_p, self.scale, self.fused_attn)
        return self._merge(out)


class SymmetricAttention(_AttentionBase):
    """Symmetric attention ``softmax(s K K^T) V``: no W_Q, ``qkv`` maps C -> 2C (keys, then values).

    State-dict compatible with the official SymViT attention (``qkv.weight`` [2C, C], ``proj``).

    ``key_control`` (``"clip"`` or ``"drop"``, default None) puts one of the key controls of
    :mod:`rpc_attention.functional.key_controls` in front of the attention, at ``key_control_level``
    robust deviations (default: the control's own, :data:`rpc_attention.functional.KEY_CONTROL_LEVELS`);
    it has no parameters, so it can be switched on in a trained model (``rpc-attention eval --model-set
    key_control=clip``).
    """

    n_proj = 2

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        key_control: Optional[str] = None,
        key_control_level: Optional[float] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, fused_attn, device=device, dtype=dtype)
        level = RF.check_key_control(key_control, key_control_level)
        # "" and 0.0 when off: plain str / float attributes that torch.jit.script can type
        self.key_control: str = key_control or ""
        self.key_control_level: float = 0.0 if level is None else level

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        k, v = self._split(x)
        if self.key_control != "":
            out = _controlled_attention(k, v, attn_mask, is_causal, self._dropout_p, self.scale, self.fused_attn,
                                        self.key_control, self.key_control_level)
        else:
            out = _symmetric_attention(k, v, attn_mask, is_causal, self._dropout_p, self.scale, self.fused_attn)
        return self._merge(out)

    @torch.jit.ignore
    def attention_keys(self, k: Tensor, valid: Optional[Tensor] = None):
        """``(keys, mask)`` the attention of this block uses for its keys ``k``: the clipped keys under the
        ``clip`` control, the ``drop`` control's key mask (bool ``(B, H, 1, N)``), else ``k`` and None.
        ``valid`` (bool ``(B, H, N, 1)``): the keys the forward's attention mask lets some query see, the
        tokens a control's statistics are taken over (None: all)."""
        if not self.key_control:
            return k, None
        return RF.controlled_keys(k, self.key_control, self.key_control_level, valid)

    def extra_repr(self) -> str:
        return (f"key_control={self.key_control!r}, key_control_level={self.key_control_level}"
                if self.key_control else "")


class RPCAttention(SymmetricAttention):
    """RPC-Attention: symmetric attention whose keys are cleaned by Principal Attention Pursuit.

    Same parameters as :class:`SymmetricAttention` (a SymViT checkpoint loads unchanged); the forward
    runs :func:`rpc_attention.functional.pap_attention` with the options given here.

    Args:
        dim: model width C.
        num_heads: number of heads H (head_dim = C / H).
        n_iter: softmax evaluations per forward (paper: 6 in layer 1, or 2 in every layer).
        lambd: sparsity weight (official experiments: 4).
        threshold: ``"lambda_mu"`` (official), ``"lambda_over_mu"`` (classic PCP), ``"candes"``,
            ``"target_fraction"`` or ``"mad"`` (robust scale; docs/method.md#robust-variants).
        mu_mode: ``None`` (global, or causal under ``is_causal``), ``"global"``, ``"causal"``,
            ``"head_dim"``, ``"causal_head_dim"``.
        model_dim: width in mu, default ``dim`` (the official C).
        tol: optional early stop of the ADMM passes (inference).
        lowrank, shrink, dual_step, row_lambd: the robust options of
            :func:`rpc_attention.functional.pap_attention` (official: ``"values"``, ``"soft"``, 1.0, None).
        checkpoint_iters: keep only the cleaned keys and a 1-byte shrinkage pattern per ADMM pass
            for backward and recompute each pass's attention there (less memory, one extra
            attention forward per pass; same outputs and gradients). Performance option only.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        # PAP options, typed and documented here; functional.check_pap_options is their one validator
        n_iter: int = 6,
        lambd: float = 4.0,
        threshold: str = "lambda_mu",
        mu_mode: Optional[str] = None,
        model_dim: Optional[int] = None,
        tol: Optional[float] = None,
        checkpoint_iters: bool = False,
        lowrank: str = "values",
        shrink: str = "soft",
        dual_step: float = 1.0,
        row_lambd: Optional[float] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, fused_attn, device=device, dtype=dtype)
        RF.check_pap_options(n_iter=n_iter, lambd=lambd, threshold=threshold, mu_mode=mu_mode, tol=tol,
                             model_dim=model_dim, lowrank=lowrank, shrink=shrink, dual_step=dual_step,
                             row_lambd=row_lambd)
        self.lowrank, self.shrink, self.dual_step = lowrank, shrink, float(dual_step)
        self.row_lambd = None if row_lambd is None else float(row_lambd)
        self.n_iter = n_iter
        self.lambd = float(lambd)
        self.threshold = threshold
        self.mu_mode = mu_mode
        self.model_dim = model_dim
        self.tol = tol
        self.checkpoint_iters = bool(checkpoint_iters)
        self.last_state: Optional[RF.PAPState] = None
        self.keep_state = False  # analysis tools set this to record S, L, Y of the last forward

    def pap_options(self) -> dict:
        return {
            "n_iter": self.n_iter, "lambd": self.lambd, "threshold": self.threshold,
            "mu_mode": self.mu_mode, "model_dim": self.model_dim or self.dim, "tol": self.tol,
            "checkpoint_iters": self.checkpoint_iters, "lowrank": self.lowrank, "shrink": self.shrink,
            "dual_step": self.dual_step, "row_lambd": self.row_lambd,
        }

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        k, v = self._split(x)
        if self.keep_state:
            res = self._pap_keeping_state(k, v, attn_mask, is_causal)
        else:
            res = _pap_attention(k, v, attn_mask, is_causal, self._dropout_p, self.scale, self.fused_attn,
                                 self.n_iter, self.lambd, self._mu_width(), self.threshold, self.mu_mode, self.tol,
                                 self.checkpoint_iters, self.lowrank, self.shrink, self.dual_step, self.row_lambd)
        return self._merge(res)

    @torch.jit.ignore
    def _mu_width(self) -> int:
        return self.model_dim or self.dim

    @torch.jit.ignore
    def _pap_keeping_state(self, k: Tensor, v: Tensor, attn_mask: Optional[Tensor], is_causal: bool) -> Tensor:
        res, self.last_state = RF.pap_attention(
            k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self._dropout_p, scale=self.scale,
            fused=self.fused_attn, n_iter=self.n_iter, lambd=self.lambd, model_dim=self._mu_width(),
            threshold=self.threshold, mu_mode=self.mu_mode, tol=self.tol, checkpoint_iters=self.checkpoint_iters,
            lowrank=self.lowrank, shrink=self.shrink, dual_step=self.dual_step, row_lambd=self.row_lambd,
            return_state=True)
        return res

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, n_iter={self.n_iter}, lambd={self.lambd}, "
                f"threshold={self.threshold!r}, mu_mode={self.mu_mode!r}"
                + ("" if (self.lowrank, self.shrink, self.dual_step) == ("values", "soft", 1.0) else
                   f", lowrank={self.lowrank!r}, shrink={self.shrink!r}, dual_step={self.dual_step}")
                + ("" if self.row_lambd is None else f", row_lambd={self.row_lambd}"))


class ScaledAttention(_AttentionBase):
    """Scaled Attention (docs/method.md#scaled-attention): asymmetric attention with a re-parameterised value matrix.

    ``mode="s"``: ``softmax(s Q K^T) (I - S) V`` with ``S`` a learnable (heads, N, N) matrix,
    initialised to 0, so ``num_tokens`` (N) is required and fixed. ``mode="alpha"``:
    ``softmax(s Q K^T) (I - alpha softmax(s K K^T)) V`` with one learnable scalar ``alpha`` (init 0).
    """

    n_proj = 3

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        mode: str = "alpha",
        num_tokens: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, attn_drop, proj_drop, fused_attn, device=device, dtype=dtype)
        if mode not in ("s", "alpha"):
            raise ValueError(f"ScaledAttention mode must be 's' or 'alpha', got {mode!r}")
        self.mode = mode
        if mode == "s":
            if num_tokens is None or num_tokens < 1:
                raise ValueError("ScaledAttention(mode='s') needs num_tokens (S is a fixed N x N matrix)")
            self.num_tokens: Optional[int] = num_tokens
            self.s_matrix = nn.Parameter(torch.zeros(num_heads, num_tokens, num_tokens, device=device, dtype=dtype))
        else:
            self.num_tokens = num_tokens
            self.alpha = nn.Parameter(torch.zeros((), device=device, dtype=dtype))

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        q, k, v = self._split(x)
        if hasattr(self, "s_matrix"):  # TorchScript resolves hasattr at compile time; only one exists
            weight = self.s_matrix
        else:
            weight = self.alpha
        out = _scaled_attention(q, k, v, self.mode, weight, self.num_tokens, attn_mask, is_causal, self._dropout_p,
                                self.scale, self.fused_attn)
        return self._merge(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, mode={self.mode!r}, num_tokens={self.num_tokens}"
