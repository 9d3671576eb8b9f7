"""Operator level: PAP next to the attention calls it makes, on ``(B, H, N, d)`` keys and values.

Cases (:class:`OpCase`), each forward (``no_grad``) and forward+backward:

* ``sdpa``: one plain symmetric attention on the fused kernel, ``softmax(s K K^T) V`` (the baseline);
* ``pap n``: :func:`rpc_attention.functional.pap_attention` with ``n`` iterations (the fused path);
* ``official n``: :func:`official_pap`, PAP the way the official code computes it (the kernel's
  explicit path: matmul-softmax-matmul per iteration, Y-form updates, plain autograd);
* options of ``pap n`` at the largest n: ``ckpt`` (``checkpoint_iters=True``), ``compile``
  (``torch.compile`` of the fused path, full runs only), ``tol`` (early stopping, forward only).

Each group's rows are timed round by round, interleaved; ratios are taken against the rows measured
beside them (:func:`finish_ops`), found by their case, never by their label.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import functional as RF
from .config import Config, OpShape
from .measure import (
    HeapControl,
    autocast,
    error_text,
    peak_bytes,
    progress,
    saved_bytes,
    sdpa_backend,
    summary,
    sync,
    time_call,
)

MODES = ("fwd", "fwd+bwd")
TOL = 1e-2  # the early-stopping tolerance of the ``tol`` option


def official_pap(k, v, n_iter: int = 6, lambd: float = 4.0, is_causal: bool = False,
                 model_dim: Optional[int] = None):
    """PAP as the official code computes it: the kernel's explicit path (``fused=False``).

    Every iteration materialises ``softmax(s K2 K2^T)``; Y-form dual updates; plain autograd through
    every operation. Global mu (``N C / (4 sum|k|)``), ``tau = lambd * mu``; with ``is_causal`` the
    mask applies in every iteration and mu is the per-position causal one.
    """
    return RF.pap_attention(k, v, n_iter=n_iter, lambd=lambd, is_causal=is_causal, model_dim=model_dim,
                            fused=False)


@dataclass(frozen=True)
class OpCase:
    """One operator case: ``kind`` is ``sdpa``, ``pap`` or ``official``; ``option`` (``pap`` only) is
    ``ckpt``, ``compile`` or ``tol``."""

    kind: str
    n: int = 1
    option: Optional[str] = None
    causal: bool = False

    @property
    def label(self) -> str:
        """The name a table shows: ``sdpa``, ``pap 6``, ``official 2``, ``pap 6 ckpt``."""
        if self.kind == "sdpa":
            return "sdpa"
        return f"{self.kind} {self.n}" + (f" {self.option}" if self.option else "")

    @property
    def key(self) -> Tuple[str, int, Optional[str]]:
        return (self.kind, self.n, self.option)

    def runs_in(self, mode: str) -> bool:
        return not (self.option == "tol" and mode != "fwd")  # early stopping is an inference option

    def function(self, compiled: Dict) -> Callable:
        """``f(k, v)`` of this case; compiled functions are shared through ``compiled``."""
        causal = self.causal
        if self.kind == "sdpa":
            return functools.partial(RF.symmetric_attention, is_causal=causal)
        if self.kind == "official":
            return functools.partial(official_pap, n_iter=self.n, is_causal=causal)
        kw = dict(n_iter=self.n, is_causal=causal)
        if self.option == "ckpt":
            kw["checkpoint_iters"] = True
        if self.option == "tol":
            kw["tol"] = TOL
        f = functools.partial(RF.pap_attention, **kw)
        if self.option == "compile":
            if (self.n, causal) not in compiled:
                compiled[(self.n, causal)] = torch.compile(f)
            f = compiled[(self.n, causal)]
        return f

    def row(self, mode: str) -> dict:
        """The JSON row this case fills in ``mode``."""
        row = {"case": self.label, "kind": self.kind, "n": self.n, "causal": self.causal}
        if self.option:
            row["option"] = self.option
        return dict(row, mode=mode, times=[], compile_s=None)


def op_cases(shape: OpShape, compile_ok: bool) -> List[OpCase]:
    """The cases of ``shape``: sdpa, pap n, official n, then the options on the largest pap n."""
    c = shape.causal
    cases = [OpCase("sdpa", 1, causal=c)]
    cases += [OpCase("pap", n, causal=c) for n in shape.pap_iters]
    cases += [OpCase("official", n, causal=c) for n in shape.official_iters]
    top = max(shape.pap_iters)
    cases += [OpCase("pap", top, opt, c) for opt in shape.options if opt != "compile" or compile_ok]
    return cases


def _runner(f: Callable, k, v, grad_out, mode: str, device: torch.device) -> Callable[[], object]:
    if mode == "fwd":
        def run():
            with torch.no_grad(), autocast(device), sdpa_backend(device):
                return f(k, v)
    else:
        def run():
            with autocast(device), sdpa_backend(device):
                out = f(k, v)
            return torch.autograd.grad(out, (k, v), grad_out.to(out.dtype))
    return run


def _op_inputs(shape: OpShape, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device).requires_grad_()
    v = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device).requires_grad_()
    grad_out = torch.randn(shape.b, shape.h, shape.n, shape.d, generator=g).to(device)
    return k, v, grad_out


def _warm_rows(cases: List[OpCase], inputs, mode: str, device: torch.device, compiled: Dict) -> List[dict]:
    """One row per case that runs in ``mode``, after a warm-up call (and compilation); a failing case
    keeps its error and is not timed."""
    k, v, grad_out = inputs
    rows = []
    for case in (c for c in cases if c.runs_in(mode)):
        row = case.row(mode)
        run = _runner(case.function(compiled), k, v, grad_out, mode, device)
        t0 = time.perf_counter()
        try:
            run()
            sync(device)
        except Exception as exc:  # a failing case is reported in its row; the others still run
            row["error"] = error_text(exc)
        if case.option == "compile":
            row["compile_s"] = time.perf_counter() - t0
        row["_case"], row["_run"] = case, run
        rows.append(row)
    return rows


def _time_rows(rows: List[dict], shape: OpShape, mode: str, cfg: Config, show: bool) -> None:
    for r in range(cfg.repeats):
        progress(f"[bench] {shape.name} {mode} round {r + 1}/{cfg.repeats}", show)
        for row in rows:
            if "error" not in row:
                row["times"].append(time_call(row["_run"], cfg.min_run_time))


def bench_ops(cfg: Config, device: torch.device, show_progress: bool = True) -> List[dict]:
    """Time every case of every shape (interleaved rounds); one group per (shape, mode)."""
    compiled: Dict = {}
    groups = []
    for shape in cfg.shapes:
        inputs = _op_inputs(shape, device)
        k, v, _ = inputs
        cases = op_cases(shape, cfg.compile)
        for mode in MODES:
            rows = _warm_rows(cases, inputs, mode, device, compiled)
            if shape.timed:
                _time_rows(rows, shape, mode, cfg, show_progress)
            for row in rows:
                if row["_case"].option == "tol" and "error" not in row:
                    with torch.no_grad():
                        st = RF.pap_decompose(k.detach(), v.detach(), n_iter=row["n"], tol=TOL, is_causal=shape.causal)
                    row["n_iter_run"] = st.n_iter_run
            groups.append({"shape": shape.name, "b": shape.b, "h": shape.h, "n": shape.n, "d": shape.d,
                           "causal": shape.causal, "mode": mode, "rows": rows, "k": k, "v": v})
    return groups


def op_memory(groups: List[dict], device: torch.device, show_progress: bool, heap: Optional[HeapControl]) -> None:
    """Peak and saved-for-backward bytes of every forward+backward row (after all timings)."""
    for grp in groups:
        if grp["mode"] != "fwd+bwd":
            continue
        progress(f"[bench] memory {grp['shape']}", show_progress)
        k, v = grp["k"], grp["v"]
        for row in grp["rows"]:
            case: OpCase = row["_case"]
            if "error" in row or case.option == "compile":
                continue
            try:
                row["peak_bytes"] = peak_bytes(row["_run"], device, heap)
                f = case.function({})

                def forward(f=f, k=k, v=v):
                    with autocast(device), sdpa_backend(device):
                        return f(k, v)

                row["saved_bytes"] = saved_bytes(forward, exclude=(k, v))
            except RuntimeError as exc:  # e.g. out of memory
                row["mem_error"] = error_text(exc)


def _over(rows: List[dict], base: List[dict]) -> dict:
    """Round-by-round ratios of the times of ``rows`` over ``base``, summarised."""
    return summary([t / b for t, b in zip(rows, base)])


def _bytes_ratio(row: Optional[dict], base: Optional[dict], key: str) -> Optional[float]:
    if row and base and row.get(key) and base.get(key):
        return row[key] / base[key]
    return None


def _row_ratios(row: dict, by_case: Dict[Tuple, dict]) -> dict:
    """The ratios of one row against the rows measured beside it in its group."""
    case: OpCase = row["_case"]
    base, plain, one = by_case.get(("sdpa", 1, None)), by_case.get(("pap", case.n, None)), by_case.get(("pap", 1, None))
    ratios = {}
    if base and base["times"] and row["times"]:
        ratios["vs_n_sdpa"] = _over(row["times"], [case.n * b for b in base["times"]])
    if case.kind == "official" and plain:
        if plain["times"] and row["times"]:
            ratios["official_over_pap"] = _over(row["times"], plain["times"])
        ratios["pap_peak_over_official"] = _bytes_ratio(plain, row, "peak_bytes")
        ratios["pap_saved_over_official"] = _bytes_ratio(plain, row, "saved_bytes")
    if case.kind == "pap" and case.option and plain:
        if plain["times"] and row["times"]:
            ratios["vs_plain_pap"] = _over(row["times"], plain["times"])
        ratios["saved_vs_plain_pap"] = _bytes_ratio(row, plain, "saved_bytes")
    if case.kind == "pap" and one:
        ratios["saved_vs_pap1"] = _bytes_ratio(row, one, "saved_bytes")
        ratios["peak_vs_pap1"] = _bytes_ratio(row, one, "peak_bytes")
    return {k: r for k, r in ratios.items() if r is not None}


def finish_ops(groups: List[dict]) -> None:
    """Summaries and ratios, computed round by round against the rows measured beside them; drops the
    tensors and closures so the groups serialise."""
    for grp in groups:
        by_case = {row["_case"].key: row for row in grp["rows"]}
        for row in grp["rows"]:
            row["time"] = summary(row["times"])
        for row in grp["rows"]:
            row["ratios"] = _row_ratios(row, by_case)
        for row in grp["rows"]:
            row.pop("_run", None)
            row.pop("_case", None)
        grp.pop("k", None)
        grp.pop("v", None)
